"""The models the benchmark measures, and the timm reference models it compares XCiT with.

Every model is built through the mmengine / mmdet / mmseg registries with random weights. The
reference models are registered in mmengine's root registry when this module is imported; they
import timm when built, as its import alone adds some 140 MB to the resident size of every run.
"""
import importlib.util
import math
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmengine.registry import MODELS as ROOT_MODELS
from torch import nn

from xcit_dense.models.xcit import PYRAMID_STRIDES, XCiT

ROOT = Path(__file__).resolve().parents[1]
ARCHS = {'t12': 'tiny_12', 's12': 'small_12'}


@ROOT_MODELS.register_module()
class BenchTimmXCiTPyramid(nn.Module):
    """timm's XCiT (``forward_intermediates``) and the dense pyramid in plain functional torch.

    The weights are those of ``source`` (this toolkit's XCiT), or of a fresh one.
    """

    def __init__(self, arch: str = 'small_12', patch_size: int = 16, source: Optional[XCiT] = None):
        import timm
        super().__init__()
        if source is None:
            source = XCiT(arch=arch, patch_size=patch_size)
            source.init_weights()
        self.model = timm.create_model(f'xcit_{arch}_p{patch_size}_224', pretrained=False)
        self.indices = list(source.out_indices)
        self.patch_size = patch_size
        self.model.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)
        state = source.state_dict()
        missing, _ = self.model.load_state_dict({k: v for k, v in state.items() if not k.startswith('fpn')},
                                                strict=False)
        if missing:
            raise RuntimeError(f'timm XCiT weights not shared: {missing[:5]}')
        for key, value in state.items():
            if key.startswith('fpn') and 'num_batches_tracked' not in key:
                name = key.replace('.', '_')
                if 'running' in key:
                    self.register_buffer(name, value.clone())
                else:
                    self.register_parameter(name, nn.Parameter(value.clone()))

    def _convt(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.conv_transpose2d(x, getattr(self, prefix + '_weight'), getattr(self, prefix + '_bias'), stride=2)

    def _bn(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.batch_norm(x, getattr(self, prefix + '_running_mean'), getattr(self, prefix + '_running_var'),
                            getattr(self, prefix + '_weight'), getattr(self, prefix + '_bias'),
                            self.training, 0.1, 1e-5)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The four pyramid maps at strides 4-32, cropped as this toolkit's XCiT crops them."""
        height, width = x.shape[2:]
        maps = self.model.forward_intermediates(x, indices=self.indices, intermediates_only=True)
        if self.patch_size == 16:
            outs = [self._convt(F.gelu(self._bn(self._convt(maps[0], 'fpn1_0'), 'fpn1_1')), 'fpn1_3'),
                    self._convt(maps[1], 'fpn2_0'), maps[2], F.max_pool2d(maps[3], 2, ceil_mode=True)]
        else:
            outs = [self._convt(maps[0], 'fpn1_0'), maps[1], F.max_pool2d(maps[2], 2, ceil_mode=True),
                    F.max_pool2d(maps[3], 4, ceil_mode=True)]
        return tuple(o[:, :, :math.ceil(height / s), :math.ceil(width / s)]
                     for o, s in zip(outs, PYRAMID_STRIDES))


@ROOT_MODELS.register_module()
class BenchTimmViT(nn.Module):
    """timm's plain ViT at any input size (global attention), its intermediate token maps."""

    def __init__(self, name: str = 'vit_small_patch16_224', indices: Sequence[int] = (3, 5, 7, 11)):
        import timm
        super().__init__()
        self.model = timm.create_model(name, pretrained=False, dynamic_img_size=True)
        self.indices = list(indices)
        self.model.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The token maps of the blocks in ``indices``."""
        return tuple(self.model.forward_intermediates(x, indices=self.indices, intermediates_only=True))


def _models() -> Dict[str, dict]:
    """Name -> how to build it: a registry config (``scope``, ``cfg``) or a model config file."""
    models = {}
    for short, arch in ARCHS.items():
        for patch in (16, 8):
            models[f'xcit_{short}_p{patch}'] = dict(
                kind='backbone', scope='mmengine', cfg=dict(type='XCiT', arch=arch, patch_size=patch))
            models[f'timm_xcit_{short}_p{patch}'] = dict(
                kind='backbone', scope='mmengine', cfg=dict(type='BenchTimmXCiTPyramid', arch=arch,
                                                            patch_size=patch))
    models['swin_t'] = dict(kind='backbone', scope='mmdet', cfg=dict(
        type='SwinTransformer', embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7,
        mlp_ratio=4, qkv_bias=True, drop_path_rate=0., patch_norm=True, out_indices=(0, 1, 2, 3)))
    models['r50'] = dict(kind='backbone', scope='mmdet', cfg=dict(
        type='ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3), norm_cfg=dict(type='BN'), style='pytorch'))
    models['vit_s16'] = dict(kind='backbone', scope='mmengine', cfg=dict(
        type='BenchTimmViT', name='vit_small_patch16_224', indices=(3, 5, 7, 11)))
    models['mmseg_vit_s16'] = dict(kind='backbone', scope='mmseg', cfg=dict(
        type='VisionTransformer', img_size=(224, 224), patch_size=16, embed_dims=384, num_layers=12,
        num_heads=6, mlp_ratio=4, qkv_bias=True, out_indices=(3, 5, 7, 11), final_norm=False,
        interpolate_mode='bicubic'))
    models['mask_rcnn_xcit_t12_p16'] = dict(
        kind='detector', config=str(ROOT / 'configs/xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py'))
    models['upernet_xcit_t12_p16'] = dict(
        kind='segmentor', config=str(ROOT / 'configs/xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py'))
    # the recipe's whole models, beside the stock Swin-T ones users would pick instead
    for short, arch in ARCHS.items():
        for patch in (16, 8):
            models.setdefault(f'mask_rcnn_xcit_{short}_p{patch}', dict(
                kind='detector', config=str(ROOT / f'configs/xcit/mask_rcnn_xcit_{arch}_p{patch}_3x_coco.py')))
            models.setdefault(f'upernet_xcit_{short}_p{patch}', dict(
                kind='segmentor', config=str(ROOT / f'configs/xcit/upernet_xcit_{arch}_p{patch}_160k_ade20k.py')))
    models['mask_rcnn_swin_t'] = dict(kind='detector', config=stock_config(
        'mmdet', 'swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'))
    models['upernet_swin_t'] = dict(kind='segmentor', config=stock_config(
        'mmseg', 'swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'))
    return models


def stock_config(package: str, path: str) -> str:
    """The path of a config that the installed mmdet or mmseg ships (its ``.mim/configs``)."""
    return str(Path(importlib.util.find_spec(package).origin).parent / '.mim' / 'configs' / path)


MODELS = _models()
DEFAULT_MODELS = ['xcit_t12_p16', 'xcit_t12_p8', 'xcit_s12_p16', 'xcit_s12_p8', 'timm_xcit_s12_p16',
                  'swin_t', 'r50', 'vit_s16', 'mask_rcnn_xcit_t12_p16', 'upernet_xcit_t12_p16']


def model_kind(model: str) -> str:
    """What ``model`` is (backbone, detector, segmentor), or ``config`` for a config file given by path."""
    return MODELS[model]['kind'] if model in MODELS else 'config'
