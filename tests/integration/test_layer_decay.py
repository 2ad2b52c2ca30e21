"""Layer-wise LR decay: every group's LR is base x decay ** (L - layer). After LR scaling and a resume
under another batch plan the ratios hold too: checked in test_faults_training.py's world-size resume,
which trains under this constructor (one launched pair of runs for both behaviours, in the slow stage)."""
import pytest
import torch
from helpers import ROOT
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from torch import nn

EXAMPLE = ROOT / 'configs/examples/mask_rcnn_xcit_small_12_p16_3x_coco_layer_decay.py'


def expected_layer(name: str, depth: int) -> int:
    parts = name.split('.')
    if parts[:2] in (['backbone', 'patch_embed'], ['backbone', 'pos_embed']):
        return 0
    if parts[:2] == ['backbone', 'blocks']:
        return int(parts[2]) + 1
    return depth + 1


class Detector(nn.Module):
    """A backbone and a neck, named as mmdet/mmseg models name them."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.neck = nn.Sequential(nn.Conv2d(64, 8, 1), nn.LayerNorm(8))


def build(model: nn.Module, lr: float = 1e-3, **paramwise) -> torch.optim.Optimizer:
    paramwise_cfg = dict(layer_decay_rate=0.7, custom_keys={'norm': dict(decay_mult=0.)})
    paramwise_cfg.update(paramwise)
    paramwise_cfg = {key: value for key, value in paramwise_cfg.items() if value is not None}  # None: left out
    cfg = dict(constructor='XCiTLayerDecayOptimizerConstructor',
               optimizer=dict(type='AdamW', lr=lr, weight_decay=0.05), paramwise_cfg=paramwise_cfg)
    return build_optim_wrapper(model, Config(dict(optim_wrapper=cfg)).optim_wrapper).optimizer


def test_each_parameter_gets_its_layer_scale_and_weight_decay(tiny_xcit):
    model = Detector(tiny_xcit(frozen_stages=1))
    optimizer = build(model, custom_keys={'norm': dict(decay_mult=0.), 'gamma': dict(decay_mult=0.)})
    names = {id(p): n for n, p in model.named_parameters()}
    seen = []
    for group in optimizer.param_groups:
        for param in group['params']:
            name = names[id(param)]
            seen.append(name)
            layer = expected_layer(name, depth=4)
            assert group['layer_id'] == layer, name
            assert group['lr'] == pytest.approx(1e-3 * 0.7 ** (5 - layer)), name
            no_decay = 'norm' in name or 'gamma' in name
            assert group['weight_decay'] == (0.0 if no_decay else 0.05), name
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(seen) == sorted(trainable)  # each trainable tensor once, the frozen block out
    assert not any(n.startswith(('backbone.patch_embed', 'backbone.blocks.0.')) for n in seen)
    assert {g['layer_id'] for g in optimizer.param_groups} == {2, 3, 4, 5}
    # merged: per layer, one group per (lr, weight decay, custom key) combination, not per tensor
    assert len(optimizer.param_groups) < len(seen) / 3


def test_a_decay_rate_is_required(tiny_xcit):
    with pytest.raises(ValueError, match='XCiTLayerDecayOptimizerConstructor needs paramwise_cfg.layer_decay_rate'):
        build(Detector(tiny_xcit()), layer_decay_rate=None)


@pytest.mark.parametrize('rate', [1.5, 0.0])
def test_a_decay_rate_outside_0_1_is_refused(tiny_xcit, rate):
    with pytest.raises(ValueError, match=rf'layer_decay_rate must be in \(0, 1\], got {rate}'):
        build(Detector(tiny_xcit()), layer_decay_rate=rate)


def test_the_example_config_names_the_option():
    cfg = Config.fromfile(str(EXAMPLE))
    assert cfg.optim_wrapper.constructor == 'XCiTLayerDecayOptimizerConstructor'
    assert cfg.optim_wrapper.paramwise_cfg == dict(layer_decay_rate=0.7, custom_keys={'norm': dict(decay_mult=0.)})
