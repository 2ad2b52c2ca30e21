"""The fast set: drop-in replacements of the plain layers, the same function on the same parameters.

Each is a subclass of its plain layer that adds no state, so that ``install_fast_layers`` swaps a
layer by its class and every Parameter, buffer, key and hook stays where it was. Where a speed-up
holds only under some condition the fast layer checks it at each call and otherwise runs the plain
forward: the CPU layouts (``cpu_layouts.py``) in eager CPU runs, the recomputing autograd functions
and the layer scales folded into the weights (``recompute.py``) where autograd records the layer
and no ``torch.jit`` tracer needs the plain operators, the folds never in float16 products.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from torch import nn

from ..layers import LPI, XCA, ConvPatchEmbed, Mlp, XCABlock
from . import cpu_layouts
from .cpu_layouts import use_cpu_layouts
from .recompute import (
    GeluLinear,
    NormalizedGram,
    folds_layer_scale,
    normed_linear,
    scaled_layer,
    scaled_weights,
    wants_saving_functions,
)


class FastConvPatchEmbed(ConvPatchEmbed):
    """``ConvPatchEmbed`` on a channels_last input in the CPU layout: faster convolutions there, and
    the tokens come out contiguous."""

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        if use_cpu_layouts(x):
            x = x.contiguous(memory_format=torch.channels_last)
        return super().forward(x)


class FastXCA(XCA):
    """``XCA``, given the block's ``norm`` to apply first and a ``scale`` per output channel to fold
    into the projection where its block folds the layer scale."""

    def forward(self, x: torch.Tensor, scale: Optional[torch.Tensor] = None,
                norm: Optional[nn.LayerNorm] = None) -> torch.Tensor:
        if use_cpu_layouts(x):
            return cpu_layouts.xca(self, x, scale, norm)
        if not (wants_saving_functions(x) or norm is not None or scale is not None):
            return super().forward(x)
        B, N, C = x.shape
        qkv = normed_linear(norm, self.qkv, x).reshape(B, N, 3, self.num_heads, C // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 4, 1).unbind(0)
        if wants_saving_functions(q):  # the same product, keeping the norms instead of normalised copies
            attn = NormalizedGram.apply(q, k, 1e-12) * self.temperature
        else:
            attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
        return self.proj_drop(scaled_layer(self.proj, x, scale))


class FastLPI(LPI):
    """``LPI`` on a channels_last view of the tokens in the CPU layout, its output times ``scale``
    (folded into the second convolution) where given."""

    def forward(self, x: torch.Tensor, height: int, width: int,
                scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if use_cpu_layouts(x):
            return cpu_layouts.lpi(self, x, height, width, scale)
        if scale is None:
            return super().forward(x, height, width)
        B, N, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, height, width)
        x = scaled_layer(self.conv2, self.bn(self.act(self.conv1(x))), scale)
        return x.reshape(B, C, N).transpose(1, 2)


class FastMlp(Mlp):
    """``Mlp`` given the block's ``norm`` to apply first and a ``scale`` to fold into fc2; in
    training fc2(GELU(h)) keeps ``h`` only (``GeluLinear``)."""

    def forward(self, x: torch.Tensor, scale: Optional[torch.Tensor] = None,
                norm: Optional[nn.LayerNorm] = None) -> torch.Tensor:
        x = normed_linear(norm, self.fc1, x)
        if self.drop.p == 0 and wants_saving_functions(x):  # fc2(GELU(x)), GELU's output not kept
            return GeluLinear.apply(x, *scaled_weights(self.fc2, scale), self.act.approximate)
        x = cpu_layouts.gelu(self.act, x) if use_cpu_layouts(x) else self.act(x)
        return self.drop(scaled_layer(self.fc2, self.drop(x), scale))


class FastXCABlock(XCABlock):
    """``XCABlock`` whose sub-layers apply its norms, with its layer scales folded into their last
    weights in training (outside float16), and its residuals in one pass in the CPU layout."""

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        if torch.jit.is_tracing():  # FLOP counters and ONNX export see the plain operators
            return super().forward(x, height, width)
        if folds_layer_scale(self.gamma1, x):
            # each layer scale folded into its sub-layer's last weights, the same function; autograd
            # then keeps no sub-layer output (of the tokens' size) for the scale's gradient
            x = self._add(x, self.gamma1, self.attn(x, scale=self.gamma1, norm=self.norm1))
            x = self._add(x, self.gamma3, self.local_mp(self.norm3(x), height, width, scale=self.gamma3))
            return self._add(x, self.gamma2, self.mlp(x, scale=self.gamma2, norm=self.norm2))
        x = self._residual(x, self.gamma1, self.attn(x, norm=self.norm1))
        x = self._residual(x, self.gamma3, self.local_mp(self.norm3(x), height, width))
        return self._residual(x, self.gamma2, self.mlp(x, norm=self.norm2))

    def _add(self, x: torch.Tensor, gamma: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
        """x + drop_path(scaled), ``scaled`` a sub-layer's output with ``gamma`` folded in, in the dtype
        of ``gamma * y`` (under autocast: float32, the residual stream's, not the products')."""
        return x + self.drop_path(scaled.to(torch.promote_types(scaled.dtype, gamma.dtype)))

    def _residual(self, x: torch.Tensor, gamma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x + drop_path(gamma * y)."""
        if use_cpu_layouts(x) and not (self.training and isinstance(self.drop_path, DropPath)):
            return cpu_layouts.residual(x, gamma, y)
        return x + self.drop_path(gamma * y)


class FastUpConv2x2(nn.ConvTranspose2d):
    """The pyramid's 2x2 stride-2 transposed convolution, its backward in the CPU layout as a
    convolution and a matrix product (``cpu_layouts.up_conv_2x2``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_cpu_layouts(x):
            return cpu_layouts.up_conv_2x2(self, x)
        return super().forward(x)
