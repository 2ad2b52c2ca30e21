"""Launch helpers that run before (or without) the toolkit's heavy imports.

``xcit_dense`` registers models and imports torch, mmdet and mmseg; these modules import neither
torch nor mmengine (``preflight`` imports mmengine's Config only; ``torchrun.main`` and
``mmcv_build.main`` import torch when they run), so that the launch scripts, the mmcv build before
the install and a bare GPU machine can use them. ``tools/`` holds their command lines as shims.

``netif``: the address and interface that reach the master; ``launch_layout``: a launch's nodes,
node rank and master from the user's or a Kubeflow job's variables; ``torchrun``: the torchrun wrapper
(rendezvous address, one-line failure reports); ``preflight``: the config and data-file check
before a launch; ``known_warnings``: the pinned stack's known warnings; ``cuda_arch``: which CUDA
architectures run on which GPU; ``mmcv_build`` and ``mmcv_subset``: the mmcv wheel build;
``linkless_writes``: the toolkit's output files, written through no link; ``image_names``: the
inference tools' inputs and picture names; ``decode_work``: the bounds on an image file's decoding
work, checked before a decoder opens it; ``onnx_segmentation`` and ``onnx_detection``: an exported
segmentor or Mask R-CNN run with onnxruntime, numpy and OpenCV (``tools/deployment/infer_onnx.py``).
"""
