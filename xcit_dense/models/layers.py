"""XCiT layers: conv patch embedding, Fourier positional encoding, XCA, LPI, the XCiT block and the
pyramid's upsampling.

State-dict names follow the authors' (and timm's) layout so that their ImageNet weights load
unchanged. Norm layers inside convolutional parts are configurable (BN, SyncBN, ...). Each layer has
one forward, the model as the paper and timm write it; the speed-ups of ``fast/`` replace these
layers from outside (``fast.install_fast_layers``), on the same parameters.
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.registry import MODELS
from torch import nn

from .presets import check_patch_size

DEFAULT_NORM = dict(type='BN', requires_grad=True)


@MODELS.register_module()
class ConvPatchEmbed(nn.Module):
    """Tokens from pixels: 3x3 stride-2 convs with a norm each and GELU between them.

    Patch 16 uses four convs (3 -> D/8 -> D/4 -> D/2 -> D), patch 8 three (3 -> D/4 -> D/2 -> D).
    No padding is added: the token grid is ceil(H/p) x ceil(W/p).
    """

    def __init__(self, patch_size: int = 16, in_channels: int = 3, embed_dims: int = 768,
                 norm_cfg: dict = DEFAULT_NORM) -> None:
        super().__init__()
        check_patch_size(patch_size)
        divisors = [8, 4, 2, 1] if patch_size == 16 else [4, 2, 1]
        channels = [in_channels] + [embed_dims // d for d in divisors]
        layers = []
        for i, (cin, cout) in enumerate(zip(channels[:-1], channels[1:])):
            if i > 0:
                layers.append(nn.GELU())
            conv = nn.Conv2d(cin, cout, kernel_size=3, stride=2, padding=1, bias=False)
            layers.append(nn.Sequential(conv, build_norm_layer(norm_cfg, cout)[1]))
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, 3, H, W) -> tokens (B, N, D) and the grid size (Hp, Wp)."""
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid


@MODELS.register_module()
class FourierPositionalEncoding(nn.Module):
    """DETR-style sine/cosine encoding of the token grid, projected to D channels by a 1x1 conv.

    Computed for the actual grid size, so no interpolation is ever needed.
    """

    def __init__(self, embed_dims: int = 768, num_feats: int = 32, temperature: float = 10000.,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.token_projection = nn.Conv2d(num_feats * 2, embed_dims, kernel_size=1)
        self.num_feats = num_feats
        self.temperature = temperature
        self.eps = eps

    def forward(self, batch: int, height: int, width: int) -> torch.Tensor:
        """Encoding of a (height, width) grid as a (batch, D, height, width) tensor."""
        weight = self.token_projection.weight
        ones = torch.ones(1, height, width, device=weight.device, dtype=torch.float32)
        y = ones.cumsum(1)
        x = ones.cumsum(2)
        y = y / (y[:, -1:, :] + self.eps) * (2 * math.pi)
        x = x / (x[:, :, -1:] + self.eps) * (2 * math.pi)
        dim_t = torch.arange(self.num_feats, device=weight.device, dtype=torch.float32)
        dim_t = self.temperature ** (2 * torch.div(dim_t, 2, rounding_mode='floor') / self.num_feats)
        pos_x = x[..., None] / dim_t
        pos_y = y[..., None] / dim_t
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
        pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2).to(weight.dtype)
        return self.token_projection(pos).expand(batch, -1, -1, -1)


@MODELS.register_module()
class XCA(nn.Module):
    """Cross-covariance attention: a (d x d) attention map per head, linear in the token count."""

    def __init__(self, embed_dims: int, num_heads: int = 8, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) tokens; q, k, v as (B, heads, d, N), L2-normalised along the token axis."""
        B, N, C = x.shape
        # (3, B, heads, d, N): attention runs over channels, the tokens are the feature axis
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


@MODELS.register_module()
class LPI(nn.Module):
    """Local patch interaction: depthwise 3x3 conv, GELU, norm, depthwise 3x3 conv on the grid."""

    def __init__(self, embed_dims: int, kernel_size: int = 3,
                 norm_cfg: dict = DEFAULT_NORM) -> None:
        super().__init__()
        padding = kernel_size // 2
        self.conv1 = nn.Conv2d(embed_dims, embed_dims, kernel_size, padding=padding, groups=embed_dims)
        self.act = nn.GELU()
        self.bn = build_norm_layer(norm_cfg, embed_dims)[1]
        self.conv2 = nn.Conv2d(embed_dims, embed_dims, kernel_size, padding=padding, groups=embed_dims)

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The (B, N, C) tokens of a height x width grid."""
        B, N, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, height, width)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(B, C, N).transpose(1, 2)


class Mlp(nn.Module):
    """Two-layer feed-forward network with GELU (keys fc1, fc2)."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


@MODELS.register_module()
class XCABlock(nn.Module):
    """XCiT block: XCA, then LPI, then MLP, each pre-norm with layer scale and drop path."""

    def __init__(self, embed_dims: int, num_heads: int, mlp_ratio: float = 4., qkv_bias: bool = True,
                 drop_rate: float = 0., attn_drop_rate: float = 0., drop_path_rate: float = 0.,
                 eta: float = 1.0, norm_cfg: dict = DEFAULT_NORM) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.attn = XCA(embed_dims, num_heads, qkv_bias, attn_drop_rate, drop_rate)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm3 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.local_mp = LPI(embed_dims, norm_cfg=norm_cfg)
        self.norm2 = nn.LayerNorm(embed_dims, eps=1e-6)
        self.mlp = Mlp(embed_dims, int(embed_dims * mlp_ratio), drop_rate)
        self.gamma1 = nn.Parameter(eta * torch.ones(embed_dims))
        self.gamma3 = nn.Parameter(eta * torch.ones(embed_dims))
        self.gamma2 = nn.Parameter(eta * torch.ones(embed_dims))

    def forward(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path(self.gamma3 * self.local_mp(self.norm3(x), height, width))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x)))
