"""ONNX export: onnxruntime matches PyTorch to 1e-4, the backbone and the segmentors at sizes other than the
traced one."""
import pytest
import torch
from helpers import ROOT, randomize_, run_tool_in_process

from xcit_dense.analysis.onnx_export import (
    BACKBONE_OUTPUTS,
    SEGMENTOR_OUTPUTS,
    BinMeanPool,
    SegmentorForward,
    TensorForward,
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


@pytest.mark.slow  # an export of its own (78-79 s on 2 busy cores, 2026-12-06)
def test_upernet_with_dynamic_size(tmp_path):
    """One file for every size: logits within 1e-6 (1e-8 measured; they are about 0.06) and the same label
    map as the model as built (not the export's copy), at the traced size and at one not divisible by 32
    (exported as built, the pyramid pooling keeps the traced size's bins: 1e-5 off at 100x70).
    tests/integration/test_infer_onnx.py exports a Semantic FPN (mmseg's Upsample) through the tool."""
    options = {**TINY, 'model.backbone.fast_layers': False, 'model.decode_head.in_channels': [64] * 4,
               'model.decode_head.channels': 32, 'model.auxiliary_head.in_channels': 64}
    del options['model.neck.in_channels']
    model = randomize_(build_model('configs/xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py', options)).eval()
    path = str(tmp_path / 'segmentor.onnx')
    export(SegmentorForward(dynamic_size_copy(model)), path, (64, 96), SEGMENTOR_OUTPUTS)
    for shape in ((64, 96), (100, 70)):
        image = torch.rand(1, 3, *shape)
        logits, labels = onnx_outputs(path, image)
        with torch.no_grad():
            expected_logits, expected_labels = SegmentorForward(model)(image)
        assert labels.shape == (1, *shape)
        assert abs(logits - expected_logits.numpy()).max() < 1e-6, shape
        assert (labels == expected_labels.numpy()).mean() == 1, shape


@pytest.mark.slow  # an export of its own (about 20 s); the main stage checks the quiet build below
def test_the_export_tool_says_its_weights_are_random_and_logs_no_initialisation(tmp_path):
    """docs/deploy.md's first command: two result lines, not MMEngine's per-parameter init log."""
    out, config = tmp_path / 'backbone.onnx', tmp_path / 'tiny.py'
    config.write_text(f"_base_ = {str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')!r}\n"
                      'model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)), '
                      'neck=dict(in_channels=[64] * 4))\n')
    proc = run_tool_in_process('tools/deployment/export_onnx.py', config, out, '--shape', '64', '64', '--check',
                               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'wrote {out} (random weights: no --checkpoint given)' in proc.stdout
    assert 'largest difference onnxruntime vs PyTorch' in proc.stdout
    assert 'init_weights' not in proc.stdout and 'Init' not in proc.stdout, proc.stdout[:2000]
    assert len(proc.stdout.splitlines()) <= 3, proc.stdout[:2000]  # (the SyncBN note, the two results)


def test_a_model_built_with_its_initialisation_logs_none_of_it(capsys):
    """MMEngine's init_weights logs each parameter's initialisation (1,402 lines for a Semantic FPN);
    built outside a Runner (the export, FLOP and attention tools) the model logs none of it."""
    build_model('configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py', TINY)
    out = capsys.readouterr().out
    assert 'Init' not in out and 'init_weights' not in out and len(out.splitlines()) <= 2, out[:2000]
