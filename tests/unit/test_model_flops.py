"""Achieved FLOP/s arithmetic: the counter's multiply-adds of one shape, against a hand count, to
training FLOPs per pixel and per image; a model with a compiled backbone counted as its eager twin;
the peak table and the dtype in use."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from xcit_dense.analysis.flops import analyse
from xcit_dense.engine.telemetry.model_flops import (
    count_training_flops,
    peak_tflops,
    roi_scale,
    training_dtype,
    training_flops,
)
from xcit_dense.engine.telemetry.rank_figures_hook import image_pixels
from xcit_dense.engine.training.compile import compile_forward

pytestmark = pytest.mark.quick


def test_training_flops_of_a_convolution_match_a_hand_count():
    conv = nn.Conv2d(3, 8, 3, padding=1)
    macs = analyse(conv, torch.rand(1, 3, 16, 24)).flops
    assert macs == 8 * 3 * 3 * 3 * 16 * 24  # one multiply-add per weight and output pixel (bias not counted)
    flops = training_flops(macs, 0, (16, 24))
    assert flops.per_pixel == 2 * 3 * 216 and flops.per_image == 0  # 2 FLOPs a multiply-add, 3 forwards
    assert flops.of([100, 200]) == 1296 * 300  # scaled by each image's pixels
    with_roi = training_flops(1000, 400, (10, 10), roi_scale=0.5)  # the RoI heads per image, at the sampler's RoIs
    assert (with_roi.per_pixel, with_roi.per_image) == (36.0, 1200.0)
    assert with_roi.of([100]) == 36 * 100 + 1200


def test_the_roi_heads_scale_from_proposals_to_the_training_rois():
    model = nn.Module()
    model.roi_head = SimpleNamespace(train_cfg=dict(sampler=dict(num=512)))
    model.rpn_head = SimpleNamespace(test_cfg=dict(max_per_img=1000))
    assert roi_scale(model) == 0.512 and roi_scale(nn.Module()) == 1.0


class _Segmentor(nn.Module):
    """The least of a segmentor that the counter needs: a backbone, and a tensor forward taking samples."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, inputs: torch.Tensor, data_samples: list) -> list:
        return self.backbone(inputs)


def test_a_compiled_backbone_is_counted_as_its_eager_forward(tiny_xcit):
    """``model.backbone.compile=True``: the counter's jit trace meets the compiled wrapper, which torch
    refuses to trace before compiling anything (so no C compiler is needed here); the wrapper runs
    the eager forward while traced, and the count is the eager model's, the compile not given up."""
    model = _Segmentor(tiny_xcit(embed_dims=32, num_heads=2))
    eager = count_training_flops(model, (32, 32))
    forward = compile_forward(model.backbone)
    compiled = count_training_flops(model, (32, 32))
    assert (compiled.per_pixel, compiled.per_image) == (eager.per_pixel, eager.per_image)
    assert eager.per_pixel > 0 and not forward.failed


# (the name CUDA gives, the dtype): the peak in TFLOP/s, None where unknown
PEAKS = [
    ('NVIDIA H100 80GB HBM3', 'bf16', 989.4),
    ('NVIDIA H100 PCIe', 'bf16', 756.0),  # the entry with more words wins
    ('NVIDIA H100 NVL', 'bf16', 835.5),
    ('NVIDIA H100 NVL', 'tf32', 417.5),
    ('NVIDIA H200', 'fp16', 989.4),
    ('NVIDIA H200 NVL', 'fp32', 60.0),
    ('NVIDIA GH200 480GB', 'bf16', 989.4),
    ('NVIDIA A100-SXM4-80GB', 'tf32', 156.0),
    ('NVIDIA A100 80GB PCIe', 'bf16', 312.0),
    ('NVIDIA A10', 'fp32', 31.2),
    ('NVIDIA RTX A1000', 'bf16', None),  # no A100, nor an A10
    ('NVIDIA A10G', 'bf16', None),
    ('Tesla V100-SXM2-32GB', 'fp16', 125.0),
    ('Tesla V100-SXM2-32GB', 'bf16', None),  # no bf16 on a V100
    ('Some GPU', 'fp32', None),
]
# a MIG slice (name, its multiprocessors, dtype): the part's peak times its share of the multiprocessors
MIG_PEAKS = [
    ('NVIDIA A100-SXM4-40GB MIG 1g.5gb', 14, 'bf16', 312.0 * 14 / 108),
    ('NVIDIA H100 80GB HBM3 MIG 3g.40gb', 60, 'bf16', 989.4 * 60 / 132),
    ('NVIDIA H100 NVL MIG 7g.94gb', 132, 'bf16', 835.5),
    ('NVIDIA A100-SXM4-40GB MIG 1g.5gb', None, 'bf16', None),  # its multiprocessors unknown
    ('NVIDIA L40S MIG 1g.12gb', 35, 'bf16', None),  # the whole part's unknown
]


@pytest.mark.parametrize('name, dtype, peak', PEAKS)
def test_the_peak_is_the_devices_for_the_dtype_in_use(name, dtype, peak):
    assert peak_tflops(name, dtype) == pytest.approx(peak)


@pytest.mark.parametrize('name, multiprocessors, dtype, peak', MIG_PEAKS)
def test_a_mig_slice_has_its_share_of_the_parts_peak(name, multiprocessors, dtype, peak):
    assert peak_tflops(name, dtype, multiprocessors=multiprocessors) == pytest.approx(peak)


def test_a_given_table_is_matched_by_whole_words_too():
    table = {'Some': dict(fp32=10.0), 'Some GPU': dict(fp32=20.0)}
    assert peak_tflops('Some GPU', 'fp32', table) == 20.0 and peak_tflops('Some', 'fp32', table) == 10.0
    assert peak_tflops('Somewhat', 'fp32', table) is None


def test_the_dtype_in_use():
    assert training_dtype(SimpleNamespace(cast_dtype=torch.bfloat16)) == 'bf16'
    assert training_dtype(SimpleNamespace(cast_dtype=torch.float16)) == 'fp16'
    matmul, was = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert training_dtype(SimpleNamespace()) == 'tf32'
        matmul.allow_tf32 = False
        assert training_dtype(SimpleNamespace()) == 'fp32'
    finally:
        matmul.allow_tf32 = was


def test_a_batchs_pixels_are_counted_per_image():
    assert image_pixels([torch.zeros(3, 4, 5), torch.zeros(3, 6, 2)]) == [20, 12]
    assert image_pixels(torch.zeros(2, 3, 4, 5)) == [20, 20] and image_pixels(None) == []
