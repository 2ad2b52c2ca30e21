"""One CPU training step of configs that call the mmcv ops xcit_mmcv_ext serves beyond NMS and
RoIAlign: mmdet's stock Faster R-CNN R-50 with DCNv2 (modulated deformable convolutions in stages
3-5), and the example configs with an XCiT-T12/16 backbone under RetinaNet and Mask2Former, at small
image sizes. Before these ops were served, the DCNv2 model raised NotImplementedError in its first
forward; a wrong gradient entry point leaves the offset convolutions without gradients."""
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from xcit_dense.builder import build_model

EXAMPLES = ROOT / 'configs' / 'examples'
FEW_ROIS = {'model.train_cfg.rpn_proposal.nms_pre': 200, 'model.train_cfg.rpn_proposal.max_per_img': 100,
            'model.train_cfg.rcnn.sampler.num': 64}


def det_batch() -> dict:
    """Two 128x128 / 112x128 images with two boxes and box-shaped masks each."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for h, w in ((128, 128), (112, 128)):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        boxes = torch.tensor([[10., 12., 70., 80.], [50., 40., 120., 100.]])
        masks = np.zeros((len(boxes), h, w), dtype=np.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
            mask[y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1., 1.),
                                             batch_input_shape=(128, 128), pad_shape=(128, 128)))
        sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 7]),
                                           masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def has_grad(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def train_step(config: str, options: dict) -> tuple:
    """Build (no pretrained weights), preprocess, loss, backward and one optimiser step."""
    torch.manual_seed(0)
    model = build_model(config, cfg_options=options, init=False).train()
    cfg = Config.fromfile(config)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = model.data_preprocessor(det_batch(), True)
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert torch.isfinite(loss), log_vars
    optim_wrapper.backward(loss)
    grads = {name: has_grad(module) for name, module in model.named_children()}
    optim_wrapper.step()
    return model, grads


@pytest.mark.slow
def test_stock_faster_rcnn_with_dcnv2_trains_a_step():
    """mmdet 3.3.0's own config, unchanged but for its sizes: every DCNv2 layer's weight and offset
    convolution gets a gradient (the backward's entry point writes all of them)."""
    import mmdet
    from mmcv.ops import ModulatedDeformConv2dPack
    config = Path(mmdet.__file__).parent / '.mim' / 'configs' / 'dcnv2' / 'faster-rcnn_r50-mdconv-c3-c5_fpn_1x_coco.py'
    config = str(config)
    model, grads = train_step(config, dict(FEW_ROIS, **{'model.backbone.init_cfg': None}))
    assert grads == {'data_preprocessor': False, 'backbone': True, 'neck': True, 'rpn_head': True,
                     'roi_head': True}, grads
    dcns = [m for m in model.backbone.modules() if isinstance(m, ModulatedDeformConv2dPack)]
    assert len(dcns) == 13  # the 3x3 convolutions of stages 3 (4), 4 (6) and 5 (3)
    assert all(m.weight.grad.abs().sum() > 0 and m.conv_offset.weight.grad.abs().sum() > 0 for m in dcns)


@pytest.mark.slow
def test_xcit_retinanet_example_trains_a_step():
    """configs/examples/retinanet_xcit_tiny_12_p16_1x_coco.py: backbone, neck and head learn."""
    _, grads = train_step(str(EXAMPLES / 'retinanet_xcit_tiny_12_p16_1x_coco.py'),
                          {'model.backbone.init_cfg': None})
    assert grads == {'data_preprocessor': False, 'backbone': True, 'neck': True, 'bbox_head': True}, grads


@pytest.mark.slow
def test_xcit_mask2former_example_trains_a_step():
    """configs/examples/mask2former_xcit_tiny_12_p16_lsj_50e_coco.py, padded to 128 (not the recipe's
    1024 LSJ crops), with fewer queries and decoder layers: backbone and head (pixel decoder with deformable attention,
    transformer
    decoder) learn."""
    pad = [dict(type='BatchFixedSizePad', size=(128, 128), img_pad_value=0, pad_mask=True, mask_pad_value=0,
                pad_seg=False)]
    # fewer queries, decoder layers and sampled mask points than the recipe's 100, 9 and 12544
    small = {'model.panoptic_head.num_queries': 20, 'model.panoptic_head.transformer_decoder.num_layers': 3,
             'model.train_cfg.num_points': 1024, 'model.data_preprocessor.batch_augments': pad}
    _, grads = train_step(str(EXAMPLES / 'mask2former_xcit_tiny_12_p16_lsj_50e_coco.py'),
                          dict(small, **{'model.backbone.init_cfg': None}))
    assert grads['backbone'] and grads['panoptic_head'], grads
