"""``CheckedCocoDataset``: COCO instances whose annotations are checked when the file is read.

Boxes that are not four finite numbers or of zero or negative size, polygons that are not
three or more pairs of numbers or that reach far outside the image, and RLE masks whose size is not
the image's (a few bytes can declare gigabytes) are dropped and counted in the words of ``problems``,
with one warning per image that names it once, counts its dropped annotations by kind and shows the
first of each (a long file name repeated per annotation made a small file write a large log). In a
validation or test set (``test_mode``) a polygon far outside its image is kept instead: the metric
would rasterise it from the annotation file, so the sample check (``robust``) stops the run at that
image. A file in which two categories share a name is refused, naming both ids, as is one with an image
whose height or width is not a positive number a float holds. Images left without annotations
are named too (mmdet drops them from training silently). This module imports mmdet: the package
imports it only when such a dataset is built or named.
"""
import logging
from collections import Counter
from typing import Dict, List, Tuple, Union

from mmdet.datasets import CocoDataset
from mmdet.datasets.api_wrappers import COCO
from mmdet.registry import DATASETS as DET_DATASETS
from mmengine.logging import print_log

from .annotations import (
    box_problem,
    duplicate_category_problem,
    image_size_problem,
    polygon_problem,
    rle_problem,
    shown,
)
from .problems import NO_ANNOTATIONS, POLYGON_OUTSIDE, summary


class _CheckedCOCO(COCO):
    """mmdet's COCO reader that refuses a file in which two categories share a name, or an image's
    height or width is not a size in pixels (the metric rasterises from them too, so dropping the
    image here would not save validation)."""

    def __init__(self, annotation_file: str) -> None:
        super().__init__(annotation_file)
        problem = duplicate_category_problem(self.dataset.get('categories', []))
        if problem:
            raise ValueError(f'{annotation_file}: {problem}: give each category a name of its own')
        for image in self.dataset.get('images', []):
            problem = image_size_problem(image)
            if problem:
                raise ValueError(f'{annotation_file}: {problem}')


@DET_DATASETS.register_module()
class CheckedCocoDataset(CocoDataset):
    """``CocoDataset`` that names and counts the annotations it cannot use, and refuses category
    names that are not unique."""

    COCOAPI = _CheckedCOCO

    def load_data_list(self) -> List[dict]:
        self.problems: Counter = Counter()
        self.examples: Dict[str, str] = {}  # the first of each kind, for tools/check_dataset.py
        data_list = super().load_data_list()
        if self.problems:
            print_log(f'{self.ann_file}: skipped {summary(self.problems)}', logger='current',
                      level=logging.WARNING)
        return data_list

    def _report_dropped(self, image: str, dropped: List[Tuple[str, str]]) -> None:
        """Count one image's dropped annotations ((kind, 'annotation ID: detail') each) and name the
        image once, with how many of each kind and the first of each."""
        kinds: Counter = Counter(kind for kind, _ in dropped)
        first: Dict[str, str] = {}
        for kind, detail in dropped:
            first.setdefault(kind, detail)
            self.examples.setdefault(kind, f'image {image} {detail}')
        self.problems.update(kinds)
        print_log(f'{self.ann_file}: image {image}: skipped {len(dropped)} annotation(s): '
                  + '; '.join(f'{n} {kind}, e.g. {first[kind]}' for kind, n in kinds.items()),
                  logger='current', level=logging.WARNING)

    def parse_data_info(self, raw_data_info: dict) -> Union[dict, List[dict]]:
        image = raw_data_info['raw_img_info']
        kept, dropped = [], []
        for ann in raw_data_info['raw_ann_info']:
            where = f'annotation {shown(ann.get("id"))}'
            problem = box_problem(ann, image['height'], image['width'])
            if problem:
                dropped.append((problem[0], f'{where}: {problem[1]}'))
                continue
            segmentation = ann.get('segmentation')
            if isinstance(segmentation, list):
                polygons = []
                for polygon in segmentation:
                    problem = polygon_problem(polygon, image['height'], image['width'])
                    if problem and problem[0] == POLYGON_OUTSIDE and self.test_mode:
                        problem = None  # kept: the sample check stops validation at it, naming the image
                    if problem:
                        dropped.append((problem[0], f'{where}: {problem[1]}'))
                    else:
                        polygons.append(polygon)
                if not polygons:
                    continue
                ann = dict(ann, segmentation=polygons)
            elif segmentation:
                problem = rle_problem(segmentation, image['height'], image['width'])
                if problem:
                    dropped.append((problem[0], f'{where}: {problem[1]}'))
                    continue
            kept.append(ann)
        if dropped:
            self._report_dropped(image['file_name'], dropped)
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
