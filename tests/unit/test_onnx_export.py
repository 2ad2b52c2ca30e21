"""ONNX export: onnxruntime matches PyTorch to 1e-4, the backbone and the segmentors at sizes other than the
traced one."""
import json

import onnx
import pytest
import torch
from helpers import ROOT, randomize_, run_tool_in_process

from xcit_dense.analysis.onnx_export import (
    BACKBONE_OUTPUTS,
    SEGMENTOR_OUTPUTS,
    BinMeanPool,
    SegmentorForward,
    TensorForward,
    check_segmentation,
    dynamic_size_copy,
    export,
    max_abs_error,
    onnx_outputs,
)
from xcit_dense.builder import build_model

TINY = {'model.backbone.embed_dims': 64, 'model.backbone.depth': 4, 'model.backbone.num_heads': 4,
        'model.backbone.out_indices': (0, 1, 2, 3), 'model.neck.in_channels': [64] * 4,
        'model.backbone.init_cfg': None}


def test_backbone_with_dynamic_size(tmp_path, tiny_xcit):
    backbone = randomize_(tiny_xcit(fast_layers=False)).eval()
    path = str(tmp_path / 'backbone.onnx')
    export(backbone, path, (64, 96), BACKBONE_OUTPUTS)
    for shape in ((64, 96), (100, 70)):  # traced size, then one not divisible by 32
        assert max_abs_error(path, backbone, torch.rand(1, 3, *shape)) < 1e-4


def test_segmentor_tensor_forward(tmp_path):
    model = randomize_(build_model('configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py', TINY)).eval()
    path = str(tmp_path / 'segmentor.onnx')
    export(TensorForward(model), path, (64, 64), ['logits'], dynamic=False)
    assert max_abs_error(path, TensorForward(model), torch.rand(1, 3, 64, 64)) < 1e-4


@pytest.mark.quick
def test_bin_means_equal_the_adaptive_pool_at_any_size():
    """UperNet's pyramid pooling as exported: the same bins as nn.AdaptiveAvgPool2d, sides shorter than
    the grid included (bins then overlap)."""
    for rows, cols in ((1, 1), (2, 3), (6, 6)):
        for size in ((1, 1), (2, 5), (7, 13), (32, 17)):
            x = torch.randn(2, 3, *size)
            expected = torch.nn.AdaptiveAvgPool2d((rows, cols))(x)
            torch.testing.assert_close(BinMeanPool(rows, cols)(x), expected, rtol=0, atol=1e-6)


def test_mmseg_layers_that_fix_the_size_export_for_any_size_as_copied(tmp_path):
    """mmseg's Upsample and an adaptive pool, exported through ``dynamic_size_copy``, equal the layers as
    built at other sizes (exported as built: 2e-2 off at 45x33; the pool alone as built, onnxruntime
    refuses its graph there: "Gather ... indices element out of data bounds")."""
    from mmseg.models.utils import Upsample
    layers = torch.nn.Sequential(Upsample(scale_factor=2, mode='bilinear'), torch.nn.AdaptiveAvgPool2d(6)).eval()
    path = str(tmp_path / 'layers.onnx')
    export(dynamic_size_copy(layers), path, (32, 48), ['out'])
    for shape in ((32, 48), (45, 33)):
        assert max_abs_error(path, layers, torch.rand(1, 3, *shape)) < 1e-5


@pytest.mark.slow  # two exports of 180-250 s each on 2 busy cores (2026-12-05)
@pytest.mark.parametrize('config', ['configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py',
                                    'configs/xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py'])
def test_segmentor_with_dynamic_size(tmp_path, config):
    """One file for every size: logits within 1e-4 and the same label map as the model as built (not the
    export's copy), at the traced size and at two others, one not divisible by 32 (exported as built,
    mmseg's Upsample puts the traced size into the graph: a Semantic FPN 4e-3 off at other sizes)."""
    options = {**TINY, 'model.backbone.fast_layers': False}
    if 'upernet' in config:
        del options['model.neck.in_channels']
        options.update({'model.decode_head.in_channels': [64] * 4, 'model.decode_head.channels': 32,
                        'model.auxiliary_head.in_channels': 64})
    model = randomize_(build_model(config, options)).eval()
    path = str(tmp_path / 'segmentor.onnx')
    export(SegmentorForward(dynamic_size_copy(model)), path, (64, 96), SEGMENTOR_OUTPUTS)
    for shape in ((64, 96), (100, 70), (128, 160)):
        image = torch.rand(1, 3, *shape)
        logits, labels = onnx_outputs(path, image)
        with torch.no_grad():
            expected_logits, expected_labels = SegmentorForward(model)(image)
        assert labels.shape == (1, *shape)
        assert abs(logits - expected_logits.numpy()).max() < 1e-4, shape
        assert (labels == expected_labels.numpy()).mean() == 1, shape


@pytest.mark.slow  # an export of its own (about 20 s); the main stage checks the quiet build below
def test_the_export_tool_says_its_weights_are_random_and_logs_no_initialisation(tmp_path):
    """docs/analysis.md's first ONNX command: two result lines, not MMEngine's per-parameter init log."""
    out, config = tmp_path / 'backbone.onnx', tmp_path / 'tiny.py'
    config.write_text(f"_base_ = {str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')!r}\n"
                      'model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)), '
                      'neck=dict(in_channels=[64] * 4))\n')
    proc = run_tool_in_process('tools/export_onnx.py', config, out, '--shape', '64', '64', '--check', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'wrote {out} (random weights: no --checkpoint given)' in proc.stdout
    assert 'largest difference onnxruntime vs PyTorch' in proc.stdout
    assert 'init_weights' not in proc.stdout and 'Init' not in proc.stdout, proc.stdout[:2000]
    assert len(proc.stdout.splitlines()) <= 3, proc.stdout[:2000]  # (the SyncBN note, the two results)


@pytest.mark.slow  # an export of its own (about 30-100 s)
def test_the_export_tool_checks_a_segmentor_on_images(tmp_path, seg_data):
    """--whole --check --images: each image's pixel agreement and logits difference, all within the
    tolerances (exit status 0); the file's metadata names the classes and the test resize; the same
    comparison against another model's weights is beyond them."""
    out, config = tmp_path / 'segmentor.onnx', tmp_path / 'tiny.py'
    config.write_text(f"_base_ = {str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')!r}\n"
                      'model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)), '
                      'neck=dict(in_channels=[64] * 4))\n')
    images = seg_data / 'images' / 'validation'
    proc = run_tool_in_process('tools/export_onnx.py', config, out, '--whole', '--shape', '64', '64', '--check',
                               '--images', images, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(f'{images}/') and 'pixels agreeing' in line]
    assert len(lines) == 4 and '4 of 4 images within tolerance' in proc.stdout, proc.stdout[-3000:]
    assert 'BEYOND' not in proc.stdout
    meta = {p.key: json.loads(p.value) for p in onnx.load(str(out)).metadata_props}
    assert len(meta['classes']) == len(meta['palette']) == 150 and meta['scale'] == [2048, 512], meta
    other = randomize_(build_model(str(config), {'model.backbone.fast_layers': False,
                                                 'model.backbone.init_cfg': None}), seed=1)
    rows = check_segmentation(str(out), SegmentorForward(other), sorted(map(str, images.iterdir())))
    assert len(rows) == 4 and not any(row['within'] for row in rows), rows


def test_a_model_built_with_its_initialisation_logs_none_of_it(capsys):
    """MMEngine's init_weights logs each parameter's initialisation (1,402 lines for a Semantic FPN);
    built outside a Runner (the export, FLOP and attention tools) the model logs none of it."""
    build_model('configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py', TINY)
    out = capsys.readouterr().out
    assert 'Init' not in out and 'init_weights' not in out and len(out.splitlines()) <= 2, out[:2000]
