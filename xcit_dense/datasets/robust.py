"""``SkipBadSamples``, a wrapper for training sets that reports bad data instead of crashing on it.

A sample that fails to load or transform (a missing or corrupt image, a label map with values
outside the classes) is reported, counted and replaced by another one, so an epoch is never lost
to one bad sample.
"""
import logging
import random
from typing import Any, Union

import numpy as np
from mmengine.logging import print_log
from mmengine.registry import DATASETS


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
