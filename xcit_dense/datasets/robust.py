"""Checked loading of samples: ``SkipBadSamples`` for training sets, ``StopOnBadSamples`` for
validation and test sets.

Before the pipeline decodes a sample, its files are checked (``files``): paths that stay in their
folder, headers within the pixel limit (config key ``max_image_pixels``), RLE masks of the
image's real size. A sample that fails, there or in the pipeline, is
named with its kind (``problems``). Training reports, counts and replaces it, so an epoch is never
lost to one bad sample; validation and test stop, naming the file, since a metric over fewer
images would be wrong.
"""
import logging
import random
from collections import Counter
from typing import Any, Dict, Union

import numpy as np
from mmengine.logging import print_log
from mmengine.registry import DATASETS

from .annotations import rle_problem
from .files import DEFAULT_MAX_PIXELS, IMAGE, LABEL_MAP, check_image_file, check_inside
from .problems import LABELS_OUTSIDE, PIPELINE_FAILED, BadSample, summary

# the data_prefix keys of each sample path (mmdet's, then mmseg's names)
_FILES = (('img_path', IMAGE, ('img', 'img_path')), ('seg_map_path', LABEL_MAP, ('seg', 'seg_map_path')))


def sample_folders(dataset: Any) -> Dict[str, str]:
    """The folder each kind of sample path must stay in: its data prefix, else data_root."""
    prefix, root = getattr(dataset, 'data_prefix', None) or {}, getattr(dataset, 'data_root', None) or ''
    return {key: next((prefix[k] for k in keys if prefix.get(k)), root) for key, _, keys in _FILES}


def check_sample_files(info: dict, folders: Dict[str, str], max_pixels: int = DEFAULT_MAX_PIXELS,
                       decode: bool = False) -> None:
    """Check one sample's files before decoding (with ``decode``, decode them too); raises BadSample."""
    for key, what, _ in _FILES:
        path = info.get(key)
        if not path:
            continue
        check_inside(path, folders[key])
        size = check_image_file(path, what, max_pixels, decode)
        if key != 'img_path' or size is None:
            continue
        for instance in info.get('instances', ()):
            mask = instance.get('mask')
            problem = rle_problem(mask, *size) if mask and not isinstance(mask, list) else None
            if problem:
                raise BadSample(problem[0], path, problem[1])


def _diagnose(info: dict, folders: Dict[str, str], max_pixels: int, exc: Exception) -> BadSample:
    """The pipeline failed on a sample whose headers were fine: decode its files to name the culprit."""
    try:
        check_sample_files(info, folders, max_pixels, decode=True)
    except BadSample as found:
        return found
    path = info.get('img_path') or info.get('seg_map_path') or 'a sample'
    return BadSample(PIPELINE_FAILED, path, f'{type(exc).__name__}: {exc}')


class _CheckedSamples:
    """A dataset wrapper whose samples are loaded through ``load``; everything else is the dataset's."""

    def __init__(self, dataset: Union[dict, Any], ignore_index: int = 255,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.dataset = DATASETS.build(dataset) if isinstance(dataset, dict) else dataset
        self.ignore_index = ignore_index
        self.max_image_pixels = max_image_pixels

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
        values = np.unique(data_sample.gt_sem_seg.data.numpy())
        classes = len(self.metainfo.get('classes', ()))
        bad = [int(v) for v in values if v != self.ignore_index and not 0 <= v < classes]
        if bad:
            raise BadSample(LABELS_OUTSIDE, info.get('seg_map_path') or f'sample of {info.get("img_path")}',
                            f'label values {bad} outside the {classes} classes (0..{classes - 1}, '
                            f'ignore {self.ignore_index})')

    def load(self, idx: int) -> dict:
        """Sample ``idx`` through the pipeline, its files checked first; raises BadSample."""
        info = self.dataset.get_data_info(idx)
        folders = sample_folders(self.dataset)
        check_sample_files(info, folders, self.max_image_pixels)
        try:
            sample = self.dataset[idx]
        except BadSample:
            raise
        except Exception as exc:  # any per-sample failure: a decode error, a transform's, ...
            raise _diagnose(info, folders, self.max_image_pixels, exc) from exc
        self._check_labels(sample, info)
        return sample


@DATASETS.register_module()
class SkipBadSamples(_CheckedSamples):
    """Training-set wrapper: report, count by kind and replace samples that cannot be loaded.

    Segmentation labels are checked too: values outside ``0..num_classes-1`` other than the
    ignore index make the sample bad (they would crash or silently corrupt the loss).
    """

    def __init__(self, dataset: Union[dict, Any], ignore_index: int = 255, max_tries: int = 100,
                 max_image_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        super().__init__(dataset, ignore_index, max_image_pixels)
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
