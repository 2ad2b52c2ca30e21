"""One image through a detector or segmentor built from this toolkit's configs."""
import torch
from torch import nn


def predict(model: nn.Module, image: torch.Tensor):
    """Run ``model.test_step`` on one (3, H, W) uint8 image; returns its data sample.

    Works for mmdet detectors (``pred_instances``) and mmseg segmentors (``pred_sem_seg``).
    """
    h, w = image.shape[1:]
    if hasattr(model, 'decode_head'):
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
    else:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.)))
    with torch.no_grad():
        return model.test_step(dict(inputs=[image], data_samples=[sample]))[0]
