"""FasterCocoMetric against mmdet's CocoMetric (pycocotools) on the demo set with generated
detections: the same 12 bbox and 12 segm numbers (1e-4), the same output keys and values, and the
COCO configs' evaluator is FasterCocoMetric."""
import copy
import json

import numpy as np
import pytest
from helpers import ROOT
from mmdet.evaluation.metrics import CocoMetric
from mmdet.registry import METRICS
from mmengine.config import Config
from pycocotools.cocoeval import COCOeval

from benchmarks.coco_eval import synthetic_detections
from xcit_dense.datasets.synthetic import SHAPES, write_coco_set


@pytest.fixture(scope='module')
def demo_val(tmp_path_factory):
    """The demo set's validation split (40 images) and detections, 30 per image."""
    ann_file = write_coco_set(tmp_path_factory.mktemp('demo_coco'), 'val', 40, seed=1, max_objects=5)
    return str(ann_file), synthetic_detections(json.loads(ann_file.read_text()), per_image=30)


def pycocotools_stats(monkeypatch) -> dict:
    """Record the stats of every pycocotools evaluation mmdet's metric runs, by iouType, in order."""
    seen = {}
    summarize = COCOeval.summarize

    def recording(self):
        summarize(self)
        seen.setdefault(self.params.iouType, []).append(np.array(self.stats))
    monkeypatch.setattr(COCOeval, 'summarize', recording)
    return seen


def test_same_numbers_as_mmdet_coco_metric(demo_val, monkeypatch):
    ann_file, results = demo_val
    kwargs = dict(ann_file=ann_file, metric=['bbox', 'segm', 'proposal'], classwise=True)
    ours = METRICS.build(dict(type='FasterCocoMetric', **kwargs))
    theirs = CocoMetric(**kwargs)
    for metric in (ours, theirs):
        metric.dataset_meta = dict(classes=SHAPES)
    seen = pycocotools_stats(monkeypatch)
    ours_out = ours.compute_metrics(copy.deepcopy(results))
    theirs_out = theirs.compute_metrics(copy.deepcopy(results))

    assert list(ours_out) == list(theirs_out)
    assert ours_out == pytest.approx(theirs_out, abs=1e-9)
    bbox, proposal = seen['bbox']
    for metric, reference in (('bbox', bbox), ('segm', seen['segm'][0]), ('proposal', proposal)):
        assert ours.coco_stats[metric].shape == (12,)
        np.testing.assert_allclose(ours.coco_stats[metric], reference, atol=1e-4, err_msg=metric)
    assert 0.05 < ours.coco_stats['segm'][0] < 0.95  # neither trivial nor perfect


def test_coco_configs_evaluate_with_faster_coco_metric():
    cfg = Config.fromfile(str(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py'))
    assert cfg.val_evaluator.type == cfg.test_evaluator.type == 'FasterCocoMetric'


def test_same_numbers_as_mmdet_coco_metric_without_ann_file(demo_val, monkeypatch):
    """Without ``ann_file`` both metrics convert the results' own ground truth (mmdet's converter)."""
    ann_file, results = demo_val
    dataset = json.loads(open(ann_file).read())
    label_of = {cat['id']: k for k, cat in enumerate(sorted(dataset['categories'], key=lambda c: c['id']))}
    anns = {image['id']: [] for image in dataset['images']}
    for ann in dataset['annotations']:
        x, y, w, h = ann['bbox']
        anns[ann['image_id']].append(dict(bbox_label=label_of[ann['category_id']], bbox=[x, y, x + w, y + h],
                                          mask=ann['segmentation'], ignore_flag=ann['iscrowd']))
    with_gt = [(dict(gt, anns=anns[gt['img_id']]), pred) for gt, pred in results]
    kwargs = dict(metric=['bbox', 'segm'])
    ours, theirs = METRICS.build(dict(type='FasterCocoMetric', **kwargs)), CocoMetric(**kwargs)
    for metric in (ours, theirs):
        metric.dataset_meta = dict(classes=SHAPES)
    seen = pycocotools_stats(monkeypatch)
    ours_out = ours.compute_metrics(copy.deepcopy(with_gt))
    theirs_out = theirs.compute_metrics(copy.deepcopy(with_gt))

    assert list(ours_out) == list(theirs_out) and ours_out == pytest.approx(theirs_out, abs=1e-9)
    for metric in ('bbox', 'segm'):
        np.testing.assert_allclose(ours.coco_stats[metric], seen[metric][0], atol=1e-4, err_msg=metric)
    assert 0.05 < ours.coco_stats['segm'][0] < 0.95
