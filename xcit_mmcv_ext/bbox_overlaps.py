"""mmcv 2.1.0's ``bbox_overlaps``: IoU (mode 0) or IoF (mode 1) of boxes (x1, y1, x2, y2), in torch.

Every pair (or, ``aligned``, each row with the same row) as mmcv's CUDA kernel: widths and heights
``x2 - x1 + offset`` (``offset`` 1 for legacy pixel boxes), the intersection clamped at 0, divided by
the union (IoU) or the first box's area (IoF) clamped below at ``offset``. mmcv's CPU kernel divides
without that clamp: the two differ only for boxes whose union is under one pixel with ``offset`` 1.
float16 and bfloat16 are computed in float32 and rounded once into ``ious``.
"""
import torch
from torch import Tensor

from .precision import compute_dtype

MODES = {0: 'iou', 1: 'iof'}


def bbox_overlaps(bboxes1: Tensor, bboxes2: Tensor, ious: Tensor, mode: int, aligned: bool, offset: int) -> None:
    """Write the overlaps of ``bboxes1`` (M, 4) with ``bboxes2`` (N, 4) into ``ious`` ((M, N), or
    (M,) when ``aligned``)."""
    if mode not in MODES:
        raise ValueError(f'bbox_overlaps: mode must be 0 (iou) or 1 (iof), got {mode}')
    dtype = compute_dtype(bboxes1.dtype)
    first, second = bboxes1.to(dtype), bboxes2.to(dtype)
    if not aligned:
        first, second = first[:, None, :], second[None, :, :]
    area1 = (first[..., 2] - first[..., 0] + offset) * (first[..., 3] - first[..., 1] + offset)
    area2 = (second[..., 2] - second[..., 0] + offset) * (second[..., 3] - second[..., 1] + offset)
    width = (torch.minimum(first[..., 2], second[..., 2]) - torch.maximum(first[..., 0], second[..., 0])
             + offset).clamp(min=0)
    height = (torch.minimum(first[..., 3], second[..., 3]) - torch.maximum(first[..., 1], second[..., 1])
              + offset).clamp(min=0)
    inter = width * height
    base = area1 + area2 - inter if mode == 0 else area1.expand_as(inter)
    ious.copy_((inter / base.clamp(min=offset)).view_as(ious))
