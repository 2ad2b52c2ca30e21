"""Images per second per data-loader worker of the COCO recipe's training pipeline
(configs/_base_/datasets/coco_instance_xcit.py: flip, multi-scale AutoAugment with crop, polygon
masks, packing), on a generated set of COCO's image sizes and instance counts, and the number of
workers per GPU that feeds a given GPU step time.

One worker is one process that runs the pipeline on one sample after another: the samples are
drawn here the same way in one process (cv2 and torch at one thread, as in a worker). Both the wall
time (disturbed by other load) and the process's CPU time (what one free core would take) are given.
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.overhead import workers_per_gpu  # noqa: E402

CONFIG = 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py'
# mmdetection's Mask R-CNN R-50-FPN, 8 V100s: 53 images/s (detectron2's benchmark of open-source
# Mask R-CNN training speed, docs/notes/benchmarks.md), i.e. 2 images per GPU every 0.30 s. A
# backbone as heavy as XCiT-S12 or Swin-T makes the step slower, so this is the demanding case.
ASSUMED_STEP_S = 8 * 2 / 53
STEP_SOURCE = ('mmdetection Mask R-CNN R-50-FPN, 53 img/s on 8 V100 (facebookresearch/detectron2, '
               'docs/notes/benchmarks.md)')


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks data_pipeline', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--images', type=int, default=60, help='generated images (each timed once)')
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--step-s', type=float, default=ASSUMED_STEP_S, help='GPU step time to feed')
    parser.add_argument('--images-per-step', type=int, default=2, help='images per GPU per step')
    parser.add_argument('--margin', type=float, default=1.5, help='headroom on the workers needed')
    parser.add_argument('--out', help='also write the tables (markdown) here')
    args = parser.parse_args(argv)

    import cv2
    import torch
    cv2.setNumThreads(0)
    torch.set_num_threads(1)
    from mmdet.registry import DATASETS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings

    import xcit_dense  # noqa: F401
    from benchmarks.data_pipeline import write_coco_like_set

    tmp = Path(tempfile.mkdtemp(prefix='xcit_pipeline_'))
    start = time.perf_counter()
    ann_file = write_coco_like_set(str(tmp), args.images + args.warmup)
    print(f'generated {args.images + args.warmup} images in {time.perf_counter() - start:.1f} s under {tmp}')
    cfg = Config.fromfile(str(ROOT / args.config))
    import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
    dataset_cfg = cfg.train_dataloader.dataset.copy()
    dataset_cfg.update(data_root=str(tmp), ann_file=str(ann_file), data_prefix=dict(img='images/'))
    dataset = DATASETS.build(dataset_cfg)
    instances = [len(dataset.get_data_info(i)['instances']) for i in range(len(dataset))]
    walls, cpus, out_sizes = [], [], []
    load = os.getloadavg()[0]
    for index in range(len(dataset)):
        wall, cpu = time.perf_counter(), time.process_time()
        sample = dataset[index]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if index >= args.warmup:
            walls.append(wall)
            cpus.append(cpu)
            out_sizes.append(tuple(sample['inputs'].shape[1:]))
    load_after = os.getloadavg()[0]
    shutil.rmtree(tmp, ignore_errors=True)  # the generated set is only for this run
    wall_rate, cpu_rate = len(walls) / sum(walls), len(cpus) / sum(cpus)
    need = args.images_per_step / args.step_s
    widths = sorted(set(dataset.get_data_info(i)['width'] for i in range(len(dataset))))
    lines = [
        f'config: {args.config} (train pipeline), {len(walls)} images timed after {args.warmup} warm-up, '
        f'load average {load:.2f} -> {load_after:.2f} (2 cores, busy)',
        f'generated set: {len(instances)} images of COCO sizes {widths} '
        f'px wide, instances per image mean {statistics.mean(instances):.1f}, max {max(instances)}; '
        f'pipeline outputs up to {max(h for h, _ in out_sizes)}x{max(w for _, w in out_sizes)}',
        '',
        '| per worker process | ms per image (median) | ms per image (mean) | images/s |',
        '|---|---|---|---|',
        f'| wall time (under load) | {1e3 * statistics.median(walls):.1f} | {1e3 * statistics.mean(walls):.1f} '
        f'| {wall_rate:.1f} |',
        f'| CPU time (one free core) | {1e3 * statistics.median(cpus):.1f} | {1e3 * statistics.mean(cpus):.1f} '
        f'| {cpu_rate:.1f} |',
        '',
        f'GPU step assumed: {args.images_per_step} images every {args.step_s:.3f} s = {need:.1f} images/s per GPU; '
        f'source: {STEP_SOURCE if args.step_s == ASSUMED_STEP_S else "--step-s"}',
        '',
        f'| GPU step (s, {args.images_per_step} images) | images/s per GPU | workers needed (CPU-time rate) '
        f'| with {args.margin}x headroom | workers needed (loaded wall rate) |',
        '|---|---|---|---|---|',
    ]
    for step in sorted({args.step_s, 0.15, 0.2, 0.5, 1.0}):
        lines.append(f'| {step:.3f} | {args.images_per_step / step:.1f} '
                     f'| {workers_per_gpu(args.images_per_step, step, cpu_rate)} '
                     f'| {workers_per_gpu(args.images_per_step, step, cpu_rate, args.margin)} '
                     f'| {workers_per_gpu(args.images_per_step, step, wall_rate)} |')
    text = '\n'.join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + '\n')
