"""``CheckedCocoDataset``: COCO instances whose annotations are checked when the file is read.

Boxes of zero or negative size and polygons with fewer than three points are dropped with a
warning naming the image and annotation, and counted; images left without annotations are
named too (mmdet drops them from training silently). This module imports mmdet: the package
imports it only when such a dataset is built or named.
"""
import logging
from collections import Counter
from typing import List, Union

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS as DET_DATASETS
from mmengine.logging import print_log


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
