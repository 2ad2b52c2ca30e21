"""The XCiT backbone for dense prediction: XCiT blocks plus a 4-level pyramid (strides 4-32).

Follows the authors' detection/segmentation backbone: no class token, no final norm; the token
maps after blocks `out_indices` are resampled to strides 4, 8, 16 and 32, all with D channels.
"""
import math
import typing
from typing import Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.utils.checkpoint as cp
from mmcv.cnn import build_norm_layer
from mmengine.logging import MMLogger, print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..io.weights import load_backbone_weights
from .fast import install_fast_layers
from .layers import DEFAULT_NORM, ConvPatchEmbed, FourierPositionalEncoding, XCABlock
from .presets import PRESETS, default_out_indices

# name -> (embed_dims, depth, num_heads, eta): the presets as tuples (public API)
ARCH_SETTINGS: Dict[str, Tuple[int, int, int, float]] = {
    name: (p.embed_dims, p.depth, p.num_heads, p.eta) for name, p in PRESETS.items()}
PYRAMID_STRIDES = (4, 8, 16, 32)
CheckpointMode = Literal[False, True, 'selective']  # the values of ``with_cp``
FastLayers = Union[Literal['auto'], bool]  # the values of ``fast_layers``

# What selective checkpointing keeps from the forward: the outputs of the matrix products (linear
# layers, XCA's Gram and attention products), the costly operators. Everything else in a block
# (norms, GELU, LPI's depthwise convolutions, softmax, the copies between layouts) is recomputed in
# the backward, which takes about one extra pass over memory instead of storing those tensors.
_SAVED_IN_SELECTIVE = frozenset((torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                                 torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default))


def _selective_policy(ctx, op, *args, **kwargs) -> cp.CheckpointPolicy:
    return cp.CheckpointPolicy.MUST_SAVE if op in _SAVED_IN_SELECTIVE else cp.CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return cp.create_selective_checkpoint_contexts(_selective_policy)


def _upsample(dims: int, twice: bool, norm_cfg: dict) -> nn.Sequential:
    """One or two 2x transposed convolutions (with norm and GELU between two)."""
    def up() -> nn.ConvTranspose2d:
        return nn.ConvTranspose2d(dims, dims, kernel_size=2, stride=2)
    if not twice:
        return nn.Sequential(up())
    return nn.Sequential(up(), build_norm_layer(norm_cfg, dims)[1], nn.GELU(), up())


def _downsample(factor: int) -> nn.Module:
    # ceil_mode keeps the stride-32 level at ceil(H/32) for inputs not divisible by 32
    return nn.MaxPool2d(kernel_size=factor, stride=factor, ceil_mode=True)


def _wants_fast_layers(choice: FastLayers) -> bool:
    """``fast_layers`` decided: ``'auto'`` is on without a GPU and off with one, said in the log."""
    if choice != 'auto':
        return choice
    if torch.cuda.is_available():
        print_log('XCiT: the plain layers (the default on GPUs, where the fast set is not yet measured; '
                  'model.backbone.fast_layers=True gives the fast layers)', logger='current')
        return False
    print_log("XCiT: the CPU's fast layers (the default on CPUs; model.backbone.fast_layers=False gives the "
              'plain layers)', logger='current')
    return True


@MODELS.register_module()
class XCiT(BaseModule):
    """XCiT backbone returning a 4-level pyramid for FPN-style necks and heads.

    Args:
        arch: preset name (``tiny_12``, ``small_12``, ... see ``presets.PRESETS``).
        patch_size: 8 or 16.
        embed_dims, depth, num_heads, eta: override the preset's values when given.
        mlp_ratio: hidden size of the MLP relative to ``embed_dims``.
        qkv_bias: bias in the qkv projection.
        drop_rate, attn_drop_rate: dropout after projections and on the attention map.
        drop_path_rate: stochastic depth, the same rate in every block (as the authors do).
        out_indices: blocks whose outputs make the pyramid; defaults to the official ones.
        norm_cfg: norm of the patch embedding, LPI and pyramid adapter (BN or SyncBN).
        frozen_stages: -1 freezes nothing, 0 the patch embedding and positional encoding,
            n > 0 also the first n blocks.
        norm_eval: keep BatchNorm layers in eval mode while training.
        with_cp: activation checkpointing per block, trading compute for memory: ``True`` keeps
            only each block's input and recomputes the whole block in the backward;
            ``'selective'`` also keeps the matrix products' outputs and recomputes the cheap
            operators between them (norms, GELU, LPI, softmax), saving less memory for less time.
        channels_last: run the patch embedding and pyramid convolutions in channels_last
            memory format (inputs and weights); the token maps are (B, D, Hp, Wp) views of the
            tokens, channels_last, in any case.
        fast_layers: replace the layers by the speed-ups of ``models/fast/`` (the same function
            and parameters, less memory and time on CPUs), decided once here: ``'auto'`` installs
            them where no GPU is present and says so in the log; ``True`` / ``False`` always / never.
            FLOP counting and ONNX export build with ``False``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, sha256=None)`` loads the authors',
            timm's or this toolkit's weights (see ``weights.load_backbone_weights``).
    """

    def __init__(self,
                 arch: str = 'small_12',
                 patch_size: int = 16,
                 in_channels: int = 3,
                 embed_dims: Optional[int] = None,
                 depth: Optional[int] = None,
                 num_heads: Optional[int] = None,
                 eta: Optional[float] = None,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 out_indices: Optional[Sequence[int]] = None,
                 norm_cfg: dict = DEFAULT_NORM,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: CheckpointMode = False,
                 channels_last: bool = False,
                 fast_layers: FastLayers = 'auto',
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if arch not in PRESETS:
            raise ValueError(f'unknown XCiT arch {arch!r}; choose one of {sorted(PRESETS)}')
        preset = PRESETS[arch]
        self.arch = arch
        self.patch_size = patch_size
        self.embed_dims = embed_dims if embed_dims is not None else preset.embed_dims
        self.depth = depth if depth is not None else preset.depth
        self.num_heads = num_heads if num_heads is not None else preset.num_heads
        eta = eta if eta is not None else preset.eta
        out_indices = tuple(out_indices) if out_indices is not None else default_out_indices(self.depth)
        if len(out_indices) != len(PYRAMID_STRIDES):
            raise ValueError(f'the XCiT pyramid has 4 levels, so out_indices needs 4 entries; '
                             f'got {len(out_indices)}: {out_indices}')
        bad = [i for i in out_indices if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f'out_indices {bad} are outside the {self.depth} blocks (0..{self.depth - 1})')
        if list(out_indices) != sorted(set(out_indices)):
            raise ValueError(f'out_indices must be strictly increasing, got {out_indices}')
        if not -1 <= frozen_stages <= self.depth:
            raise ValueError(f'frozen_stages must be in -1..{self.depth}, got {frozen_stages}')
        modes = typing.get_args(CheckpointMode)
        if not any(with_cp == mode and type(with_cp) is type(mode) for mode in modes):  # True, not 1
            raise ValueError(f"with_cp must be one of {', '.join(map(repr, modes))}; got {with_cp!r}")
        if not (fast_layers == 'auto' or isinstance(fast_layers, bool)):
            raise ValueError(f"fast_layers must be 'auto', True or False; got {fast_layers!r}")
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.channels_last = channels_last

        dims = self.embed_dims
        self.patch_embed = ConvPatchEmbed(patch_size, in_channels, dims, norm_cfg)
        self.pos_embed = FourierPositionalEncoding(dims)
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList(
            XCABlock(dims, self.num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate,
                     drop_path_rate, eta, norm_cfg) for _ in range(self.depth))
        # Pyramid adapter: from stride p to strides 4, 8, 16, 32.
        if patch_size == 16:
            self.fpn1 = _upsample(dims, True, norm_cfg)
            self.fpn2 = _upsample(dims, False, norm_cfg)
            self.fpn3 = nn.Identity()
            self.fpn4 = _downsample(2)
        else:
            self.fpn1 = _upsample(dims, False, norm_cfg)
            self.fpn2 = nn.Identity()
            self.fpn3 = _downsample(2)
            self.fpn4 = _downsample(4)
        if channels_last:
            for module in (self.patch_embed, self.fpn1, self.fpn2):
                module.to(memory_format=torch.channels_last)
        self.fast_layers = _wants_fast_layers(fast_layers)
        if self.fast_layers:
            install_fast_layers(self)
        self._freeze_stages()

    def init_weights(self) -> None:
        """Official init (truncated normal Linear weights); then pretrained weights, if any."""
        self.apply(self._init_module)
        if self.init_cfg is None:
            self._is_init = True
            return
        if self.init_cfg.get('type') != 'Pretrained':
            raise ValueError(f"XCiT supports init_cfg=dict(type='Pretrained', checkpoint=...) "
                             f'only, got {self.init_cfg}')
        if 'checkpoint' not in self.init_cfg:
            raise ValueError(f"init_cfg of type 'Pretrained' needs a 'checkpoint': {self.init_cfg}")
        load_backbone_weights(self, self.init_cfg['checkpoint'],
                              allowed_missing=('fpn1.', 'fpn2.', 'fpn3.', 'fpn4.'),
                              logger=MMLogger.get_current_instance(), sha256=self.init_cfg.get('sha256'))
        self._is_init = True

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.patch_embed, self.pos_embed, *self.blocks[:self.frozen_stages]]

    def _freeze_stages(self) -> None:
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad = False

    def train(self, mode: bool = True) -> 'XCiT':
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def forward_token_maps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Token maps (B, D, Hp, Wp) after the blocks in ``out_indices``, before the pyramid."""
        B = x.shape[0]
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x, (Hp, Wp) = self.patch_embed(x)
        x = x + self.pos_embed(B, Hp, Wp).flatten(2).transpose(1, 2)
        x = self.pos_drop(x)
        maps = []
        for i, block in enumerate(self.blocks[:self.out_indices[-1] + 1]):
            # every block that trains, the first after frozen stages too (its input needs no grad)
            if self.with_cp and self.training and i >= max(self.frozen_stages, 0):
                contexts = _selective_contexts if self.with_cp == 'selective' else cp.noop_context_fn
                x = cp.checkpoint(block, x, Hp, Wp, use_reentrant=False, context_fn=contexts)
            else:
                x = block(x, Hp, Wp)
            if i in self.out_indices:  # of the contiguous tokens: a channels_last view, no copy
                maps.append(x.transpose(1, 2).reshape(B, -1, Hp, Wp))
        return maps

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, 3, H, W) -> 4 maps (B, D, ceil(H/s), ceil(W/s)) for s = 4, 8, 16, 32."""
        height, width = x.shape[2:]
        maps = self.forward_token_maps(x)
        outs = []
        for op, feat, stride in zip((self.fpn1, self.fpn2, self.fpn3, self.fpn4), maps, PYRAMID_STRIDES):
            # an upsampled level of an input not divisible by 32 is cropped to ceil(H/s) x ceil(W/s)
            outs.append(op(feat)[:, :, :math.ceil(height / stride), :math.ceil(width / stride)])
        return tuple(outs)
