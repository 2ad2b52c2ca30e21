"""Checked loading of samples: ``SkipBadSamples`` for training sets, ``StopOnBadSamples`` for
validation and test sets.

Before the pipeline decodes a sample, its files are checked (``files``): paths that stay in their
folder, headers within the pixel limit (config key ``max_image_pixels``), a label map of its image's
size, RLE masks of the image's real size and polygons within it. A sample that fails, there or in
the pipeline, is named with its kind (``problems``). Training reports, counts and replaces it, so an epoch is never
lost to one bad sample; validation and test stop, naming the file, since a metric over fewer
images would be wrong.
"""
import logging
import random
from collections import Counter
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
from mmengine.logging import print_log
from mmengine.registry import DATASETS
from pycocotools import mask as mask_utils

from ..allocation_failures import is_out_of_memory
from ..pixel_limit import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
from .annotations import polygon_problem, rle_problem
from .files import IMAGE, LABEL_MAP, check_image_file, check_inside
from .problems import BAD_RLE, LABEL_MAP_SIZE, LABELS_OUTSIDE, PIPELINE_FAILED, POLYGON_OUTSIDE, BadSample, summary

# the data_prefix keys of each sample path (mmdet's, then mmseg's names)
_FILES = (('img_path', IMAGE, ('img', 'img_path')), ('seg_map_path', LABEL_MAP, ('seg', 'seg_map_path')))


def sample_folders(dataset: Any) -> Dict[str, str]:
    """The folder each kind of sample path must stay in: its data prefix, else data_root."""
    prefix, root = getattr(dataset, 'data_prefix', None) or {}, getattr(dataset, 'data_root', None) or ''
    return {key: next((prefix[k] for k in keys if prefix.get(k)), root) for key, _, keys in _FILES}


def mask_problem(mask: Any, height: int, width: int, decode: bool = False) -> Optional[Tuple[str, str]]:
    """(kind, detail) for an instance mask that would crash or blow up its decoding in an image of
    ``height`` x ``width`` (a polygon far outside, a bad RLE; with ``decode``, an RLE that
    pycocotools, training's decoder, refuses), else None."""
    if not mask:
        return None
    if isinstance(mask, list):
        for polygon in mask:
            problem = polygon_problem(polygon, height, width)
            if problem and problem[0] == POLYGON_OUTSIDE:  # the others mmdet drops or fails on by itself
                return problem
        return None
    problem = rle_problem(mask, height, width)
    if problem or not decode:
        return problem
    try:  # as mmdet's LoadAnnotations decodes it
        rle = mask_utils.frPyObjects(mask, height, width) if isinstance(mask['counts'], list) else mask
        mask_utils.decode(rle)
    except Exception as exc:  # pycocotools' errors: TypeError, ValueError, ...
        return BAD_RLE, f'an RLE pycocotools cannot decode: {type(exc).__name__}: {exc}'
    return None


def check_sample_files(info: dict, folders: Dict[str, str], max_pixels: int = DEFAULT_MAX_PIXELS,
                       decode: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> Optional[Tuple[int, int]]:
    """Check one sample's files before decoding (with ``decode``, decode them too, as the pipelines
    do) and what its annotations ask the decoders for; raises BadSample. Returns the image's
    (height, width) where known (see ``check_image_file``)."""
    sizes = {}
    for key, what, _ in _FILES:
        path = info.get(key)
        if path:
            check_inside(path, folders[key])
            sizes[key] = check_image_file(path, what, max_pixels, decode, max_bytes)
    image, labels = sizes.get('img_path'), sizes.get('seg_map_path')
    if image and labels and tuple(image) != tuple(labels):
        raise BadSample(LABEL_MAP_SIZE, info['seg_map_path'], f'{labels[0]}x{labels[1]} pixels, its image '
                        f'{info["img_path"]} {image[0]}x{image[1]}')
    if image:
        for instance in info.get('instances', ()):
            problem = mask_problem(instance.get('mask'), *image, decode)
            if problem:
                raise BadSample(problem[0], info['img_path'], problem[1])
    return image


def label_values_problem(values: np.ndarray, classes: int, ignore_index: int) -> Optional[str]:
    """What is wrong with a label map's (unique) values for ``classes`` classes, or None."""
    bad = [int(v) for v in values if v != ignore_index and not 0 <= v < classes]
    if bad:
        return f'label values {bad} outside the {classes} classes (0..{classes - 1}, ignore {ignore_index})'
    return None


def _diagnose(info: dict, folders: Dict[str, str], max_pixels: int, max_bytes: int, exc: Exception) -> BadSample:
    """The pipeline failed on a sample whose headers were fine: decode its files to name the culprit."""
    try:
        check_sample_files(info, folders, max_pixels, decode=True, max_bytes=max_bytes)
    except BadSample as found:
        return found
    path = info.get('img_path') or info.get('seg_map_path') or 'a sample'
    return BadSample(PIPELINE_FAILED, path, f'{type(exc).__name__}: {exc}')


class _CheckedSamples:
    """A dataset wrapper whose samples are loaded through ``load``; everything else is the dataset's."""

    def __init__(self, dataset: Union[dict, Any], ignore_index: int = 255,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS, max_image_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.dataset = DATASETS.build(dataset) if isinstance(dataset, dict) else dataset
        self.ignore_index = ignore_index
        self.max_image_pixels, self.max_image_bytes = max_image_pixels, max_image_bytes

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

    def _check_labels(self, sample: dict, info: dict) -> None:
        data_sample = sample.get('data_samples')
        if data_sample is None or 'gt_sem_seg' not in data_sample:
            return
        problem = label_values_problem(np.unique(data_sample.gt_sem_seg.data.numpy()),
                                       len(self.metainfo.get('classes', ())), self.ignore_index)
        if problem:
            raise BadSample(LABELS_OUTSIDE, info.get('seg_map_path') or f'sample of {info.get("img_path")}',
                            problem)

    def load(self, idx: int) -> dict:
        """Sample ``idx`` through the pipeline, its files checked first; raises BadSample."""
        info = self.dataset.get_data_info(idx)
        folders = sample_folders(self.dataset)
        check_sample_files(info, folders, self.max_image_pixels, max_bytes=self.max_image_bytes)
        try:
            sample = self.dataset[idx]
        except BadSample:
            raise
        except Exception as exc:  # a decode error, a transform's, ...; an allocation failure is no bad sample
            if is_out_of_memory(exc):
                raise
            raise _diagnose(info, folders, self.max_image_pixels, self.max_image_bytes, exc) from exc
        self._check_labels(sample, info)
        return sample


@DATASETS.register_module()
class SkipBadSamples(_CheckedSamples):
    """Training-set wrapper: report, count by kind and replace samples that cannot be loaded.

    Segmentation labels are checked too: values outside ``0..num_classes-1`` other than the
    ignore index make the sample bad (they would crash or silently corrupt the loss).
    """

    def __init__(self, dataset: Union[dict, Any], ignore_index: int = 255, max_tries: int = 100,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS, max_image_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(dataset, ignore_index, max_image_pixels, max_image_bytes)
        self.max_tries = max_tries
        self.skipped_by_kind: Counter = Counter()

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by_kind.values())

    def __getitem__(self, idx: int) -> dict:
        for _ in range(self.max_tries):
            try:
                return self.load(idx)
            except BadSample as bad:
                self.skipped_by_kind[bad.kind] += 1
                print_log(f'skipping {bad.path} ({bad.kind}): {bad.detail}; {self.skipped} bad sample(s) '
                          f'so far in this process: {summary(self.skipped_by_kind)}',
                          logger='current', level=logging.WARNING)
                idx = random.randrange(len(self.dataset))
        raise RuntimeError(f'{self.max_tries} samples in a row could not be loaded: '
                           f'the dataset is broken, see the warnings above')


@DATASETS.register_module()
class StopOnBadSamples(_CheckedSamples):
    """Validation- and test-set wrapper: a sample that cannot be loaded stops the run, naming the
    file and its kind (``BadSample``), instead of a traceback or a metric over fewer images."""

    def __getitem__(self, idx: int) -> dict:
        return self.load(idx)
