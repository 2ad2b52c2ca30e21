"""Launch helpers that run before (or without) the toolkit's heavy imports: standard library only,
except ``preflight`` (mmengine's Config). ``xcit_dense`` registers models and imports torch, mmdet
and mmseg; these modules stay light so that launch scripts, the mmcv build and a bare GPU machine
can use them.

``netif``: the address and interface that reach the master; ``torchrun``: the torchrun wrapper
(rendezvous address, one-line failure reports); ``preflight``: the config and data-file check before
a launch; ``known_warnings``: the pinned stack's known warnings; ``cuda_arch``: which CUDA
architectures run on which GPU; ``mmcv_build`` and ``mmcv_subset``: the mmcv wheel build;
``bounded``: subprocesses under a time limit, their process group killed past it.
"""
