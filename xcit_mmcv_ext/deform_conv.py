"""mmcv 2.1.0's deformable convolutions (DCN and modulated DCNv2) on torchvision's ``deform_conv2d``.

torchvision's kernel is mmcv's algorithm: the same offset layout ((y, x) pairs per kernel tap and
deformable group), the same bilinear sampling that reads zero outside the map, the same mask per tap;
the offset's gradient is zeroed where mmcv's is zero and torchvision's is not (``_outside``).
The entry points keep mmcv's arguments and write into the tensors mmcv's autograd functions hand them:
- ``deform_conv_forward`` / ``deform_conv_backward_input`` / ``deform_conv_backward_parameters``:
  the batch runs in chunks of ``im2col_step`` samples (which must divide it), as mmcv's kernels run,
  bounding the columns buffer; ``backward_parameters`` adds ``scale`` times the weight's gradient.
- ``modulated_deform_conv_forward`` / ``modulated_deform_conv_backward``: with the mask, and the bias
  when ``with_bias``.
float16 and bfloat16 are computed in float32 with autocast off and rounded once (``precision``).
torchvision's backward computes the input's, offset's and weight's gradients in one call; mmcv asks for
them in two, so ``backward_input`` keeps the weight's gradient (weight-sized) for the
``backward_parameters`` call on the same tensors that follows it.
"""
import weakref
from typing import Optional, Tuple

import torch
import torchvision  # noqa: F401  (registers the torch.ops.torchvision kernels called here)
from torch import Tensor

from .precision import check_im2col_step, compute_dtype


def _conv_args(stride_h: int, stride_w: int, pad_h: int, pad_w: int, dilation_h: int, dilation_w: int,
               group: int, deformable_group: int) -> Tuple[int, ...]:
    return tuple(int(v) for v in (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                                  deformable_group))


def _no_mask(input: Tensor) -> Tensor:
    return input.new_zeros(input.size(0), 1)


def _forward(input: Tensor, weight: Tensor, offset: Tensor, mask: Optional[Tensor], bias: Optional[Tensor],
             args: Tuple[int, ...]) -> Tensor:
    """torchvision's forward in the compute dtype, autocast off."""
    dtype = compute_dtype(input.dtype)
    if bias is None:
        bias = input.new_zeros(weight.size(0), dtype=dtype)
    with torch.autocast(input.device.type, enabled=False):
        return torch.ops.torchvision.deform_conv2d(
            input.to(dtype), weight.to(dtype), offset.to(dtype),
            (_no_mask(input) if mask is None else mask).to(dtype), bias.to(dtype), *args, mask is not None)


def _backward(grad_output: Tensor, input: Tensor, weight: Tensor, offset: Tensor, mask: Optional[Tensor],
              bias: Optional[Tensor], args: Tuple[int, ...]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torchvision's backward in the compute dtype: (input, weight, offset, mask, bias) gradients."""
    dtype = compute_dtype(input.dtype)
    if bias is None:
        bias = input.new_zeros(weight.size(0), dtype=dtype)
    with torch.autocast(input.device.type, enabled=False):
        grads = torch.ops.torchvision._deform_conv2d_backward(
            grad_output.to(dtype), input.to(dtype), weight.to(dtype), offset.to(dtype),
            (_no_mask(input) if mask is None else mask).to(dtype), bias.to(dtype), *args, mask is not None)
    grads[2].masked_fill_(_outside(offset.to(dtype), input.shape[2:], weight.shape[2:], args), 0)
    return grads


def _outside(offset: Tensor, in_size: torch.Size, kernel: torch.Size, args: Tuple[int, ...]) -> Tensor:
    """Where a sample lies at or beyond one pixel outside the map (y <= -1, y >= H, likewise x), as a
    mask of ``offset``'s shape: mmcv's offset gradient is zero there. torchvision's is not at exactly
    -1 (a sample on the padding's edge, as every tap of a zero-initialised DCN on the border is)."""
    stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, _, deformable_group = args
    batch, _, out_h, out_w = offset.shape
    kernel_h, kernel_w = kernel
    taps = offset.view(batch, deformable_group, kernel_h, kernel_w, 2, out_h, out_w)
    arange = lambda n, step: torch.arange(n, device=offset.device, dtype=offset.dtype) * step  # noqa: E731
    rows = (arange(out_h, stride_h) - pad_h)[None, :] + arange(kernel_h, dilation_h)[:, None]  # (kh, out_h)
    cols = (arange(out_w, stride_w) - pad_w)[None, :] + arange(kernel_w, dilation_w)[:, None]  # (kw, out_w)
    y = taps[:, :, :, :, 0] + rows[:, None, :, None]
    x = taps[:, :, :, :, 1] + cols[None, :, None, :]
    outside = (y <= -1) | (y >= in_size[0]) | (x <= -1) | (x >= in_size[1])
    return outside[:, :, :, :, None].expand(taps.shape).reshape(offset.shape)


def deform_conv_forward(input: Tensor, weight: Tensor, offset: Tensor, output: Tensor, columns: Tensor,
                        ones: Tensor, kW: int, kH: int, dW: int, dH: int, padW: int, padH: int,
                        dilationW: int, dilationH: int, group: int, deformable_group: int,
                        im2col_step: int) -> None:
    """DCN's forward into ``output`` (N, C_out, H_out, W_out), ``im2col_step`` samples at a time."""
    step = check_im2col_step(input.size(0), im2col_step, 'deform_conv_forward')
    args = _conv_args(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    for start in range(0, input.size(0), step):
        chunk = slice(start, start + step)
        output[chunk].copy_(_forward(input[chunk], weight, offset[chunk], None, None, args))


class _WeightGradient:
    """The weight's gradient computed by the last ``deform_conv_backward_input``, with weak references
    to the input, offset and output gradient it was computed from (the weight's values do not enter
    it): reused only for those same tensors, unchanged since, and dropped when taken."""

    def __init__(self) -> None:
        self.sources: tuple = ()
        self.grad: Optional[Tensor] = None

    @staticmethod
    def _key(tensors: Tuple[Tensor, ...], args: tuple) -> tuple:
        return tuple((weakref.ref(t), t._version) for t in tensors) + args

    def keep(self, tensors: Tuple[Tensor, ...], args: tuple, grad: Tensor) -> None:
        self.sources, self.grad = self._key(tensors, args), grad

    def take(self, tensors: Tuple[Tensor, ...], args: tuple) -> Optional[Tensor]:
        sources, grad = self.sources, self.grad
        self.sources, self.grad = (), None
        if len(sources) != len(tensors) + len(args) or sources[len(tensors):] != args:
            return None
        for (ref, version), tensor in zip(sources, tensors):
            if ref() is not tensor or version != tensor._version:
                return None
        return grad


_LAST_WEIGHT_GRAD = _WeightGradient()


def deform_conv_backward_input(input: Tensor, offset: Tensor, gradOutput: Tensor, gradInput: Tensor,
                               gradOffset: Tensor, weight: Tensor, columns: Tensor, kW: int, kH: int, dW: int,
                               dH: int, padW: int, padH: int, dilationW: int, dilationH: int, group: int,
                               deformable_group: int, im2col_step: int) -> None:
    """DCN's gradients with respect to the input and the offset, written into ``gradInput`` and
    ``gradOffset``."""
    step = check_im2col_step(input.size(0), im2col_step, 'deform_conv_backward_input')
    args = _conv_args(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    grad_weight = None
    for start in range(0, input.size(0), step):
        chunk = slice(start, start + step)
        grads = _backward(gradOutput[chunk], input[chunk], weight, offset[chunk], None, None, args)
        gradInput[chunk].copy_(grads[0])
        gradOffset[chunk].copy_(grads[2])
        grad_weight = grads[1] if grad_weight is None else grad_weight + grads[1]
    _LAST_WEIGHT_GRAD.keep((input, offset, gradOutput), args + (step,), grad_weight)


def deform_conv_backward_parameters(input: Tensor, offset: Tensor, gradOutput: Tensor, gradWeight: Tensor,
                                    columns: Tensor, ones: Tensor, kW: int, kH: int, dW: int, dH: int,
                                    padW: int, padH: int, dilationW: int, dilationH: int, group: int,
                                    deformable_group: int, scale: float, im2col_step: int) -> None:
    """DCN's gradient with respect to the weight, ``scale`` times it added to ``gradWeight``."""
    step = check_im2col_step(input.size(0), im2col_step, 'deform_conv_backward_parameters')
    args = _conv_args(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    grad_weight = _LAST_WEIGHT_GRAD.take((input, offset, gradOutput), args + (step,))
    if grad_weight is None or grad_weight.shape != gradWeight.shape:
        grad_weight = _weight_gradient(input, offset, gradOutput, gradWeight, args, step)
    gradWeight.add_(grad_weight.to(gradWeight.dtype), alpha=scale)


def _weight_gradient(input: Tensor, offset: Tensor, grad_output: Tensor, weight_like: Tensor,
                     args: Tuple[int, ...], step: int) -> Tensor:
    # the weight's values do not enter its own gradient: zeros of its shape stand in
    weight = torch.zeros_like(weight_like)
    total = None
    for start in range(0, input.size(0), step):
        chunk = slice(start, start + step)
        grad = _backward(grad_output[chunk], input[chunk], weight, offset[chunk], None, None, args)[1]
        total = grad if total is None else total + grad
    return total


def modulated_deform_conv_forward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor, offset: Tensor,
                                  mask: Tensor, output: Tensor, columns: Tensor, kernel_h: int, kernel_w: int,
                                  stride_h: int, stride_w: int, pad_h: int, pad_w: int, dilation_h: int,
                                  dilation_w: int, group: int, deformable_group: int, with_bias: bool) -> None:
    """DCNv2's forward (offsets and a mask per tap) into ``output``."""
    args = _conv_args(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group)
    output.copy_(_forward(input, weight, offset, mask, bias if with_bias else None, args))


def modulated_deform_conv_backward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor, offset: Tensor,
                                   mask: Tensor, columns: Tensor, grad_input: Tensor, grad_weight: Tensor,
                                   grad_bias: Tensor, grad_offset: Tensor, grad_mask: Tensor, grad_output: Tensor,
                                   kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, pad_h: int,
                                   pad_w: int, dilation_h: int, dilation_w: int, group: int,
                                   deformable_group: int, with_bias: bool) -> None:
    """DCNv2's gradients, written into ``grad_input``, ``grad_weight``, ``grad_offset``, ``grad_mask``
    and, with a bias, ``grad_bias``."""
    args = _conv_args(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, deformable_group)
    d_input, d_weight, d_offset, d_mask, d_bias = _backward(grad_output, input, weight, offset, mask,
                                                            bias if with_bias else None, args)
    grad_input.copy_(d_input)
    grad_weight.copy_(d_weight)
    grad_offset.copy_(d_offset)
    grad_mask.copy_(d_mask)
    if with_bias:
        grad_bias.copy_(d_bias)
