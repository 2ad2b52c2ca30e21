"""Layer-wise LR decay: every group's LR is base x decay ** (L - layer), after LR scaling and a resume."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from torch import nn

from helpers import ROOT, tiny_seg_config

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
    with pytest.raises(ValueError, match='layer_decay_rate'):
        build(Detector(tiny_xcit()), layer_decay_rate=1.5)


def test_the_example_config_names_the_option():
    cfg = Config.fromfile(str(EXAMPLE))
    assert cfg.optim_wrapper.constructor == 'XCiTLayerDecayOptimizerConstructor'
    assert cfg.optim_wrapper.paramwise_cfg == dict(layer_decay_rate=0.7, custom_keys={'norm': dict(decay_mult=0.)})


def train(config: Path, work_dir: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, 'tools/train.py', str(config), '--work-dir', str(work_dir), *args],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def group_lrs(checkpoint: Path) -> list:
    groups = torch.load(checkpoint, map_location='cpu', weights_only=False)['optimizer']['param_groups']
    return [(g['layer_id'], g['lr']) for g in groups]


def test_scaled_accumulated_and_resumed(tmp_path, seg_data):
    """--scale-lr with accumulation, then a resume under another plan: the ratios hold throughout."""
    decay = dict(constructor='XCiTLayerDecayOptimizerConstructor', paramwise_cfg=dict(layer_decay_rate=0.7))
    config = tiny_seg_config(tmp_path, seg_data, optim_wrapper=decay)
    work_dir = tmp_path / 'run'
    short = ('train_cfg.max_iters=2', 'default_hooks.checkpoint.interval=2')
    log = train(config, work_dir, '--scale-lr', '--accumulation', '2', '--cfg-options', *short)
    assert 'layer decay: layer 0/5, lr scale 0.1681 (lr 2.521e-06)' in log
    assert 'layer decay: layer 5/5, lr scale 1 (lr 1.5e-05)' in log
    # base 6e-5 x effective batch 4 / reference 16 = 1.5e-5, then the layer scales
    first = group_lrs(work_dir / 'iter_4.pth')
    assert {layer for layer, _ in first} == {0, 1, 2, 3, 4, 5}
    for layer, lr in first:
        assert lr == pytest.approx(1.5e-5 * 0.7 ** (5 - layer))
    # resumed without accumulation: effective batch 2, so every group's LR halves
    train(config, work_dir, '--scale-lr', '--resume', '--cfg-options', 'default_hooks.checkpoint.interval=2')
    resumed = group_lrs(work_dir / 'iter_4.pth')
    assert [layer for layer, _ in resumed] == [layer for layer, _ in first]
    for layer, lr in resumed:
        assert lr == pytest.approx(7.5e-6 * 0.7 ** (5 - layer))
