"""Where a training run stands in its data, as checkpoints record it: the sampler's epoch and the
samples of that epoch that all ranks together have trained on.

Samples, not batches or iterations: a resume under another world size or batch size still knows
how far the epoch went. ``DataPositionHook`` writes and restores the position; engine/resume.py
ranks checkpoints by it (:func:`progress_of`).
"""
from typing import Any, NamedTuple, Optional

import numpy as np

from ..io.checked_unpickler import LARGEST_INT, brief

META_KEY = 'data_position'


class DataPosition(NamedTuple):
    """The sampler's epoch, and the samples of it consumed by all ranks (0: the epoch not begun)."""

    epoch: int
    samples: int

    def as_meta(self) -> dict:
        """What ``checkpoint['meta'][META_KEY]`` holds."""
        return dict(epoch=self.epoch, samples=self.samples)


def recorded_position(meta: dict) -> Optional[DataPosition]:
    """The position a checkpoint's ``meta`` records; None for one written before positions were."""
    recorded = meta.get(META_KEY)
    if not isinstance(recorded, dict):
        return None
    return DataPosition(int(recorded['epoch']), int(recorded['samples']))


class Progress(NamedTuple):
    """How far the run of a checkpoint got, as its ``meta`` records it, for comparing checkpoints of
    one work dir: the data position first (it holds across batch plans), then the iteration."""

    epoch: int
    samples: int
    iter: int


def _count(record: dict, key: str, where: str) -> int:
    value = record.get(key, 0)
    if not (type(value) is int or isinstance(value, np.integer)) or not 0 <= value < LARGEST_INT:
        raise ValueError(f'its meta\'s {where} is {brief(value)}, not an integer from 0 to 2**48')
    return int(value)


def progress_of(meta: Any) -> Progress:
    """The :class:`Progress` a checkpoint's ``meta`` records, every field checked (a file is data from
    whoever could write the work dir): ``iter``, ``epoch`` and the position's ``epoch`` and ``samples``
    are integers from 0 to 2**48; what is missing counts as 0, a checkpoint without a position as the
    start of its epoch. Raises ValueError naming the field that is not so."""
    if not isinstance(meta, dict):
        raise ValueError(f'its meta is {brief(meta)}, not a dict')
    iteration = _count(meta, 'iter', 'iter')
    position = meta.get(META_KEY)
    if position is None:
        return Progress(_count(meta, 'epoch', 'epoch'), 0, iteration)
    if not isinstance(position, dict) or set(position) != {'epoch', 'samples'}:
        raise ValueError(f'its meta\'s {META_KEY} is {brief(position)}, not a dict of epoch and samples')
    return Progress(_count(position, 'epoch', f'{META_KEY} epoch'), _count(position, 'samples',
                                                                        f'{META_KEY} samples'), iteration)


def batch_size(dataloader) -> int:
    """The images per rank of one batch of ``dataloader`` (a DataLoader, or a batch sampler's)."""
    size = getattr(dataloader, 'batch_size', None)
    if size is None:
        size = dataloader.batch_sampler.batch_size
    return int(size)
