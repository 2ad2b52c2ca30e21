"""``FasterCocoMetric``: mmdet's ``CocoMetric`` (same arguments, same output keys) evaluated by
faster-coco-eval, whose C++ matching and accumulation give pycocotools' numbers many times faster.

mmdet's metric writes every detection to JSON files and reads them back before evaluating; this one
hands the detections to the evaluator in memory (the files are still written when ``outfile_prefix``
is given, as mmdet does, e.g. for a test server's ``format_only`` run).
"""
import tempfile
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster
from mmdet.evaluation.metrics import CocoMetric
from mmengine.fileio import get_local_path
from mmengine.logging import MMLogger
from terminaltables import AsciiTable

# the 12 numbers of COCOeval.stats, under mmdet's names (maxDets 100, 300, 1000)
STAT_NAMES = ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l',
              'AR@100', 'AR@300', 'AR@1000', 'AR_s@1000', 'AR_m@1000', 'AR_l@1000')
DETECTION_ITEMS = STAT_NAMES[:6]
PROPOSAL_ITEMS = STAT_NAMES[6:]


def coco_results(preds: Sequence[dict], cat_ids: Sequence[int]) -> Tuple[List[dict], Optional[List[dict]]]:
    """The predictions as COCO result lists (boxes; masks or None), values as mmdet's JSON holds them.

    Boxes become xywh in float64, as mmdet computes them from the float32 corners; mask results
    carry no box, so that the evaluator takes a mask's area from the mask, as mmdet's metric does.
    """
    categories = np.asarray(cat_ids)
    boxes: List[dict] = []
    masks: Optional[List[dict]] = [] if 'masks' in preds[0] else None
    for idx, pred in enumerate(preds):
        image_id = pred.get('img_id', idx)
        corners = np.asarray(pred['bboxes'], dtype=np.float64).reshape(-1, 4)
        xywh = np.concatenate([corners[:, :2], corners[:, 2:] - corners[:, :2]], axis=1).tolist()
        labels = categories[np.asarray(pred['labels'], dtype=np.int64)].tolist()
        scores = np.asarray(pred['scores'], dtype=np.float64).tolist()
        boxes.extend(dict(image_id=image_id, bbox=box, score=score, category_id=label)
                     for box, score, label in zip(xywh, scores, labels))
        if masks is not None:
            mask_scores = np.asarray(pred.get('mask_scores', pred['scores']), dtype=np.float64).tolist()
            masks.extend(dict(image_id=image_id, segmentation=rle, score=score, category_id=label)
                         for rle, score, label in zip(pred['masks'], mask_scores, labels))
    return boxes, masks


def per_category_precision(precision: np.ndarray, names: Sequence[str]) -> List[Tuple[str, ...]]:
    """Rows (name, mAP, mAP_50, mAP_75, mAP_s, mAP_m, mAP_l) from COCOeval's precision array
    (IoU x recall x category x area x maxDets), at the largest maxDets, 'nan' where undefined."""
    def mean(values: np.ndarray) -> float:
        values = values[values > -1]
        return float(np.mean(values)) if values.size else float('nan')

    rows = []
    for k, name in enumerate(names):
        p = precision[:, :, k, :, -1]
        aps = [mean(p[:, :, 0]), mean(p[0, :, 0]), mean(p[5, :, 0])] + [mean(p[:, :, a]) for a in (1, 2, 3)]
        rows.append((name, *(f'{round(ap, 3)}' for ap in aps)))
    return rows


class FasterCocoMetric(CocoMetric):
    """mmdet's ``CocoMetric`` evaluated by faster-coco-eval, detections handed over in memory.

    ``coco_stats`` keeps the 12 numbers of the last evaluation per metric at full precision (the
    output keys are rounded to 3 decimals, as mmdet rounds them).
    """

    def __init__(self, ann_file: Optional[str] = None, sort_categories: bool = False, **kwargs: Any) -> None:
        super().__init__(ann_file=None, **kwargs)
        self.coco_stats: Dict[str, np.ndarray] = {}
        if ann_file is not None:
            with get_local_path(ann_file, backend_args=self.backend_args) as local_path:
                self._coco_api = COCO(local_path)
            if sort_categories:  # Objects365's category lists are not in id order
                self._coco_api.cats = dict(sorted(self._coco_api.cats.items()))
                self._coco_api.dataset['categories'].sort(key=lambda cat: cat['id'])

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """The COCO metrics of the processed results, under mmdet's ``CocoMetric`` keys."""
        logger: MMLogger = MMLogger.get_current_instance()
        gts, preds = zip(*results)
        if self._coco_api is None:
            self._coco_api = self._ground_truth_api(gts)
        if self.cat_ids is None:
            self.cat_ids = self._coco_api.get_cat_ids(cat_names=self.dataset_meta['classes'])
        if self.img_ids is None:
            self.img_ids = self._coco_api.get_img_ids()
        if self.outfile_prefix is not None:
            self.results2json(preds, self.outfile_prefix)
        eval_results: Dict[str, float] = OrderedDict()
        if self.format_only:
            logger.info(f'results are saved with the prefix {self.outfile_prefix}')
            return eval_results

        for item in self.metric_items or ():
            if item not in STAT_NAMES:
                raise KeyError(f'metric item "{item}" is not supported')
        boxes, masks = coco_results(preds, self.cat_ids)
        detections = dict(bbox=boxes, proposal=boxes, segm=masks)
        for metric in self.metrics:
            logger.info(f'Evaluating {metric}...')
            if metric == 'proposal_fast':
                recalls = self.fast_eval_recall(preds, self.proposal_nums, self.iou_thrs, logger=logger)
                for num, recall in zip(self.proposal_nums, recalls):
                    eval_results[f'AR@{num}'] = recall
                logger.info(''.join(f'\nAR@{num}\t{recall:.4f}' for num, recall in zip(self.proposal_nums, recalls)))
                continue
            if detections[metric] is None:
                raise KeyError(f'{metric} is not in results')
            if not detections[metric]:
                logger.error('The testing results of the whole dataset is empty.')
                break
            coco_eval = self._evaluate(metric, detections[metric], logger)
            stats, items = self.coco_stats[metric], self.metric_items
            if metric == 'proposal':
                for item in items or PROPOSAL_ITEMS:
                    eval_results[item] = float(f'{stats[STAT_NAMES.index(item)]:.3f}')
                continue
            if self.classwise:
                self._log_per_category(coco_eval.eval['precision'], eval_results, logger)
            for item in items or DETECTION_ITEMS:
                eval_results[f'{metric}_{item}'] = float(f'{round(stats[STAT_NAMES.index(item)], 3)}')
            logger.info(f'{metric}_mAP_copypaste: ' + ' '.join(f'{ap:.3f}' for ap in stats[:6]))
        return eval_results

    def _evaluate(self, metric: str, detections: List[dict], logger: MMLogger) -> COCOeval_faster:
        """Run faster-coco-eval on one metric's detections with mmdet's parameters; keeps its stats."""
        iou_type = 'bbox' if metric == 'proposal' else metric
        coco_dt = self._coco_api.loadRes(detections)
        coco_eval = COCOeval_faster(self._coco_api, coco_dt, iou_type, print_function=logger.info)
        coco_eval.params.catIds = self.cat_ids
        coco_eval.params.imgIds = self.img_ids
        coco_eval.params.maxDets = list(self.proposal_nums)
        coco_eval.params.iouThrs = self.iou_thrs
        if metric == 'proposal':
            coco_eval.params.useCats = 0
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
        self.coco_stats[metric] = np.asarray(coco_eval.stats[:len(STAT_NAMES)], dtype=np.float64)
        return coco_eval

    def _log_per_category(self, precision: np.ndarray, eval_results: Dict[str, float],
                          logger: MMLogger) -> None:
        """Add each category's AP to the results (``<name>_precision``) and log the per-category table."""
        assert len(self.cat_ids) == precision.shape[2]
        names = [self._coco_api.loadCats(cat_id)[0]['name'] for cat_id in self.cat_ids]
        rows = per_category_precision(precision, names)
        for row in rows:
            eval_results[f'{row[0]}_precision'] = float(row[1])
        logger.info('\n' + AsciiTable([['category', *DETECTION_ITEMS], *rows]).table)

    def _ground_truth_api(self, gts: Sequence[dict]) -> COCO:
        """The dataset's own annotations (no ``ann_file``) in a COCO API, by mmdet's converter."""
        with tempfile.TemporaryDirectory() as tmp:
            return COCO(self.gt_to_coco_json(gt_dicts=gts, outfile_prefix=f'{tmp}/results'))
