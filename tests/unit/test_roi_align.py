"""CpuFastRoIAlign (torchvision's forward kernel on a CPU, mmcv's backward) gives mmcv's RoIAlign
outputs and input gradients, and the Mask R-CNN configs' RoI extractors use it."""
import pytest
import torch
from mmcv.ops import RoIAlign

from helpers import ROOT
from xcit_dense.builder import build_model
from xcit_dense.models.roi_align import CpuFastRoIAlign


@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('sampling_ratio', [0, 2])
@pytest.mark.parametrize('output_size', [7, (14, 12)])
def test_same_outputs_and_gradients_as_mmcv(aligned, sampling_ratio, output_size):
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 8, 24, 32, generator=gen)
    xy = torch.rand(40, 2, generator=gen) * torch.tensor([120., 90.])
    wh = torch.rand(40, 2, generator=gen) * 40 + 0.5
    rois = torch.cat([torch.randint(0, 2, (40, 1), generator=gen).float(), xy, xy + wh], 1)
    results = []
    for layer in (RoIAlign(output_size, 0.25, sampling_ratio, aligned=aligned),
                  CpuFastRoIAlign(output_size, 0.25, sampling_ratio, aligned=aligned)):
        x = feats.clone().requires_grad_()
        out = layer(x, rois)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
        results.append((out.detach(), x.grad))
    (out, grad), (fast_out, fast_grad) = results
    assert out.abs().sum() > 0
    torch.testing.assert_close(fast_out, out, rtol=0, atol=1e-6)
    torch.testing.assert_close(fast_grad, grad, rtol=0, atol=1e-6)


def test_mask_rcnn_configs_extract_with_it():
    model = build_model(str(ROOT / 'configs/xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py'),
                        {'model.backbone.init_cfg': None}, init=False)
    for extractor in (model.roi_head.bbox_roi_extractor, model.roi_head.mask_roi_extractor):
        assert all(type(layer) is CpuFastRoIAlign for layer in extractor.roi_layers)
