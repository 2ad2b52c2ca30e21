"""What the XCiT layers do in training to keep less for the backward than the plain operators.

The autograd functions recompute a cheap pointwise result from a tensor autograd keeps anyway,
instead of saving a second tensor of the same size: the same function and gradients as the plain
operators (checked by ``gradcheck`` and against timm's gradients in the tests), on every device.
Under autocast they compute in the dtypes autocast gives the plain operators (matrix products in
the autocast dtype, norms in float32); their backward casts the same way. ``scaled_weights`` folds
the blocks' layer scales into the weights before them, so that nothing of the tokens' size is kept
for the scales' gradients. The layers use all this only where a gradient is wanted and nothing
traces the graph (FLOP counting, ONNX export see the plain operators); the fast layers
(``fast_layers.py``) call them.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class GeluLinear(torch.autograd.Function):
    """``F.linear(F.gelu(h), weight, bias)`` keeping ``h`` (which GELU's backward needs in any case),
    not GELU's output: that is recomputed for the weight's gradient. In the MLP it saves a tensor of
    the hidden size (4x the embedding) per block."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
        ctx.save_for_backward(h, weight)
        ctx.approximate = approximate
        ctx.bias_dtype = None if bias is None else bias.dtype
        return F.linear(F.gelu(h, approximate=approximate), weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        h, weight = ctx.saved_tensors
        grad_h = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_act = grad @ weight.to(grad.dtype)
            grad_h = torch.ops.aten.gelu_backward(grad_act.to(h.dtype), h, approximate=ctx.approximate)
        if ctx.needs_input_grad[1]:
            act = F.gelu(h, approximate=ctx.approximate).to(grad.dtype)
            grad_weight = (_flat(grad).t() @ _flat(act)).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = _flat(grad).sum(0).to(ctx.bias_dtype)
        return grad_h, grad_weight, grad_bias, None


class NormLinear(torch.autograd.Function):
    """``F.linear(F.layer_norm(x, ...), weight, bias)`` keeping ``x`` (which the norm's backward
    needs in any case), not the norm's output: that is recomputed, with the norm's statistics, in
    the backward. Before XCA's qkv and the MLP's fc1 it saves a tensor of the embedding's size per
    norm. The norm runs in the dtype autocast gives ``F.layer_norm`` (float32 on GPUs)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, norm_weight: Optional[torch.Tensor], norm_bias: Optional[torch.Tensor],
                weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
        normed = F.layer_norm(x, x.shape[-1:], norm_weight, norm_bias, eps)
        ctx.save_for_backward(x, norm_weight, norm_bias, weight)
        ctx.eps, ctx.normed_dtype = eps, normed.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return F.linear(normed, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, norm_weight, norm_bias, weight = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        x_in = x.to(ctx.normed_dtype)
        normed, mean, rstd = torch.native_layer_norm(x_in, x.shape[-1:], norm_weight, norm_bias, ctx.eps)
        grad_x = grad_norm_weight = grad_norm_bias = grad_weight = grad_bias = None
        if wanted[3]:
            grad_weight = (_flat(grad).t() @ _flat(normed.to(grad.dtype))).to(weight.dtype)
        if ctx.bias_dtype is not None and wanted[4]:
            grad_bias = _flat(grad).sum(0).to(ctx.bias_dtype)
        if any(wanted[:3]):
            grad_normed = (grad @ weight.to(grad.dtype)).to(normed.dtype)
            grad_x, grad_norm_weight, grad_norm_bias = torch.ops.aten.native_layer_norm_backward(
                grad_normed, x_in, x.shape[-1:], mean, rstd, norm_weight, norm_bias,
                [wanted[0], wanted[1], wanted[2]])
            grad_x = None if grad_x is None else grad_x.to(x.dtype)
        return grad_x, grad_norm_weight, grad_norm_bias, grad_weight, grad_bias, None


class NormalizedGram(torch.autograd.Function):
    """``F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)`` keeping ``q``, ``k`` and
    their norms, not the normalised copies. In XCA ``q`` and ``k`` are views of the qkv projection's
    output (kept for the attention's other uses), so this saves two tensors of the embedding's size
    per block; the normalised copies are recomputed in the backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, eps: float) -> torch.Tensor:
        q_norm, k_norm = q.norm(dim=-1, keepdim=True), k.norm(dim=-1, keepdim=True)
        ctx.save_for_backward(q, k, q_norm, k_norm)
        ctx.eps = eps
        return (q / q_norm.clamp_min(eps)) @ (k / k_norm.clamp_min(eps)).transpose(-2, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k, q_norm, k_norm = ctx.saved_tensors
        q_unit, k_unit = q / q_norm.clamp_min(ctx.eps), k / k_norm.clamp_min(ctx.eps)
        grad_q = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_q = _normalize_backward(grad @ k_unit.to(grad.dtype), q_unit, q_norm, ctx.eps).to(q.dtype)
        if ctx.needs_input_grad[1]:
            grad_k = _normalize_backward(grad.transpose(-2, -1) @ q_unit.to(grad.dtype), k_unit, k_norm,
                                         ctx.eps).to(k.dtype)
        return grad_q, grad_k, None


def _normalize_backward(grad_unit: torch.Tensor, unit: torch.Tensor, norm: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """The gradient through ``unit = x / max(|x|, eps)``: the part of ``grad_unit`` orthogonal to
    ``unit`` over ``|x|``, or ``grad_unit / eps`` where the norm was clamped (``unit`` linear in x)."""
    grad_unit = grad_unit.to(unit.dtype)
    radial = unit * (unit * grad_unit).sum(-1, keepdim=True)
    return torch.where(norm >= eps, (grad_unit - radial) / norm.clamp_min(eps), grad_unit / eps)


def scaled_weights(layer: nn.Module, scale: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``layer``'s weight and bias times ``scale`` per output channel (the weight's first axis), so
    that the layer computes ``scale * layer(x)``. A layer scale folded so costs a product of the
    weight's size, and autograd keeps nothing of the tokens' size for the scale's gradient (the
    product ``scale * y`` keeps ``y``): the gradient reaches the scale through the weight's."""
    if scale is None:
        return layer.weight, layer.bias
    weight = layer.weight * scale.view((-1,) + (1,) * (layer.weight.dim() - 1))
    return weight, None if layer.bias is None else layer.bias * scale


def normed_linear(norm: Optional[nn.LayerNorm], linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(norm(x))`` (``linear(x)`` without a norm), through ``NormLinear`` where autograd
    records it."""
    if norm is None:
        return linear(x)
    if wants_saving_functions(x) or wants_saving_functions(linear.weight):
        return NormLinear.apply(x, norm.weight, norm.bias, linear.weight, linear.bias, norm.eps)
    return linear(norm(x))


def scaled_layer(layer: nn.Module, x: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``scale * layer(x)`` through ``scaled_weights`` for a Linear or Conv2d ``layer``; without
    ``scale``, the layer's own call."""
    if scale is None:
        return layer(x)
    weight, bias = scaled_weights(layer, scale)
    if isinstance(layer, nn.Conv2d):
        return layer._conv_forward(x, weight, bias)
    return F.linear(x, weight, bias)


def folds_layer_scale(scale: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether a block folds its layer ``scale`` into the weights before it (``scaled_weights``) on
    input ``x``: where autograd records the scale, except where the products run in float16, whose
    normal range a scaled weight can leave (the deep presets' scale of 1e-5 times a weight of 0.02),
    as ``scale * y`` never does."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    return wants_saving_functions(scale) and dtype != torch.float16


def wants_saving_functions(x: torch.Tensor) -> bool:
    """Whether a layer should use these functions on ``x``: autograd records it and no tracer
    (``torch.jit`` for FLOP counting and ONNX) needs to see the plain operators."""
    return torch.is_grad_enabled() and x.requires_grad and not torch.jit.is_tracing()
