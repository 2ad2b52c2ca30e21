"""mmcv 2.1.0's ``ms_deform_attn_forward`` and ``ms_deform_attn_backward`` (multi-scale deformable
attention: Deformable DETR, DINO, Mask2Former), in torch, on every device.

mmcv's CUDA kernel samples each level's value map bilinearly at ``location * size - 0.5`` (zero
outside the map) and sums the samples times their attention weights; that is ``grid_sample`` with
``align_corners=False`` and zero padding at ``2 * location - 1``, which is what is computed here,
the gradients of the value, the sampling locations and the attention weights by autograd through
it. The batch runs in chunks of ``im2col_step`` samples (which must divide it), as mmcv's kernel
runs. float16 and bfloat16 are computed in float32 and rounded once.
"""
import torch
import torch.nn.functional as F
from torch import Tensor

from .precision import check_im2col_step, compute_dtype


def _attend(value: Tensor, shapes: list, starts: list, locations: Tensor, weights: Tensor) -> Tensor:
    """(bs, keys, heads, ch) values, (bs, queries, heads, levels, points, 2) locations in [0, 1] as
    (x, y), (bs, queries, heads, levels, points) weights -> (bs, queries, heads * ch)."""
    batch, _, heads, channels = value.shape
    queries, levels, points = locations.shape[1], locations.shape[3], locations.shape[4]
    grids = 2 * locations - 1
    sampled = []
    for level, ((height, width), start) in enumerate(zip(shapes, starts)):
        level_value = value[:, start:start + height * width]  # (bs, hw, heads, ch)
        level_value = level_value.permute(0, 2, 3, 1).reshape(batch * heads, channels, height, width)
        grid = grids[:, :, :, level].transpose(1, 2).reshape(batch * heads, queries, points, 2)
        sampled.append(F.grid_sample(level_value, grid, mode='bilinear', padding_mode='zeros',
                                     align_corners=False))  # (bs * heads, ch, queries, points)
    samples = torch.stack(sampled, dim=-2)  # (bs * heads, ch, queries, levels, points)
    weights = weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels, points)
    output = (samples * weights).sum((-1, -2))  # (bs * heads, ch, queries)
    return output.view(batch, heads * channels, queries).transpose(1, 2)


def _levels(spatial_shapes: Tensor, level_start_index: Tensor) -> tuple:
    return [tuple(int(v) for v in shape) for shape in spatial_shapes.tolist()], \
        [int(v) for v in level_start_index.tolist()]


def ms_deform_attn_forward(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor,
                           sampling_loc: Tensor, attn_weight: Tensor, im2col_step: int) -> Tensor:
    """The attention's output (bs, queries, heads * ch), in ``value``'s dtype."""
    step = check_im2col_step(value.size(0), im2col_step, 'ms_deform_attn_forward')
    shapes, starts = _levels(spatial_shapes, level_start_index)
    dtype = compute_dtype(value.dtype)
    outputs = []
    with torch.autocast(value.device.type, enabled=False):
        for start in range(0, value.size(0), step):
            chunk = slice(start, start + step)
            outputs.append(_attend(value[chunk].to(dtype), shapes, starts, sampling_loc[chunk].to(dtype),
                                   attn_weight[chunk].to(dtype)))
    return torch.cat(outputs).to(value.dtype)


def ms_deform_attn_backward(value: Tensor, spatial_shapes: Tensor, level_start_index: Tensor,
                            sampling_loc: Tensor, attn_weight: Tensor, grad_output: Tensor, grad_value: Tensor,
                            grad_sampling_loc: Tensor, grad_attn_weight: Tensor, im2col_step: int) -> None:
    """The gradients with respect to the value, the sampling locations and the attention weights,
    added into ``grad_value``, ``grad_sampling_loc`` and ``grad_attn_weight``."""
    step = check_im2col_step(value.size(0), im2col_step, 'ms_deform_attn_backward')
    shapes, starts = _levels(spatial_shapes, level_start_index)
    dtype = compute_dtype(value.dtype)
    with torch.enable_grad(), torch.autocast(value.device.type, enabled=False):
        for start in range(0, value.size(0), step):
            chunk = slice(start, start + step)
            inputs = [t[chunk].detach().to(dtype).requires_grad_() for t in (value, sampling_loc, attn_weight)]
            output = _attend(inputs[0], shapes, starts, inputs[1], inputs[2])
            grads = torch.autograd.grad(output, inputs, grad_output[chunk].to(dtype))
            for target, grad in zip((grad_value, grad_sampling_loc, grad_attn_weight), grads):
                target[chunk] += grad.to(target.dtype)
