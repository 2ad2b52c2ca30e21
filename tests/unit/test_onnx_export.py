"""ONNX export: onnxruntime matches PyTorch to 1e-4, the backbone at sizes other than the traced one."""
import torch
from helpers import randomize_

from xcit_dense.analysis.onnx_export import BACKBONE_OUTPUTS, TensorForward, export, max_abs_error
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
