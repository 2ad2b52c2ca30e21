"""The presets (xcit_dense/models/presets.py) against timm's XCiT definitions, and every config in
configs/ against the presets: a backbone setting or width that disagrees with its arch fails."""
import re
from pathlib import Path
from typing import List

import pytest
import timm
import torch
from helpers import ROOT
from mmengine.config import Config

from xcit_dense.models.presets import PATCH_SIZES, PRESETS, XCiTPreset, default_out_indices

# every config a user runs: the recipes, the demos and the example (not the _base_ fragments)
CONFIGS = sorted(p for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts)
NAMED = re.compile(r'xcit_(?P<arch>[a-z]+_\d+)_p(?P<patch>\d+)_')


@pytest.mark.parametrize('name', sorted(PRESETS))
def test_preset_matches_timm(name):
    """Width, depth and heads of timm's ImageNet XCiT of the same name (an independent table)."""
    preset = PRESETS[name]
    with torch.device('meta'):
        reference = timm.create_model(f'xcit_{name}_p16_224', pretrained=False)
    assert preset.name == name
    assert (preset.embed_dims, preset.depth, preset.num_heads) == (
        reference.embed_dim, len(reference.blocks), reference.blocks[0].attn.num_heads)
    assert preset.eta == (1.0 if preset.depth == 12 else 1e-5)
    out_indices = default_out_indices(preset.depth)
    assert len(out_indices) == 4 and out_indices[-1] == preset.depth - 1
    assert preset.weights_url(8) == f'https://dl.fbaipublicfiles.com/xcit/xcit_{name}_p8_384_dist.pth'


def disagreements(path: Path) -> List[str]:
    """What in the config's model contradicts the preset of its backbone's arch (empty: nothing)."""
    model = Config.fromfile(str(path)).model
    backbone = model.backbone
    if backbone.get('type') != 'XCiT':
        return [f'backbone type {backbone.get("type")!r}, not XCiT']
    if backbone.get('arch') not in PRESETS:
        return [f'arch {backbone.get("arch")!r} is not a preset']
    preset: XCiTPreset = PRESETS[backbone.arch]
    patch = backbone.get('patch_size')
    found = []
    if patch not in PATCH_SIZES:
        found.append(f'patch_size {patch!r}')
    for key in ('embed_dims', 'depth', 'num_heads', 'eta', 'out_indices'):
        value = backbone.get(key)
        expected = default_out_indices(preset.depth) if key == 'out_indices' else getattr(preset, key)
        if value is not None and (tuple(value) if key == 'out_indices' else value) != expected:
            found.append(f'{key}={value!r}, the preset has {expected!r}')
    named = NAMED.search(path.name)
    if named and (named['arch'], int(named['patch'])) != (preset.name, patch):
        found.append(f'the file name says {named["arch"]}/{named["patch"]}, the backbone is {preset.name}/{patch}')
    checkpoint = (backbone.get('init_cfg') or {}).get('checkpoint', '')
    if checkpoint.startswith('http') and patch in PATCH_SIZES and checkpoint != preset.weights_url(patch):
        found.append(f'pretrained {checkpoint}, the preset has {preset.weights_url(patch)}')
    # the modules reading the pyramid are as wide as the backbone
    part = next(part for part in ('neck', 'decode_head', 'panoptic_head') if model.get(part))
    widths = {part: list(model[part].in_channels)}
    if model.get('auxiliary_head'):
        widths['auxiliary_head'] = [model.auxiliary_head.in_channels]
    found += [f'{part} in_channels {width}, the preset has {preset.embed_dims}'
              for part, width in widths.items() if set(width) != {preset.embed_dims}]
    return found


def test_every_config_is_checked():
    """The recipes (24), the two demos, the custom dataset example and the three examples (layer decay,
    RetinaNet, Mask2Former)."""
    names = {p.relative_to(ROOT / 'configs').as_posix() for p in CONFIGS}
    assert len(names) == 30 and 'custom_dataset_example.py' in names
    assert {'examples/mask_rcnn_xcit_small_12_p16_3x_coco_layer_decay.py',
            'examples/retinanet_xcit_tiny_12_p16_1x_coco.py',
            'examples/mask2former_xcit_tiny_12_p16_lsj_50e_coco.py'} <= names
    assert {'demo/mask_rcnn_xcit_tiny_12_p16_demo.py', 'demo/upernet_xcit_tiny_12_p16_demo.py'} <= names


@pytest.mark.parametrize('path', CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_agrees_with_its_preset(path):
    assert disagreements(path) == []


def test_a_disagreement_is_caught(tmp_path):
    """The check itself: a depth, a width and a URL that contradict the preset are all named."""
    config = tmp_path / 'mask_rcnn_xcit_small_12_p16_bad.py'
    config.write_text(
        f"_base_ = ['{ROOT}/configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py']\n"
        "model = dict(backbone=dict(depth=24, init_cfg=dict(checkpoint="
        "'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p8_384_dist.pth')), "
        "neck=dict(in_channels=[192] * 4))\n")
    found = disagreements(config)
    assert len(found) == 3, found
    assert found[0] == 'depth=24, the preset has 12'
    assert 'xcit_small_12_p16_384_dist.pth' in found[1] and 'neck in_channels [192' in found[2]
