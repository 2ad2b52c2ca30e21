"""COCO evaluation time: this toolkit's FasterCocoMetric (faster-coco-eval) against mmdet's CocoMetric
(pycocotools), side by side in one process, on a generated set of COCO val2017's size.

Two figures per round, the two libraries alternated (which goes first swaps every round):
- the metric's whole ``compute_metrics`` (bbox and segm; results conversion, mmdet's JSON files,
  evaluation), from the results as ``CocoMetric.process`` stores them;
- the evaluation proper (COCOeval's evaluate + accumulate + summarize) per iouType, on the same
  in-memory detections, with mmdet's parameters.
The 12 stats of each iouType are compared (they must agree to 1e-4). Prints a Markdown report and
writes it to ``--out``. Example (the command of benchmarks/reports/coco_eval.md)::

    PYTHONPATH=. .venv/bin/python -m benchmarks coco_eval --rounds 2 --out benchmarks/reports/coco_eval.md
"""
import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import numpy as np
from faster_coco_eval import COCO as FastCOCO, COCOeval_faster
from mmdet.evaluation.metrics import CocoMetric
from mmengine.logging import MMLogger
from pycocotools.coco import COCO as PyCOCO
from pycocotools.cocoeval import COCOeval as PyCOCOeval

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from benchmarks.coco_eval import synthetic_detections, synthetic_ground_truth  # noqa: E402
from xcit_dense.evaluation.coco_metric import FasterCocoMetric, coco_results

LIBRARIES = ('pycocotools', 'faster-coco-eval')


def evaluation_proper(library: str, ann_file: str, results: list, cat_ids: List[int],
                      iou_type: str) -> Tuple[float, np.ndarray]:
    """Seconds of evaluate + accumulate + summarize for one iouType, and its 12 stats."""
    coco_cls, eval_cls = (PyCOCO, PyCOCOeval) if library == 'pycocotools' else (FastCOCO, COCOeval_faster)
    gt = coco_cls(ann_file)
    boxes, masks = coco_results([pred for _, pred in results], cat_ids)
    coco_eval = eval_cls(gt, gt.loadRes(boxes if iou_type == 'bbox' else masks), iou_type)
    coco_eval.params.maxDets = [100, 300, 1000]
    start = time.perf_counter()
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return time.perf_counter() - start, np.asarray(coco_eval.stats[:12])


def whole_metric(library: str, ann_file: str, results: list, classes: List[str]) -> Tuple[float, dict]:
    """Seconds of the metric's compute_metrics with bbox and segm (the ground truth loaded before)."""
    cls: Callable = CocoMetric if library == 'pycocotools' else FasterCocoMetric
    metric = cls(ann_file=ann_file, metric=['bbox', 'segm'])
    metric.dataset_meta = dict(classes=classes)
    start = time.perf_counter()
    out = metric.compute_metrics(results)
    return time.perf_counter() - start, dict(out)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks coco_eval', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--num-images', type=int, default=5000)
    parser.add_argument('--per-image', type=int, default=100, help="detections per image (mmdet's max_per_img)")
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--out', help='write the Markdown report here too')
    args = parser.parse_args(argv)
    MMLogger.get_instance('mmengine', log_level='WARNING')

    start = time.perf_counter()
    gt = synthetic_ground_truth(args.num_images)
    results = synthetic_detections(gt, per_image=args.per_image)
    generated = time.perf_counter() - start
    classes = [c['name'] for c in gt['categories']]
    cat_ids = [c['id'] for c in gt['categories']]
    times: Dict[str, Dict[str, list]] = {lib: dict(whole=[], bbox=[], segm=[]) for lib in LIBRARIES}
    stats: Dict[str, Dict[str, np.ndarray]] = {lib: {} for lib in LIBRARIES}
    outputs: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ann_file = os.path.join(tmp, 'instances_val.json')
        with open(ann_file, 'w') as f:
            json.dump(gt, f)
        for r in range(args.rounds):
            order = LIBRARIES if r % 2 == 0 else LIBRARIES[::-1]
            for lib in order:
                seconds, outputs[lib] = whole_metric(lib, ann_file, results, classes)
                times[lib]['whole'].append(seconds)
                print(f'round {r + 1}: {lib} compute_metrics {seconds:.1f} s', flush=True)
            for iou_type in ('bbox', 'segm'):
                for lib in order:
                    seconds, stats[lib][iou_type] = evaluation_proper(lib, ann_file, results, cat_ids, iou_type)
                    times[lib][iou_type].append(seconds)
                    print(f'round {r + 1}: {lib} {iou_type} evaluation {seconds:.1f} s', flush=True)
    print(report(args, gt, generated, times, stats, outputs))
    if args.out:
        with open(args.out, 'w') as f:
            f.write(report(args, gt, generated, times, stats, outputs))


def report(args: argparse.Namespace, gt: dict, generated: float, times: dict, stats: dict,
           outputs: dict) -> str:
    """The Markdown report: the set, the times side by side with their ratios, the stats' agreement."""
    med = {lib: {k: statistics.median(v) for k, v in times[lib].items()} for lib in LIBRARIES}
    py, fast = (med[lib] for lib in LIBRARIES)
    lines = [
        '# COCO evaluation: FasterCocoMetric (faster-coco-eval) against mmdet\'s CocoMetric (pycocotools)',
        '',
        f'Generated set (benchmarks/coco_eval.py): {len(gt["images"])} images of 640x480, '
        f'{len(gt["annotations"])} instances with polygons, 80 classes, {args.per_image} detections per image '
        f'with RLE masks ({len(gt["images"]) * args.per_image} in all); generated in {generated:.0f} s. '
        f'CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other work; '
        f'median of {args.rounds} rounds, the libraries alternated in one process.',
        '',
        'Command: `PYTHONPATH=. .venv/bin/python -m benchmarks coco_eval '
        f'--num-images {args.num_images} --per-image {args.per_image} --rounds {args.rounds} --out <this file>`',
        '',
        '| work | pycocotools (mmdet CocoMetric) | faster-coco-eval (FasterCocoMetric) | speed-up | target |',
        '|---|---|---|---|---|',
        f'| compute_metrics, bbox + segm | {py["whole"]:.1f} s | {fast["whole"]:.1f} s | '
        f'{py["whole"] / fast["whole"]:.1f}x | at least 4x |',
        f'| evaluation proper, bbox | {py["bbox"]:.1f} s | {fast["bbox"]:.1f} s | {py["bbox"] / fast["bbox"]:.1f}x '
        '| at least 8x |',
        f'| evaluation proper, segm | {py["segm"]:.1f} s | {fast["segm"]:.1f} s | {py["segm"] / fast["segm"]:.1f}x '
        '| at least 4x |',
        '',
        'Per round (s): ' + '; '.join(f'{lib} {k} ' + ', '.join(f'{t:.1f}' for t in v)
                                      for lib in LIBRARIES for k, v in times[lib].items()),
        '',
    ]
    for iou_type in ('bbox', 'segm'):
        diff = float(np.max(np.abs(stats[LIBRARIES[0]][iou_type] - stats[LIBRARIES[1]][iou_type])))
        lines.append(f'{iou_type}: 12 stats, largest difference {diff:.1e} (1e-4 allowed); pycocotools '
                     + ' '.join(f'{s:.4f}' for s in stats[LIBRARIES[0]][iou_type]))
    same = outputs[LIBRARIES[0]] == outputs[LIBRARIES[1]]
    lines += ['', f'compute_metrics output keys and values identical: {same}', '']
    return '\n'.join(lines)
