"""DetectorForward (xcit_dense/analysis/onnx_detector.py), the Mask R-CNN prediction written for ONNX
export, against mmdet's ``model.predict`` on the demo's detector (4 blocks, seeded initialisation: 20
detections an image, all of them different boxes of near scores) at two sizes, one not divisible by
32: the same boxes after rescaling, labels, scores, and pasted masks; the pairing of --check; the
pasting of tools/deployment/infer_onnx.py. tests/integration/test_infer_onnx.py exports one through the tool."""
from typing import List

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from xcit_dense.analysis.onnx_detector import DetectorForward, is_mask_rcnn, match_detections
from xcit_dense.builder import build_model
from xcit_launch.onnx_detection import paste_masks

DEMO = 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'
SMALL = {'model.backbone.depth': 4, 'model.backbone.out_indices': [0, 1, 2, 3], 'model.backbone.fast_layers': False}
# (resized height, width), the original image's: scale factors of 0.64 and 0.625 (per axis as mmdet keeps them)
SIZES = (((128, 128), (200, 200)), ((100, 130), (160, 208)))


@pytest.fixture(scope='module')
def detector():
    torch.manual_seed(0)
    return build_model(DEMO, SMALL).eval()


@pytest.fixture(scope='module')
def cases(detector) -> List[dict]:
    """Per image: the preprocessed (padded) batch, mmdet's prediction and the unpadded image."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for (height, width), original in SIZES:
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=gen)
        sample = DetDataSample(metainfo=dict(img_shape=(height, width), ori_shape=original,
                                             scale_factor=(width / original[1], height / original[0])))
        data = detector.data_preprocessor(dict(inputs=[image], data_samples=[sample]), False)
        with torch.no_grad():
            predicted = detector.predict(data['inputs'], data['data_samples'], rescale=True)[0].pred_instances
        out.append(dict(image=data['inputs'][:, :, :height, :width], meta=data['data_samples'][0].metainfo,
                        predicted=predicted))
    return out


def mask_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    union = (a | b).flatten(1).sum(1)
    return torch.where(union > 0, (a & b).flatten(1).sum(1) / union.clamp(min=1), 1.0)


def differences(module, cases) -> List[str]:
    """What differs between mmdet's predictions and ``module``'s, its masks pasted by mmdet's mask head
    (``predict_by_feat``: the same boxes, rescaling and threshold)."""
    found = []
    for number, case in enumerate(cases):
        expected, meta = case['predicted'], case['meta']
        with torch.no_grad():
            boxes, scores, labels, masks = module(case['image'])
        if len(boxes) != len(expected):
            found.append(f'image {number}: {len(boxes)} detections, mmdet {len(expected)}')
            continue
        scale = boxes.new_tensor(meta['scale_factor']).repeat(2)
        if not torch.equal(labels, expected.labels):
            found.append(f'image {number}: labels differ')
        if (boxes / scale - expected.bboxes).abs().max() > 1e-3:
            found.append(f'image {number}: boxes differ')
        if (scores - expected.scores).abs().max() > 1e-4:
            found.append(f'image {number}: scores differ')
        classes = module.model.roi_head.mask_head.num_classes
        pasted = module.model.roi_head.mask_head.predict_by_feat(
            mask_preds=(masks[:, None].expand(-1, classes, -1, -1),),
            results_list=[InstanceData(bboxes=boxes.clone(), labels=labels)], batch_img_metas=[meta],
            rcnn_test_cfg=module.model.roi_head.test_cfg, rescale=True, activate_map=True)[0].masks
        if len(boxes) and mask_iou(pasted, expected.masks).min() < 0.99:
            found.append(f'image {number}: masks differ (IoU {mask_iou(pasted, expected.masks).min():.3f})')
    return found


def test_the_prediction_is_mmdets(detector, cases):
    assert all(len(case['predicted']) == 20 for case in cases)  # max_per_img: NMS and the threshold at work
    assert differences(DetectorForward(detector), cases) == []


def test_another_nms_threshold_or_no_mask_head_differs(detector, cases, monkeypatch):
    """The comparison sees the box head's NMS threshold and the mask head (masks filling their boxes)."""
    module = DetectorForward(detector)
    module.rcnn_cfg.nms.iou_threshold = 0.3
    assert differences(module, cases) != []
    module = DetectorForward(detector)
    monkeypatch.setattr(module, 'mask_probabilities', lambda feats, boxes, labels: torch.ones(len(boxes), 28, 28))
    found = differences(module, cases)
    assert found and all('masks differ' in line for line in found), found


def test_check_pairs_detections_by_label_and_box():
    """--check's pairing: the same detections in another order are within the tolerances; a changed
    label or a moved box leaves a pair unpaired, a changed score or mask is beyond its tolerance."""
    gen = np.random.default_rng(0)
    corners = gen.uniform(0, 60, (5, 2))
    expected = dict(boxes=np.concatenate([corners, corners + gen.uniform(5, 40, (5, 2))], 1).astype(np.float32),
                    scores=np.linspace(0.9, 0.5, 5).astype(np.float32), labels=np.array([0, 1, 1, 2, 0]),
                    masks=gen.random((5, 28, 28)).astype(np.float32))
    order = np.array([3, 0, 4, 1, 2])
    same = {key: value[order] for key, value in expected.items()}
    assert match_detections(expected, same, 0.5) == dict(matched=5, unmatched=(0, 0), score_difference=0.0,
                                                         mask_iou=1.0, within=True)
    for key, change in (('labels', lambda v: np.where(np.arange(5) == 3, 1, v)),
                        ('boxes', lambda v: v + np.where(np.arange(5)[:, None] == 1, 2.0, 0)),
                        ('scores', lambda v: v + np.where(np.arange(5) == 4, 2e-3, 0)),
                        ('masks', lambda v: np.where(np.arange(5)[:, None, None] == 0, 1 - v, v))):
        changed = dict(expected, **{key: change(expected[key]).astype(expected[key].dtype)})
        row = match_detections(expected, changed, 0.5)
        assert not row['within'], key
        assert row['unmatched'] == ((1, 1) if key in ('labels', 'boxes') else (0, 0)), (key, row)


def test_masks_are_pasted_as_mmdet_pastes_them(detector):
    """xcit_launch/onnx_detection.py's numpy pasting (tools/deployment/infer_onnx.py) against mmdet's mask
    head on a CPU: boxes inside, at the border, smaller than a pixel and of no width, rescaled."""
    gen = torch.Generator().manual_seed(0)
    corners = torch.rand(40, 2, generator=gen) * torch.tensor([90., 60.])
    boxes = torch.cat([corners, corners + torch.rand(40, 2, generator=gen) * 50], 1)
    boxes[-3:] = torch.tensor([[0., 0., 140., 96.], [10., 10., 10.5, 10.3], [20., 5., 20., 30.]])
    probabilities = torch.rand(40, 28, 28, generator=gen)
    meta = dict(ori_shape=(150, 200), scale_factor=(140 / 200, 96 / 150))
    expected = detector.roi_head.mask_head.predict_by_feat(
        mask_preds=(probabilities[:, None].expand(-1, 3, -1, -1),),
        results_list=[InstanceData(bboxes=boxes.clone(), labels=torch.zeros(40, dtype=torch.long))],
        batch_img_metas=[meta], rcnn_test_cfg=detector.roi_head.test_cfg, rescale=True,
        activate_map=True)[0].masks.numpy()
    scaled = (boxes / torch.tensor(meta['scale_factor']).repeat(2)).numpy()
    pasted = paste_masks(probabilities.numpy(), scaled, 150, 200, 0.5)
    assert pasted.shape == expected.shape and pasted.sum() > 0
    assert (pasted != expected).sum() == 0, (pasted != expected).sum()


def test_only_a_mask_rcnn_is_exported_whole(detector):
    """export_config's choice: the demo's Mask R-CNN (its toolkit heads are mmdet's subclasses), not
    RetinaNet (no RoI heads; its tensor forward is exported) nor a Mask R-CNN without its mask head."""
    assert is_mask_rcnn(detector)
    assert not is_mask_rcnn(build_model('configs/examples/retinanet_xcit_tiny_12_p16_1x_coco.py',
                                          {**SMALL, 'model.backbone.init_cfg': None}))
    without_mask = build_model(DEMO, {**SMALL, 'model.roi_head.mask_head': None,
                                      'model.roi_head.mask_roi_extractor': None})
    assert not is_mask_rcnn(without_mask)
