"""Layer-wise learning-rate decay for XCiT detectors and segmentors (as BEiT and ViTDet do).

The patch embedding and positional encoding are layer 0, block i is layer i + 1, and
everything after the blocks (pyramid, neck, heads) is layer L = depth + 1 with scale 1:
a parameter of layer l trains at decay ** (L - l) times the learning rate its other
paramwise rules (custom_keys, *_decay_mult, ...) give it.
"""
from typing import Dict, List, Optional, Tuple

from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn


def layer_id(name: str, depth: int, prefix: str = 'backbone.') -> int:
    """The layer of a parameter name: 0 before the blocks, i + 1 in block i, depth + 1 after."""
    if name.startswith(prefix):
        first, *rest = name[len(prefix):].split('.')
        if first in ('patch_embed', 'pos_embed', 'cls_token'):
            return 0
        if first == 'blocks':
            return int(rest[0]) + 1
    return depth + 1


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class XCiTLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """MMEngine's default constructor, then LR x ``layer_decay_rate`` ** (L - layer) per parameter.

    ``paramwise_cfg`` takes ``layer_decay_rate`` (in (0, 1]) besides the default constructor's
    keys. Parameters that share a layer, learning rate and options form one group, logged
    one line each; groups carry ``layer_id`` and ``lr_scale``.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        paramwise_cfg = dict(paramwise_cfg or {})
        if 'layer_decay_rate' not in paramwise_cfg:
            raise ValueError('XCiTLayerDecayOptimizerConstructor needs paramwise_cfg.layer_decay_rate')
        self.layer_decay_rate = float(paramwise_cfg.pop('layer_decay_rate'))
        if not 0 < self.layer_decay_rate <= 1:
            raise ValueError(f'layer_decay_rate must be in (0, 1], got {self.layer_decay_rate}')
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        self.paramwise_cfg = paramwise_cfg or {'custom_keys': {}}  # never {}: that skips add_params

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module: Optional[float] = None) -> None:
        if prefix:  # the default rules, recursing through the submodules
            super().add_params(params, module, prefix, is_dcn_module)
            return
        groups: List[dict] = []
        super().add_params(groups, module)
        params.extend(self._decay_by_layer(groups, module))

    def _decay_by_layer(self, groups: List[dict], model: nn.Module) -> List[dict]:
        """Scale each per-tensor group's LR by its layer, then merge groups that agree."""
        backbone = getattr(model, 'backbone', model)
        prefix = 'backbone.' if backbone is not model else ''
        depth = len(backbone.blocks)
        names = {id(p): n for n, p in model.named_parameters()}
        merged: Dict[Tuple, dict] = {}
        for group in groups:
            layer = layer_id(names[id(group['params'][0])], depth, prefix)
            scale = self.layer_decay_rate ** (depth + 1 - layer)
            options = {k: v for k, v in group.items() if k != 'params'}
            options.update(lr=options.get('lr', self.base_lr) * scale, layer_id=layer, lr_scale=scale)
            if self.base_wd is not None:
                options.setdefault('weight_decay', self.base_wd)
            key = tuple(sorted((k, repr(v)) for k, v in options.items()))
            merged.setdefault(key, dict(options, params=[]))['params'].extend(group['params'])
        # heads first: MMEngine logs the first group's LR, which is then the base LR
        result = sorted(merged.values(), key=lambda g: -g['layer_id'])
        for group in result:
            print_log(f"layer decay: layer {group['layer_id']}/{depth + 1}, lr scale {group['lr_scale']:.4g} "
                      f"(lr {group['lr']:.4g}), weight decay {group.get('weight_decay', 0):g}, "
                      f"{len(group['params'])} tensors", logger='current')
        return result
