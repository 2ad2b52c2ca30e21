"""xcit_mmcv_ext's RoIAlign (mmcv 2.1.0's ``roi_align_forward``/``roi_align_backward``, average
pooling) through mmcv's own ``RoIAlign`` layer, against a direct PyTorch form of its bilinear
sampling written here. Planted mistakes each test catches are named in its docstring."""
import importlib
import math
import types

import pytest
import torch
from mmcv.ops import RoIAlign

from xcit_mmcv_ext import roi_align as served


@pytest.fixture(autouse=True)
def served_kernels(monkeypatch):
    """mmcv's RoIAlign calls xcit_mmcv_ext's functions, whichever mmcv._ext is installed."""
    monkeypatch.setattr(importlib.import_module('mmcv.ops.roi_align'), 'ext_module', types.SimpleNamespace(
        roi_align_forward=served.roi_align_forward, roi_align_backward=served.roi_align_backward))


def bilinear(feat: torch.Tensor, y: float, x: float) -> torch.Tensor:
    """One bilinear sample (C,) of feat (C, H, W) at (y, x), zero beyond one pixel outside."""
    height, width = feat.shape[1:]
    if y < -1 or y > height or x < -1 or x > width:
        return feat.new_zeros(feat.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * feat[:, y0, x0] + (1 - ly) * lx * feat[:, y0, x1]
            + ly * (1 - lx) * feat[:, y1, x0] + ly * lx * feat[:, y1, x1])


def oracle(feats: torch.Tensor, rois: torch.Tensor, size: tuple, scale: float, ratio: int,
           aligned: bool) -> torch.Tensor:
    """RoIAlign with average pooling, sample by sample (differentiable in feats)."""
    out = []
    shift = 0.5 if aligned else 0.0
    for roi in rois.tolist():
        feat = feats[int(roi[0])]
        x1, y1, x2, y2 = (v * scale - shift for v in roi[1:])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / size[0], roi_w / size[1]
        grid_h = ratio if ratio > 0 else math.ceil(roi_h / size[0])
        grid_w = ratio if ratio > 0 else math.ceil(roi_w / size[1])
        count = max(grid_h * grid_w, 1)
        bins = []
        for i in range(size[0]):
            for j in range(size[1]):
                total = feat.new_zeros(feat.shape[0])
                for iy in range(grid_h):
                    for ix in range(grid_w):
                        total = total + bilinear(feat, y1 + i * bin_h + (iy + 0.5) * bin_h / grid_h,
                                                 x1 + j * bin_w + (ix + 0.5) * bin_w / grid_w)
                bins.append(total / count)
        out.append(torch.stack(bins, 1).reshape(feat.shape[0], *size))
    return torch.stack(out) if out else feats.new_zeros(0, feats.shape[1], *size)


def case(dtype=torch.float32, n=6):
    """Features (2, 3, 10, 12) and RoIs at scale 0.5: inside, partly and wholly outside, zero-area."""
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 3, 10, 12, generator=gen, dtype=dtype)
    rois = torch.tensor([[0, 2.0, 3.0, 15.0, 11.0],     # inside
                         [1, -6.0, -4.0, 7.0, 5.0],     # partly outside (top left)
                         [0, 18.0, 14.0, 30.0, 26.0],   # partly outside (bottom right)
                         [1, 40.0, 40.0, 52.0, 50.0],   # wholly outside
                         [0, 9.0, 7.0, 9.0, 7.0],       # zero area
                         [1, 1.3, 0.7, 22.9, 19.1]], dtype=dtype)[:n]
    return feats, rois


@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('ratio', [0, 2])
def test_outputs_and_gradients_match_the_oracle(aligned, ratio):
    """Planted: aligned's half-pixel shift dropped, the sampling ratio ignored (always adaptive),
    or the backward's result not written into mmcv's grad_input: each fails here."""
    feats, rois = case()
    size = (3, 4)
    x = feats.clone().requires_grad_()
    out = RoIAlign(size, 0.5, ratio, aligned=aligned)(x, rois)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out)
    ref_x = feats.double().requires_grad_()
    ref = oracle(ref_x, rois.double(), size, 0.5, ratio, aligned)
    ref.backward(grad_out.double())
    assert out.dtype == torch.float32 and ref.abs().sum() > 0
    torch.testing.assert_close(out, ref.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad.float(), rtol=0, atol=1e-5)
    assert out[3].abs().sum() == 0  # the RoI wholly outside


def test_no_rois_gives_empty_outputs_and_zero_gradients():
    """Pins the empty case mmdet reaches (an image without proposals); no planted mistake found
    that only this test catches."""
    feats, rois = case()
    x = feats.clone().requires_grad_()
    out = RoIAlign(7, 0.5, 0)(x, rois[:0])
    assert out.shape == (0, 3, 7, 7)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(feats))


@pytest.mark.parametrize('aligned', [True, False])
def test_gradcheck_in_float64(aligned):
    """Planted: a backward sending gradients to the wrong pixels, or scaled wrongly (e.g. not
    divided by the sample count) fails gradcheck."""
    feats, rois = case(torch.float64)
    x = feats[:, :2, :6, :7].clone().requires_grad_()
    layer = RoIAlign((2, 3), 0.5, 2, aligned=aligned)
    assert torch.autograd.gradcheck(lambda inp: layer(inp, rois[[0, 1, 5]] * 0.6), (x,))


def test_channels_last_features_are_read_as_their_values():
    """mmcv's kernel read a channels_last map's memory as NCHW. Planted: passing the input's
    storage through without making it contiguous would give other values here."""
    feats, rois = case()
    layer = RoIAlign((3, 4), 0.5, 2)
    torch.testing.assert_close(layer(feats.to(memory_format=torch.channels_last), rois), layer(feats, rois),
                               rtol=0, atol=0)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('autocast', [False, True])
def test_half_precision_computes_in_float32_forward_and_backward(dtype, autocast):
    """fp16/bf16 features: the output and the input gradient in that dtype, each the float32
    result rounded once (under CPU autocast too). Planted: no float32 upcast (torchvision's CPU
    kernels refuse bf16) or a backward in the half dtype fails here."""
    feats, rois = case(dtype)
    x = feats.clone().requires_grad_()
    with torch.autocast('cpu', dtype=dtype, enabled=autocast):
        out = RoIAlign((3, 4), 0.5, 2)(x, rois)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(grad_out)
    ref_x = feats.float().requires_grad_()
    ref = oracle(ref_x, rois.float(), (3, 4), 0.5, 2, True)
    ref.backward(grad_out.float())
    assert out.dtype == dtype and x.grad.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=eps, atol=1e-6)
    torch.testing.assert_close(x.grad.float(), ref_x.grad.to(dtype).float(), rtol=eps, atol=1e-6)


def test_max_pooling_is_refused_by_name():
    """Planted: max pooling served by the average kernel would give values instead of this error."""
    feats, rois = case()
    with pytest.raises(NotImplementedError, match=r"roi_align_forward' with max pooling.*XCIT_MMCV=compiled"):
        RoIAlign(2, 0.5, 2, pool_mode='max')(feats, rois)


def test_deterministic_mode_alerts_for_the_cuda_backward():
    """Planted: an alert that ignores the flag (silent non-determinism) or fires on CPUs."""
    cuda, cpu = torch.device('cuda'), torch.device('cpu')
    served.alert_nondeterministic(cuda)  # flag off: nothing
    try:
        torch.use_deterministic_algorithms(True)
        served.alert_nondeterministic(cpu)
        with pytest.raises(RuntimeError, match='roi_align_backward.*deterministic'):
            served.alert_nondeterministic(cuda)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match='roi_align_backward'):
            served.alert_nondeterministic(cuda)
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_backward_writes_into_a_grad_input_that_is_a_view():
    """mmcv hands a fresh tensor, whose storage the backward takes over (no copy); a view into a
    larger tensor is written in place. Planted: taking over every grad_input's storage."""
    feats, rois = case()
    grad_out = torch.randn(len(rois), 3, 3, 4, generator=torch.Generator().manual_seed(1))
    args = (3, 4, 0.5, 2, served.AVG_POOL, True)
    own = torch.zeros(2, 3, 10, 12)
    served.roi_align_backward(grad_out, rois, None, None, own, *args)
    larger = torch.zeros(3, 2, 3, 10, 12)
    served.roi_align_backward(grad_out, rois, None, None, larger[1], *args)
    assert own.abs().sum() > 0 and torch.equal(larger[1], own) and not larger[[0, 2]].any()
