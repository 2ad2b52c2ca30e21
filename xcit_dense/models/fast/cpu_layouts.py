"""The CPU layouts: XCA, LPI, the MLP's GELU, the block residuals and the pyramid's transposed
convolutions laid out for eager CPU runs.

Each is the same function as the plain layer in ``models/layers.py`` (the model as defined),
arranged to copy less memory on a CPU. The fast layers ask :func:`use_cpu_layouts` once per call:
traced, exported or compiled graphs (``torch.compile``), GPUs and :func:`reference_layout` blocks
get the plain layout (with the functions of ``recompute.py``).
"""
import contextvars
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .recompute import normed_linear, scaled_layer, scaled_weights

_ENABLED = contextvars.ContextVar('xcit_cpu_layouts', default=True)


@contextmanager
def reference_layout() -> Iterator[None]:
    """Run the fast layers' plain layout (what they run on GPUs) on the CPU too, inside the block: how
    the tests and benchmarks reach that path without a GPU."""
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def use_cpu_layouts(x: torch.Tensor) -> bool:
    """Whether the fast layers run their CPU layout on ``x``: eager runs on a CPU, outside
    :func:`reference_layout` blocks."""
    return (x.device.type == 'cpu' and _ENABLED.get() and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling())


def gelu(act: nn.GELU, x: torch.Tensor) -> torch.Tensor:
    """``act(x)``, in place where autograd does not need ``x`` (no new buffer of x's size)."""
    return act(x) if x.requires_grad else torch.ops.aten.gelu_(x, approximate=act.approximate)


def xca(attn: nn.Module, x: torch.Tensor, scale: Optional[torch.Tensor] = None,
        norm: Optional[nn.Module] = None) -> torch.Tensor:
    """``XCA``'s map on the (B, N, 3C) qkv as laid out, attn @ v folded into the projection
    (and ``scale``, where given, into the projection's weight and bias; ``norm`` applied first).

    The token-axis L2 norms become column sums and scale the small (d x d) products instead
    of q and k; the (d x d) maps times the projection weight make one (C x C) matrix per
    image, so the only products over the tokens are the per-head Gram matrices and the
    projection: no transposed copy of q, k, v or of the attention output.
    """
    B, N, C = x.shape
    heads, d = attn.num_heads, C // attn.num_heads
    qkv = normed_linear(norm, attn.qkv, x)
    q, k, v = qkv.split(C, dim=-1)
    sums = torch.ones(B, 1, N, dtype=x.dtype, device=x.device) @ qkv[..., :2 * C].square()
    inv = sums.sqrt().clamp_min(1e-12).reciprocal().view(B, 2, heads, d)
    q, k = q.unflatten(-1, (heads, d)).permute(0, 2, 3, 1), k.unflatten(-1, (heads, d)).transpose(1, 2)
    gram = torch.stack([qb @ kb for qb, kb in zip(q, k)])  # one image at a time: strided, no copy
    weights = gram * (inv[:, 0, :, :, None] * inv[:, 1, :, None, :]) * attn.temperature
    weights = attn.attn_drop(weights.softmax(dim=-1))
    proj_weight, proj_bias = scaled_weights(attn.proj, scale)
    folded = weights.transpose(-2, -1) @ proj_weight.t().view(heads, d, C)
    return attn.proj_drop(torch.baddbmm(proj_bias, v, folded.reshape(B, C, C)))


def lpi(lpi: nn.Module, x: torch.Tensor, height: int, width: int,
        scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``LPI`` on the tokens seen as a channels_last map: no copy either way."""
    B, N, C = x.shape
    x = x.reshape(B, height, width, C).permute(0, 3, 1, 2)
    x = scaled_layer(lpi.conv2, lpi.bn(gelu(lpi.act, lpi.conv1(x))), scale)
    return x.permute(0, 2, 3, 1).reshape(B, N, C)


def residual(x: torch.Tensor, gamma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gamma * y in one pass over memory (addcmul), written over the fresh ``y`` when autograd
    does not need it (the block calls it where no drop path applies)."""
    return torch.addcmul(x, gamma, y) if y.requires_grad else torch.addcmul(x, gamma, y, out=y)


class _UpConv2x2(torch.autograd.Function):
    """A 2x2 stride-2 transposed convolution whose backward runs as a convolution and a product.

    Its output pixels do not overlap, so the input gradient is a 2x2 stride-2 convolution of the
    output gradient and the weight gradient one matrix product of the input with the output
    gradient's 2x2 blocks. On channels_last maps (the CPU layout's token maps), torch's CPU kernel
    for this backward takes more than twice as long as those two; the forward is torch's own. It
    keeps what autograd keeps for the transposed convolution: the input and the weight. The layouts
    run on CPUs only, so its autocast is the CPU's.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type='cpu')
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.conv_transpose2d(x, weight, bias, stride=2)

    @staticmethod
    @once_differentiable
    @torch.amp.custom_bwd(device_type='cpu')
    def backward(ctx, grad: torch.Tensor):  # under the forward's autocast: the products cast as torch's
        x, weight = ctx.saved_tensors
        B, C_in, H, W = x.shape
        C_out = weight.shape[1]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.nn.functional.conv2d(grad, weight, stride=2)
        if ctx.needs_input_grad[1]:
            # the output gradient's 2x2 blocks as (B*H*W, 2*2*C_out): a short copy from channels_last
            blocks = grad.permute(0, 2, 3, 1).unflatten(2, (W, 2)).unflatten(1, (H, 2)).transpose(2, 3)
            pixels = x.permute(0, 2, 3, 1).reshape(B * H * W, C_in)
            grad_weight = (pixels.t() @ blocks.reshape(B * H * W, 4 * C_out)).view(C_in, 2, 2, C_out)
            grad_weight = grad_weight.permute(0, 3, 1, 2)
        if ctx.needs_input_grad[2]:  # False without a bias; a bfloat16 gradient summed in float32
            grad_bias = grad.sum((0, 2, 3), dtype=torch.promote_types(grad.dtype, torch.float32))
        return grad_x, grad_weight, grad_bias


def up_conv_2x2(conv: nn.ConvTranspose2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` for a 2x2 stride-2 transposed convolution (no padding, groups or dilation), its
    backward as a convolution and a matrix product (``_UpConv2x2``)."""
    return _UpConv2x2.apply(x, conv.weight, conv.bias)
