"""RoIAlign whose forward pass on a CPU runs torchvision's kernel and whose backward pass runs mmcv's.

On a CPU torchvision's forward kernel is faster than mmcv 2.1.0's (2.3x on the box head's shape,
docs/benchmark/whole_models.md) and gives the same values; the backward stays mmcv's, whose context
the forward fills. Elsewhere (CUDA, max pooling) the layer is mmcv's own.
"""
from typing import Any

import torch
from mmcv.ops import RoIAlign
from mmcv.ops.roi_align import RoIAlignFunction
from torch.nn.modules.utils import _pair
from torchvision.ops import roi_align


class _TorchvisionForwardRoIAlign(RoIAlignFunction):
    """mmcv's RoIAlign function (average pooling) with torchvision's forward kernel."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, rois: torch.Tensor, output_size: Any,
                spatial_scale: float = 1.0, sampling_ratio: int = 0, pool_mode: str = 'avg',
                aligned: bool = True) -> torch.Tensor:
        # the context mmcv's backward reads
        ctx.output_size, ctx.spatial_scale, ctx.sampling_ratio = _pair(output_size), spatial_scale, sampling_ratio
        ctx.pool_mode, ctx.aligned, ctx.input_shape = 1, aligned, input.size()
        empty = input.new_zeros(0)
        ctx.save_for_backward(rois, empty, empty)
        return roi_align(input, rois, ctx.output_size, spatial_scale, sampling_ratio, aligned)


class CpuFastRoIAlign(RoIAlign):
    """mmcv's ``RoIAlign``; on CPU tensors with average pooling, torchvision's forward kernel."""

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        if input.device.type != 'cpu' or self.pool_mode != 'avg' or self.use_torchvision:
            return super().forward(input, rois)
        return _TorchvisionForwardRoIAlign.apply(input, rois, self.output_size, self.spatial_scale,
                                                 self.sampling_ratio, self.pool_mode, self.aligned)
