"""Where a training run stands in its data, as checkpoints record it: the sampler's epoch and the
samples of that epoch that all ranks together have trained on.

Samples, not batches or iterations: a resume under another world size or batch size still knows
how far the epoch went. ``DataPositionHook`` writes and restores the position; engine/training/resume.py
ranks checkpoints by it (:func:`progress_of`).
"""
from typing import Any, NamedTuple, Optional

from ...io.checked_unpickler import brief
from ...io.checkpoint_schema import count, position_of

META_KEY = 'data_position'


class DataPosition(NamedTuple):
    """The sampler's epoch, and the samples of it consumed by all ranks (0: the epoch not begun)."""

    epoch: int
    samples: int

    def as_meta(self) -> dict:
        """What ``checkpoint['meta'][META_KEY]`` holds."""
        return dict(epoch=self.epoch, samples=self.samples)


def recorded_position(meta: dict) -> Optional[DataPosition]:
    """The position a checkpoint's ``meta`` records; None for one written before positions were.
    Raises SchemaError (io/checkpoint_schema.py) for one that is not two counts."""
    position = position_of(meta, META_KEY)
    return None if position is None else DataPosition(*position)


class Progress(NamedTuple):
    """How far the run of a checkpoint got, as its ``meta`` records it, for comparing checkpoints of
    one work dir: the data position first (it holds across batch plans), then the iteration."""

    epoch: int
    samples: int
    iter: int


def progress_of(meta: Any) -> Progress:
    """The :class:`Progress` a checkpoint's ``meta`` records, every field checked (a file is data from
    whoever could write the work dir; io/checkpoint_schema.py): ``iter``, ``epoch`` and the position's
    ``epoch`` and ``samples`` are integers from 0 to 2**48; what is missing counts as 0, a checkpoint
    without a position as the start of its epoch. Raises SchemaError (a ValueError) naming the field
    that is not so."""
    if not isinstance(meta, dict):
        raise ValueError(f'its meta is {brief(meta)}, not a dict')
    iteration = count(meta, 'iter', "its meta's iter")
    position = recorded_position(meta)
    if position is None:
        return Progress(count(meta, 'epoch', "its meta's epoch"), 0, iteration)
    return Progress(position.epoch, position.samples, iteration)


def batch_size(dataloader) -> int:
    """The images per rank of one batch of ``dataloader`` (a DataLoader, or a batch sampler's)."""
    size = getattr(dataloader, 'batch_size', None)
    if size is None:
        size = dataloader.batch_sampler.batch_size
    return int(size)
