"""Datasets that report bad data instead of crashing on it or hiding it.

- ``CheckedCocoDataset``: COCO instances whose annotations are checked when the file is read;
  boxes of zero or negative size and polygons with fewer than three points are dropped with a
  warning naming the image and annotation, and counted; images left without annotations are
  named too (mmdet drops them from training silently).
- ``SkipBadSamples``: a wrapper for training sets; a sample that fails to load or transform (a
  missing or corrupt image, a label map with values outside the classes) is reported, counted
  and replaced by another one, so an epoch is never lost to one bad sample.
"""
import logging
import random
from collections import Counter
from typing import Any, List, Union

import numpy as np
from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS as DET_DATASETS
from mmengine.logging import print_log
from mmengine.registry import DATASETS


@DET_DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that names and counts the annotations it cannot use."""

    def load_data_list(self) -> List[dict]:
        self.problems: Counter = Counter()
        data_list = super().load_data_list()
        if self.problems:
            summary = ', '.join(f'{n} {what}' for what, n in sorted(self.problems.items()))
            print_log(f'{self.ann_file}: skipped {summary}', logger='current', level=logging.WARNING)
        return data_list

    def _drop(self, what: str, detail: str) -> None:
        self.problems[what] += 1
        print_log(f'{self.ann_file}: {detail}: skipped', logger='current', level=logging.WARNING)

    def parse_data_info(self, raw_data_info: dict) -> Union[dict, List[dict]]:
        image = raw_data_info['raw_img_info']
        kept = []
        for ann in raw_data_info['raw_ann_info']:
            where = f'image {image["file_name"]} annotation {ann.get("id")}'
            _, _, w, h = ann.get('bbox', (0, 0, 0, 0))
            if w <= 0 or h <= 0:
                self._drop('boxes of zero or negative size', f'{where}: box {ann.get("bbox")}')
                continue
            segmentation = ann.get('segmentation')
            if isinstance(segmentation, list):
                polygons = [p for p in segmentation if len(p) >= 6]
                if len(polygons) < len(segmentation):
                    self._drop('polygons with fewer than three points', f'{where}: a polygon of '
                               f'{min(len(p) for p in segmentation) // 2} point(s)')
                if not polygons:
                    continue
                ann = dict(ann, segmentation=polygons)
            kept.append(ann)
        return super().parse_data_info(dict(raw_data_info, raw_ann_info=kept))

    def filter_data(self) -> List[dict]:
        valid = super().filter_data()
        if not self.test_mode and self.filter_cfg and self.filter_cfg.get('filter_empty_gt'):
            kept = {info['img_id'] for info in valid}
            empty = [info['img_path'] for info in self.data_list if info['img_id'] not in kept]
            if empty:
                self.problems['images without annotations'] += len(empty)
                print_log(f'{self.ann_file}: {len(empty)} image(s) without usable annotations '
                          f'are not used for training: {", ".join(empty[:5])}'
                          + (' ...' if len(empty) > 5 else ''), logger='current', level=logging.WARNING)
        return valid


@DATASETS.register_module()
class SkipBadSamples:
    """Training-set wrapper: report, count and replace samples that cannot be loaded.

    Segmentation labels are checked too: values outside ``0..num_classes-1`` other than the
    ignore index make the sample bad (they would crash or silently corrupt the loss).
    """

    def __init__(self, dataset: Union[dict, Any], ignore_index: int = 255, max_tries: int = 100) -> None:
        self.dataset = DATASETS.build(dataset) if isinstance(dataset, dict) else dataset
        self.ignore_index = ignore_index
        self.max_tries = max_tries
        self.skipped = 0

    @property
    def metainfo(self) -> dict:
        return self.dataset.metainfo

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str):
        # everything else (pipeline, data_list, ...) is the wrapped dataset's
        if name == 'dataset':
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def _describe(self, idx: int) -> str:
        info = self.dataset.get_data_info(idx)
        paths = [info[key] for key in ('img_path', 'seg_map_path') if info.get(key)]
        return ' / '.join(paths) or f'sample {idx}'

    def _check_labels(self, sample: dict) -> None:
        data_sample = sample.get('data_samples')
        if data_sample is None or 'gt_sem_seg' not in data_sample:
            return
        values = np.unique(data_sample.gt_sem_seg.data.numpy())
        classes = len(self.metainfo.get('classes', ()))
        bad = [int(v) for v in values if v != self.ignore_index and not 0 <= v < classes]
        if bad:
            raise ValueError(f'label values {bad} outside the {classes} classes '
                             f'(0..{classes - 1}, ignore {self.ignore_index})')

    def __getitem__(self, idx: int) -> dict:
        for _ in range(self.max_tries):
            try:
                sample = self.dataset[idx]
                self._check_labels(sample)
                return sample
            except Exception as exc:  # any per-sample failure: missing file, decode error, ...
                self.skipped += 1
                print_log(f'skipping {self._describe(idx)}: {type(exc).__name__}: {exc} '
                          f'({self.skipped} bad sample(s) so far in this process)',
                          logger='current', level=logging.WARNING)
                idx = random.randrange(len(self.dataset))
        raise RuntimeError(f'{self.max_tries} samples in a row could not be loaded: '
                           f'the dataset is broken, see the warnings above')
