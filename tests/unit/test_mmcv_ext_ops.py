"""The ops xcit_mmcv_ext serves beyond NMS and RoIAlign, through mmcv 2.1.0's own Python layers and
functions, on the CPU: deformable convolutions (DCN, DCNv2), MaskedConv2d, RoIPool, the focal losses,
bbox_overlaps and multi-scale deformable attention.

Expected values adapted from mmcv 2.1.0's tests (github.com/open-mmlab/mmcv, tag v2.1.0,
tests/test_ops/test_deform_conv.py, test_modulated_deform_conv.py, test_roi_pool.py,
test_focal_loss.py, test_bbox.py, test_ms_deformable_attn.py); mmcv ran most of them on CUDA only,
here they run on the CPU. Gradients are checked with ``torch.autograd.gradcheck`` in float64, sampling
positions kept away from whole pixels (where bilinear sampling has kinks). The planted mistake each
test catches is named in its docstring."""
import importlib

import pytest
import torch
import torchvision
from torch.autograd import gradcheck

from xcit_mmcv_ext import ext_module

OP_MODULES = ('deform_conv', 'modulated_deform_conv', 'masked_conv', 'roi_pool', 'focal_loss', 'bbox',
              'multi_scale_deform_attn')


@pytest.fixture(autouse=True)
def served_kernels(monkeypatch):
    """mmcv's layers call xcit_mmcv_ext's functions, whichever mmcv._ext is installed."""
    for name in OP_MODULES:
        monkeypatch.setattr(importlib.import_module(f'mmcv.ops.{name}'), 'ext_module', ext_module)


# mmcv 2.1.0 tests/test_ops/test_deform_conv.py
DCN_INPUT = [[[[1., 2., 3.], [0., 1., 2.], [3., 5., 2.]]]]
DCN_OFFSET_WEIGHT = [[[0.1, 0.4, 0.6, 0.1]], [[0.3, 0.2, 0.1, 0.3]], [[0.5, 0.5, 0.2, 0.8]],
                     [[0.8, 0.3, 0.9, 0.1]], [[0.3, 0.1, 0.2, 0.5]], [[0.3, 0.7, 0.5, 0.3]],
                     [[0.6, 0.2, 0.5, 0.3]], [[0.4, 0.1, 0.8, 0.4]]]
DCN_OFFSET_BIAS = [0.7, 0.1, 0.8, 0.5, 0.6, 0.5, 0.4, 0.7]
DCN_WEIGHT = [[[0.4, 0.2, 0.1, 0.9]]]
DCN_OUT = [[[[1.650, 0.], [0.000, 0.]]]]
DCN_X_GRAD = [[[[-0.666, 0.204, 0.000], [0.030, -0.416, 0.012], [0.000, 0.252, 0.129]]]]
DCN_OFFSET_WEIGHT_GRAD = [[[[1.44, 2.88], [0.00, 1.44]]], [[[-0.72, -1.44], [0.00, -0.72]]],
                          [[[0.00, 0.00], [0.00, 0.00]]], [[[0.00, 0.00], [0.00, 0.00]]],
                          [[[-0.10, -0.20], [0.00, -0.10]]], [[[-0.08, -0.16], [0.00, -0.08]]],
                          [[[-0.54, -1.08], [0.00, -0.54]]], [[[-0.54, -1.08], [0.00, -0.54]]]]
DCN_OFFSET_BIAS_GRAD = [1.44, -0.72, 0., 0., -0.10, -0.08, -0.54, -0.54]
DCN_WEIGHT_GRAD = [[[[3.62, 0.], [0.40, 0.18]]]]


@pytest.mark.quick
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_deform_conv_matches_mmcv_values_in_chunks_of_im2col_step(dtype):
    """mmcv's DeformConv2dPack, batch 10 in chunks of 2. Planted: offsets read as (x, y), a chunk
    written to the wrong samples, the weight's gradient of one chunk only, or the input's gradient
    not written."""
    from mmcv.ops import DeformConv2dPack
    batch = 10
    x = torch.tensor(DCN_INPUT, dtype=dtype).repeat(batch, 1, 1, 1).requires_grad_()
    model = DeformConv2dPack(1, 1, kernel_size=2, stride=1, padding=0, im2col_step=2)
    model.conv_offset.weight.data = torch.tensor(DCN_OFFSET_WEIGHT).reshape(8, 1, 2, 2)
    model.conv_offset.bias.data = torch.tensor(DCN_OFFSET_BIAS)
    model.weight.data = torch.tensor(DCN_WEIGHT).reshape(1, 1, 2, 2)
    model.type(dtype)
    out = model(x)
    out.backward(torch.ones_like(out))
    close = dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out, torch.tensor(DCN_OUT, dtype=dtype).repeat(batch, 1, 1, 1), **close)
    torch.testing.assert_close(x.grad, torch.tensor(DCN_X_GRAD, dtype=dtype).repeat(batch, 1, 1, 1), **close)
    torch.testing.assert_close(model.conv_offset.weight.grad / batch,
                               torch.tensor(DCN_OFFSET_WEIGHT_GRAD, dtype=dtype), **close)
    torch.testing.assert_close(model.conv_offset.bias.grad / batch, torch.tensor(DCN_OFFSET_BIAS_GRAD, dtype=dtype),
                               **close)
    torch.testing.assert_close(model.weight.grad / batch, torch.tensor(DCN_WEIGHT_GRAD, dtype=dtype), **close)


# mmcv 2.1.0 tests/test_ops/test_modulated_deform_conv.py
MDCN_INPUT = [[[[1., 2., 3.], [1., 2., 3.], [1., 2., 3.]]]]
MDCN_OUT = [[[[0.5, 1.5, 2.5, 1.5], [1.0, 3.0, 5.0, 3.0], [1.0, 3.0, 5.0, 3.0], [0.5, 1.5, 2.5, 1.5]]]]
MDCN_INPUT_GRAD = [[[[2., 2., 2.], [2., 2., 2.], [2., 2., 2.]]]]
MDCN_W_GRAD = [[[[9., 9.], [9., 9.]]]]
MDCN_OFFSET_W_GRAD = [[[[-7.0, -4.0], [0.0, 0.0]]], [[[-9.0, 7.5], [-6.0, 5.0]]], [[[-4.0, -7.0], [0.0, 0.0]]],
                      [[[-7.5, -9.0], [-5.0, -6.0]]], [[[-7.0, -4.0], [-7.0, -4.0]]], [[[-6.0, 5.0], [-9.0, 7.5]]],
                      [[[-4.0, -7.0], [-4.0, -7.0]]], [[[-5.0, -6.0], [-7.5, -9.0]]], [[[10.5, 6.0], [7.0, 4.0]]],
                      [[[6.0, 10.5], [4.0, 7.0]]], [[[7.0, 4.0], [10.5, 6.0]]], [[[4.0, 7.0], [6.0, 10.5]]]]
MDCN_OFFSET_B_GRAD = [-3.0, -1.5, -3.0, -1.5, -3.0, -1.5, -3.0, -1.5, 4.5, 4.5, 4.5, 4.5]


@pytest.mark.quick
def test_modulated_deform_conv_matches_mmcv_values():
    """mmcv's ModulatedDeformConv2dPack (zero-initialised offsets and masks of 0.5). Planted: the mask
    ignored, or its gradient or the offset's not written."""
    from mmcv.ops import ModulatedDeformConv2dPack
    x = torch.tensor(MDCN_INPUT, requires_grad=True)
    dcn = ModulatedDeformConv2dPack(1, 1, kernel_size=(2, 2), stride=1, padding=1, deform_groups=1, bias=False)
    dcn.weight.data.fill_(1.)
    out = dcn(x)
    out.sum().backward()
    close = dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out, torch.tensor(MDCN_OUT), **close)
    torch.testing.assert_close(x.grad, torch.tensor(MDCN_INPUT_GRAD), **close)
    torch.testing.assert_close(dcn.weight.grad, torch.tensor(MDCN_W_GRAD), **close)
    torch.testing.assert_close(dcn.conv_offset.weight.grad, torch.tensor(MDCN_OFFSET_W_GRAD), **close)
    torch.testing.assert_close(dcn.conv_offset.bias.grad, torch.tensor(MDCN_OFFSET_B_GRAD), **close)


def fractional_offsets(shape: tuple, generator: torch.Generator) -> torch.Tensor:
    """Offsets whose fractional part is in [0.2, 0.8]: no sample lands near a whole pixel."""
    whole = torch.randint(-1, 2, shape, generator=generator).double()
    return whole + 0.2 + 0.6 * torch.rand(shape, generator=generator, dtype=torch.float64)


@pytest.mark.quick
def test_deformable_convolutions_gradcheck_in_float64():
    """Every gradient mmcv's backward entry points return, against finite differences: DCN with two
    groups and two deformable groups in chunks of one sample, DCNv2 with a bias. Planted: the offset's
    gradient swapped between x and y, or ``scale`` not applied."""
    from mmcv.ops import deform_conv2d, modulated_deform_conv2d
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    offset = fractional_offsets((2, 2 * 2 * 4, 3, 3), g).requires_grad_()
    assert gradcheck(lambda a, o, w: deform_conv2d(a, o, w, 1, 0, 1, 2, 2, False, 1), (x, offset, weight),
                     fast_mode=True)
    mask = (0.1 + 0.8 * torch.rand(2, 2 * 4, 3, 3, generator=g, dtype=torch.float64)).requires_grad_()
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda a, o, m, w, b: modulated_deform_conv2d(a, o, m, w, b, 1, 0, 1, 2, 2),
                     (x, offset, mask, weight, bias), fast_mode=True)


@pytest.mark.quick
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32_and_rounded_once(dtype):
    """DCNv2 and the sigmoid focal loss in half precision equal their float32 results rounded once.
    Planted: the kernels run in the half dtype (or torchvision's half kernel), rounding per step."""
    from mmcv.ops import modulated_deform_conv2d, sigmoid_focal_loss
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, 6, 6, generator=g).to(dtype)
    offset = fractional_offsets((1, 18, 6, 6), g).to(dtype)
    mask = torch.rand(1, 9, 6, 6, generator=g).to(dtype)
    weight = torch.randn(8, 8, 3, 3, generator=g).to(dtype)
    out = modulated_deform_conv2d(x, offset, mask, weight, None, 1, 1, 1, 1, 1)
    expected = torchvision.ops.deform_conv2d(x.float(), offset.float(), weight.float(), padding=1, mask=mask.float())
    assert out.dtype == dtype and torch.equal(out, expected.to(dtype))
    logits = torch.randn(64, 5, generator=g).to(dtype)
    target = torch.randint(0, 6, (64,), generator=g)
    loss = sigmoid_focal_loss(logits, target, 2.0, 0.25, None, 'none')
    assert torch.equal(loss, sigmoid_focal_loss(logits.float(), target, 2.0, 0.25, None, 'none').to(dtype))


@pytest.mark.quick
def test_masked_conv2d_is_the_convolution_at_the_masked_positions_and_zero_elsewhere():
    """mmcv's MaskedConv2d (guided anchoring; mmcv tests it on CUDA against stored outputs) against
    the dense convolution, masked. Planted: the window's rows and columns swapped, or the padding
    taken on the wrong side."""
    from mmcv.ops import MaskedConv2d
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 9, 7, generator=g)
    mask = (torch.rand(1, 9, 7, generator=g) > 0.6).float()
    conv = MaskedConv2d(3, 4, 3, 1, 1)
    dense = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1)
    torch.testing.assert_close(conv(x, mask), dense * mask[:, None], atol=1e-5, rtol=1e-5)
    assert torch.equal(conv(x, torch.zeros_like(mask)), torch.zeros(1, 4, 9, 7))


# mmcv 2.1.0 tests/test_ops/test_roi_pool.py
ROI_POOL_CASES = [
    ([[[[1., 2.], [3., 4.]]]], [[0., 0., 0., 1., 1.]], [[[[1., 2.], [3., 4.]]]], [[[[1., 1.], [1., 1.]]]]),
    ([[[[1., 2.], [3., 4.]], [[4., 3.], [2., 1.]]]], [[0., 0., 0., 1., 1.]],
     [[[[1., 2.], [3., 4.]], [[4., 3.], [2., 1.]]]], [[[[1., 1.], [1., 1.]], [[1., 1.], [1., 1.]]]]),
    ([[[[1., 2., 5., 6.], [3., 4., 7., 8.], [9., 10., 13., 14.], [11., 12., 15., 16.]]]], [[0., 0., 0., 3., 3.]],
     [[[[4., 8.], [12., 16.]]]], [[[[0., 0., 0., 0.], [0., 1., 0., 1.], [0., 0., 0., 0.], [0., 1., 0., 1.]]]]),
]


@pytest.mark.quick
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.float16])
def test_roi_pool_matches_mmcv_values(dtype):
    """mmcv's values (tested there on CUDA only). Planted: a gradient written instead of added."""
    from mmcv.ops import roi_pool
    for feats, rois, expected, grad in ROI_POOL_CASES:
        x = torch.tensor(feats, dtype=dtype, requires_grad=True)
        out = roi_pool(x, torch.tensor(rois, dtype=dtype), (2, 2), 1.0)
        out.backward(torch.ones_like(out))
        assert torch.equal(out, torch.tensor(expected, dtype=dtype))
        assert torch.equal(x.grad, torch.tensor(grad, dtype=dtype))


def mmcv_roi_pool(feats: torch.Tensor, rois: torch.Tensor, size: tuple, scale: float) -> tuple:
    """mmcv 2.1.0's CUDA kernel (roi_pool_cuda_kernel.cuh) written out loop by loop in float32."""
    import math
    out = torch.zeros(len(rois), feats.size(1), *size)
    argmax = torch.zeros(out.shape, dtype=torch.int32)
    height, width = feats.shape[2:]
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        x1, y1 = f32(x1) * f32(scale), f32(y1) * f32(scale)
        roi_w, roi_h = (f32(x2) + 1) * f32(scale) - x1, (f32(y2) + 1) * f32(scale) - y1
        if roi_w <= 0 or roi_h <= 0:
            continue
        bin_w, bin_h = roi_w / size[1], roi_h / size[0]
        for c in range(feats.size(1)):
            for ph in range(size[0]):
                for pw in range(size[1]):
                    w0 = min(max(math.floor(pw * bin_w + x1), 0), width)
                    h0 = min(max(math.floor(ph * bin_h + y1), 0), height)
                    w1 = min(max(math.ceil((pw + 1) * bin_w + x1), 0), width)
                    h1 = min(max(math.ceil((ph + 1) * bin_h + y1), 0), height)
                    best, where = (0.0, -1) if h1 <= h0 or w1 <= w0 else (-torch.finfo().max, -1)
                    for h in range(h0, h1):
                        for w in range(w0, w1):
                            if feats[int(b), c, h, w] > best:
                                best, where = float(feats[int(b), c, h, w]), h * width + w
                    out[k, c, ph, pw], argmax[k, c, ph, pw] = best, where
    return out, argmax


@pytest.mark.quick
def test_roi_pool_rounds_as_mmcv_not_as_torchvision():
    """RoIs at fractional coordinates, scaled by 1/4, some half outside the map or empty, against
    mmcv's kernel written out; torchvision's roi_pool (rounded corners) gives other maxima here.
    Planted: torchvision's rounding, the far corner without its +1, or the argmax in column-major order."""
    from xcit_mmcv_ext.roi_pool import roi_pool_forward
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(2, 3, 7, 9, generator=g)
    feats[0, 0, 2, 3:5] = 5.0  # a tie: the first in row-major order wins
    rois = torch.tensor([[0, 1.3, 2.6, 20.9, 17.2], [1, -6.0, 3.1, 9.7, 40.0], [1, 30.5, 25.2, 33.0, 26.0],
                         [0, 10.0, 10.0, 4.0, 4.0], [0, 5.5, 1.25, 30.75, 26.5]])
    out = torch.full((5, 3, 3, 3), 7.0)
    argmax = torch.full(out.shape, 9, dtype=torch.int32)
    roi_pool_forward(feats, rois, out, argmax, 3, 3, 0.25)
    expected, expected_argmax = mmcv_roi_pool(feats, rois, (3, 3), 0.25)
    kept = [0, 1, 2, 4]  # RoI 3 has a negative size: left as handed in
    torch.testing.assert_close(out[kept], expected[kept], rtol=0, atol=0)
    assert torch.equal(argmax[kept], expected_argmax[kept]) and (argmax[3] == 9).all() and (out[3] == 7).all()
    assert not torch.equal(torchvision.ops.roi_pool(feats, rois, 3, 0.25)[kept], expected[kept])


@pytest.mark.quick
def test_roi_pool_gradcheck_in_float64():
    """The backward adds each output's gradient at its argmax (distinct values: no ties).
    Planted: the gradient added at the argmax of another channel or image."""
    from mmcv.ops import roi_pool
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 1, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[1, 0.5, 0.5, 3.2, 4.1], [0, 1.0, 0.0, 4.0, 3.5]], dtype=torch.float64)
    assert gradcheck(lambda a: roi_pool(a, rois, (2, 3), 1.0), (x,), fast_mode=True)


# mmcv 2.1.0 tests/test_ops/test_focal_loss.py
FOCAL_INPUTS = [([[1., 0], [0, 1.]], [0, 1]), ([[1., 0, -1.], [0, 1., 2.]], [2, 1]),
                ([[1e-6, 2e-6, 3e-6], [4e-6, 5e-5, 6e-4], [7e-3, 8e-2, 9e-1]], [1, 2, 0])]
SOFTMAX_OUTPUTS = [(0.00566451, [[-0.00657264, 0.00657264], [0.00657264, -0.00657264]]),
                   (0.34956908, [[0.10165970, 0.03739851, -0.13905823], [0.01227554, -0.10298023, 0.09070466]]),
                   (0.15754992, [[0.02590877, -0.05181759, 0.02590882], [0.02589641, 0.02589760, -0.05179400],
                                 [-0.07307514, 0.02234372, 0.05073142]])]
SIGMOID_OUTPUTS = [(0.13562961, [[-0.00657264, 0.11185755], [0.11185755, -0.00657264]]),
                   (1.10251057, [[0.28808805, 0.11185755, -0.09602935], [0.11185755, -0.00657264, 0.40376765]]),
                   (0.42287254, [[0.07457182, -0.02485716, 0.07457201], [0.07457211, 0.07457669, -0.02483728],
                                 [-0.02462499, 0.08277918, 0.18050370]])]


@pytest.mark.quick
@pytest.mark.parametrize('kind', ['sigmoid', 'softmax'])
def test_focal_losses_match_mmcv_values(kind):
    """mmcv's values (its softmax focal loss tested there on CUDA only). Planted: alpha on the wrong
    term, or the softmax backward without its per-sample factor."""
    from mmcv.ops import sigmoid_focal_loss, softmax_focal_loss
    loss_fn = sigmoid_focal_loss if kind == 'sigmoid' else softmax_focal_loss
    for (logits, target), (loss_value, grad) in zip(FOCAL_INPUTS,
                                                   SIGMOID_OUTPUTS if kind == 'sigmoid' else SOFTMAX_OUTPUTS):
        x = torch.tensor(logits, requires_grad=True)
        loss = loss_fn(x, torch.tensor(target), 2.0, 0.25, None, 'mean')
        loss.backward()
        torch.testing.assert_close(loss, torch.tensor(loss_value), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(x.grad, torch.tensor(grad), atol=1e-5, rtol=1e-4)


@pytest.mark.quick
def test_focal_losses_gradcheck_in_float64_with_class_weights_and_background():
    """Both backward kernels against finite differences, with class weights, background targets
    (sigmoid: the number of classes) and an ignored one (softmax: -1). Planted: the weight applied
    in the forward only, or an ignored sample given a gradient."""
    from mmcv.ops import sigmoid_focal_loss, softmax_focal_loss
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(4, generator=g, dtype=torch.float64) + 0.5
    assert gradcheck(lambda a: sigmoid_focal_loss(a, torch.tensor([0, 4, 2, 4, 1, 3]), 2.0, 0.25, None, 'sum'),
                     (x,), fast_mode=True)
    assert gradcheck(lambda a: sigmoid_focal_loss(a, torch.tensor([0, 3, 2, 1, 1, 3]), 1.5, 0.3, weight, 'mean'),
                     (x,), fast_mode=True)
    target = torch.tensor([0, -1, 2, 3, 1, 3])
    assert gradcheck(lambda a: softmax_focal_loss(a, target, 2.0, 0.25, weight, 'sum'), (x,), fast_mode=True)
    with pytest.raises(ValueError, match='background targets'):
        sigmoid_focal_loss(x, torch.tensor([0, 4, 2, 4, 1, 3]), 2.0, 0.25, weight, 'sum')


@pytest.mark.quick
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.float16])
def test_bbox_overlaps_matches_mmcv_values_and_the_definition(dtype):
    """mmcv's values (test_bbox.py), then IoU and IoF of every pair and aligned, offset 0 and 1,
    against the definition. Planted: IoF divided by the second box, or offset left out of the
    intersection."""
    from mmcv.ops import bbox_overlaps
    b1 = torch.tensor([[1.0, 1.0, 3.0, 4.0], [2.0, 2.0, 3.0, 4.0], [7.0, 7.0, 8.0, 8.0]], dtype=dtype)
    b2 = torch.tensor([[0.0, 2.0, 2.0, 5.0], [2.0, 1.0, 3.0, 3.0]], dtype=dtype)
    close = dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(bbox_overlaps(b1, b2, offset=1),
                               torch.tensor([[0.33333334, 0.5], [0.2, 0.5], [0.0, 0.0]], dtype=dtype), **close)
    torch.testing.assert_close(bbox_overlaps(b1[:2], b2, aligned=True, offset=1),
                               torch.tensor([0.33333334, 0.5], dtype=dtype), **close)
    g = torch.Generator().manual_seed(6)
    corners = torch.rand(7, 2, generator=g) * 20
    boxes = torch.cat([corners, corners + 1 + torch.rand(7, 2, generator=g) * 10], 1).to(dtype)
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-6, rtol=1e-6)
    for offset in (0, 1):
        for aligned, (a, b) in ((False, (boxes[:, None], boxes[None, :4])), (True, (boxes[:4], boxes[3:]))):
            iou, iof = overlaps(a.double(), b.double(), offset)
            for mode, expected in (('iou', iou), ('iof', iof)):
                got = bbox_overlaps(boxes if not aligned else boxes[:4], boxes[:4] if not aligned else boxes[3:],
                                    mode, aligned, offset)
                torch.testing.assert_close(got.double(), expected, **tol)


def overlaps(a: torch.Tensor, b: torch.Tensor, offset: int) -> tuple:
    """IoU and IoF by their definition (broadcast)."""
    width = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0]) + offset).clamp(min=0)
    height = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1]) + offset).clamp(min=0)
    area = lambda box: (box[..., 2] - box[..., 0] + offset) * (box[..., 3] - box[..., 1] + offset)  # noqa: E731
    inter = width * height
    return inter / (area(a) + area(b) - inter), inter / area(a)


def deformable_attention_inputs(dtype: torch.dtype, batch: int = 2) -> tuple:
    """mmcv's test shapes (test_ms_deformable_attn.py): 2 heads of 2 channels, 2 queries, 2 levels
    (6x4, 3x2), 2 points; locations away from each level's pixel centres."""
    shapes = torch.as_tensor([(6, 4), (3, 2)], dtype=torch.long)
    starts = torch.cat((shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]))
    g = torch.Generator().manual_seed(3)
    value = torch.rand(batch, int(shapes.prod(1).sum()), 2, 2, generator=g, dtype=dtype)
    # in pixels: a whole number plus 0.2..0.8 (centres sit at .5, where the kink is off by .5)
    cells = torch.randint(-1, 7, (batch, 2, 2, 2, 2, 2), generator=g).to(dtype)
    frac = 0.2 + 0.6 * torch.rand(cells.shape, generator=g, dtype=dtype) + 0.5
    sizes = shapes.flip(1).to(dtype)[None, None, None, :, None, :]  # (w, h) per level
    locations = ((cells + frac) / sizes).clamp(-0.5, 1.5)
    weights = torch.rand(batch, 2, 2, 2, 2, generator=g, dtype=dtype) + 1e-5
    return value, shapes, starts, locations, weights / weights.sum((-1, -2), keepdim=True)


@pytest.mark.quick
def test_ms_deform_attn_called_directly_on_cpu_matches_mmcv_pytorch_version_in_float64():
    """The ext function on CPU tensors (mmcv has no CPU kernel) against mmcv's
    multi_scale_deformable_attn_pytorch in float64, with im2col_step 1 and 2. Planted: levels
    read from the wrong start, or locations read as (y, x)."""
    from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
    value, shapes, starts, locations, weights = deformable_attention_inputs(torch.float64)
    expected = multi_scale_deformable_attn_pytorch(value, shapes, locations, weights)
    for step in (1, 2):
        out = ext_module.ms_deform_attn_forward(value, shapes, starts, locations, weights, im2col_step=step)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match='divisible by im2col_step'):
        ext_module.ms_deform_attn_forward(value[:1].repeat(3, 1, 1, 1), shapes, starts,
                                          locations[:1].repeat(3, 1, 1, 1, 1, 1), weights[:1].repeat(3, 1, 1, 1, 1), 2)


@pytest.mark.quick
def test_ms_deform_attn_function_gradcheck_in_float64():
    """mmcv's MultiScaleDeformableAttnFunction (its CUDA path) on CPU tensors: the gradients of the
    value, the locations and the weights against finite differences. Planted: a gradient written to
    one chunk only, or the location's gradient without the level's size."""
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    value, shapes, starts, locations, weights = deformable_attention_inputs(torch.float64)
    inputs = [t.requires_grad_() for t in (value, locations, weights)]
    assert gradcheck(lambda v, loc, w: MultiScaleDeformableAttnFunction.apply(v, shapes, starts, loc, w, 1), inputs,
                     fast_mode=True)
