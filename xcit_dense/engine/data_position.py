"""Where a training run stands in its data, as checkpoints record it: the sampler's epoch and the
samples of that epoch that all ranks together have trained on.

Samples, not batches or iterations: a resume under another world size or batch size still knows
how far the epoch went. ``DataPositionHook`` writes and restores the position; engine/resume.py
ranks checkpoints by it.
"""
from typing import NamedTuple, Optional

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


def progress_key(meta: dict) -> tuple:
    """How far the run of a checkpoint got, for comparing checkpoints of one work dir: the data
    position first (it holds across batch plans), then the iteration. A checkpoint without a
    position counts as the start of its epoch."""
    position = recorded_position(meta) or DataPosition(int(meta.get('epoch', 0)), 0)
    return position.epoch, position.samples, int(meta.get('iter', 0))


def batch_size(dataloader) -> int:
    """The images per rank of one batch of ``dataloader`` (a DataLoader, or a batch sampler's)."""
    size = getattr(dataloader, 'batch_size', None)
    if size is None:
        size = dataloader.batch_sampler.batch_size
    return int(size)
