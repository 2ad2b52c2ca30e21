"""mmdet's parts that call mmcv's kernels, in a dtype and layout those kernels have (bf16 training works).

Needed with compiled mmcv (``XCIT_MMCV=compiled``): mmcv 2.1.0's RoIAlign dispatches float and half
only, on CUDA (``roi_align_cuda.cu``) and on the CPU, and NMS reads float boxes only
(``nms_cuda.cu``: ``data_ptr<float>``); under bf16 autocast the features, the RPN's boxes and scores
are bf16. The default install's ``mmcv._ext`` (xcit_mmcv_ext) computes bf16 in float32 itself, but
the RPN's proposals stay float32 for another reason: mmdet casts the RoIs to the features' dtype,
and bf16 box coordinates are rounded to 4-pixel steps between 512 and 1024 px (8 above).
Imported by the Mask R-CNN configs (``custom_imports``), so that segmentation runs keep mmdet out.
"""
from typing import Optional, Tuple

import torch
from mmdet.models.dense_heads import RPNHead
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from mmdet.registry import MODELS
from mmengine.structures import InstanceData

KERNEL_DTYPES = (torch.float32, torch.float16, torch.float64)  # what mmcv's RoIAlign dispatches


@MODELS.register_module()
class KernelDtypeRoIExtractor(SingleRoIExtractor):
    """``SingleRoIExtractor`` that runs in float32, autocast off, for features of a dtype without
    RoIAlign kernels (bfloat16), and returns its features in the input features' dtype.

    Its maps are made contiguous (NCHW) first: compiled mmcv's RoIAlign reads any tensor's memory
    as NCHW, so the channels_last maps of the backbone on a CPU (or with ``channels_last=True``)
    gave wrong RoI features there; torchvision's kernels make the same copy themselves."""

    def forward(self, feats: Tuple[torch.Tensor, ...], rois: torch.Tensor,
                roi_scale_factor: Optional[float] = None) -> torch.Tensor:
        feats = tuple(f.contiguous() for f in feats)
        dtype = feats[0].dtype
        if dtype in KERNEL_DTYPES:
            return super().forward(feats, rois, roi_scale_factor)
        with torch.autocast(feats[0].device.type, enabled=False):
            roi_feats = super().forward(tuple(f.float() for f in feats), rois.float(), roi_scale_factor)
        return roi_feats.to(dtype)


@MODELS.register_module()
class KernelDtypeRPNHead(RPNHead):
    """``RPNHead`` whose proposals (boxes and scores) are float32 from NMS on, whatever the dtype
    of the head's outputs: NMS has no bf16 kernel, and bf16 coordinates are coarse."""

    def _bbox_post_process(self, results: InstanceData, *args, **kwargs) -> InstanceData:
        for key in ('bboxes', 'scores'):
            if key in results and results[key].dtype not in KERNEL_DTYPES:
                results[key] = results[key].float()
        return super()._bbox_post_process(results, *args, **kwargs)
