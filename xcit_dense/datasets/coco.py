"""``CheckedCocoDataset``: COCO instances whose annotations are checked when the file is read.

Boxes that are not four finite numbers or of zero or negative size, polygons that are not
three or more pairs of numbers or that reach far outside the image, and RLE masks whose size is not
the image's (a few bytes can declare gigabytes) are dropped with a warning naming the image and
annotation, and counted in the words of ``problems``. In a validation or test set (``test_mode``) a
polygon far outside its image is kept instead: the metric would rasterise it from the annotation
file, so the sample check (``robust``) stops the run at that image. Images left without annotations
are named too (mmdet drops them from training silently). This module imports mmdet: the package
imports it only when such a dataset is built or named.
"""
import logging
from collections import Counter
from typing import Dict, List, Union

from mmdet.datasets import CocoDataset
from mmdet.registry import DATASETS as DET_DATASETS
from mmengine.logging import print_log

from .annotations import box_problem, polygon_problem, rle_problem
from .problems import NO_ANNOTATIONS, POLYGON_OUTSIDE, summary


@DET_DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that names and counts the annotations it cannot use."""

    def load_data_list(self) -> List[dict]:
        self.problems: Counter = Counter()
        self.examples: Dict[str, str] = {}  # the first of each kind, for tools/check_dataset.py
        data_list = super().load_data_list()
        if self.problems:
            print_log(f'{self.ann_file}: skipped {summary(self.problems)}', logger='current',
                      level=logging.WARNING)
        return data_list

    def _drop(self, what: str, detail: str) -> None:
        self.problems[what] += 1
        self.examples.setdefault(what, detail)
        print_log(f'{self.ann_file}: {detail}: skipped', logger='current', level=logging.WARNING)

    def parse_data_info(self, raw_data_info: dict) -> Union[dict, List[dict]]:
        image = raw_data_info['raw_img_info']
        kept = []
        for ann in raw_data_info['raw_ann_info']:
            where = f'image {image["file_name"]} annotation {ann.get("id")}'
            problem = box_problem(ann, image['height'], image['width'])
            if problem:
                self._drop(problem[0], f'{where}: {problem[1]}')
                continue
            segmentation = ann.get('segmentation')
            if isinstance(segmentation, list):
                polygons = []
                for polygon in segmentation:
                    problem = polygon_problem(polygon, image['height'], image['width'])
                    if problem and problem[0] == POLYGON_OUTSIDE and self.test_mode:
                        problem = None  # kept: the sample check stops validation at it, naming the image
                    if problem:
                        self._drop(problem[0], f'{where}: {problem[1]}')
                    else:
                        polygons.append(polygon)
                if not polygons:
                    continue
                ann = dict(ann, segmentation=polygons)
            elif segmentation:
                problem = rle_problem(segmentation, image['height'], image['width'])
                if problem:
                    self._drop(problem[0], f'{where}: {problem[1]}')
                    continue
            kept.append(ann)
        return super().parse_data_info(dict(raw_data_info, raw_ann_info=kept))

    def filter_data(self) -> List[dict]:
        valid = super().filter_data()
        if not self.test_mode and self.filter_cfg and self.filter_cfg.get('filter_empty_gt'):
            kept = {info['img_id'] for info in valid}
            empty = [info['img_path'] for info in self.data_list if info['img_id'] not in kept]
            if empty:
                self.problems[NO_ANNOTATIONS] += len(empty)
                print_log(f'{self.ann_file}: {len(empty)} image(s) without usable annotations '
                          f'are not used for training: {", ".join(empty[:5])}'
                          + (' ...' if len(empty) > 5 else ''), logger='current', level=logging.WARNING)
        return valid
