"""Samplers that start at a position of their epoch without producing the samples before it, and
seed each sample's augmentation (``sample_seeding``): a resume continues at its next sample
without loading those already trained.

- ``ResumableSampler``: MMEngine's ``DefaultSampler`` (same order for a seed and epoch), for
  epoch loops and under batch samplers.
- ``ResumableInfiniteSampler``: an endless stream for iteration loops, one pass over the data
  after another, pass ``p`` in ``DefaultSampler``'s order of epoch ``p``; the pass is the epoch
  of each sample's seed.
- ``ResumableAspectRatioBatchSampler`` (module ``aspect_ratio``, which imports mmdet): mmdet's
  ``AspectRatioBatchSampler``, whose batches group each index with earlier ones; it rebuilds the
  epoch's batches from the indices alone and hands out those after its start.

:func:`start_at` places a data loader's sampler or batch sampler at a batch of its next pass.
"""
import itertools
from typing import Any, Iterator, List, Optional

import torch
from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.registry import DATA_SAMPLERS

from .sample_seeding import SampleKey, seed_per_sample


@DATA_SAMPLERS.register_module()
class ResumableSampler(DefaultSampler):
    """``DefaultSampler`` whose next pass may start after some of this rank's samples, and whose
    samples are augmented under per-sample seeds. ``len`` stays the whole epoch's (the loops
    number the batches of an epoch by it)."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: Optional[int] = None,
                 round_up: bool = True) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed, round_up=round_up)
        self._start = 0
        seed_per_sample(dataset, self.seed)

    def start_at(self, samples: int) -> None:
        """Begin the next pass after this rank's first ``samples`` samples of the epoch."""
        self._start = int(samples)

    def __iter__(self) -> Iterator[SampleKey]:
        start, self._start = self._start, 0
        for index in itertools.islice(super().__iter__(), start, None):
            yield SampleKey(index, self.epoch)


@DATA_SAMPLERS.register_module()
class ResumableInfiniteSampler(InfiniteSampler):
    """An endless stream of samples for iteration loops: pass ``p`` over the data in
    ``DefaultSampler``'s order at epoch ``p`` (shuffled under ``seed + p``), the stream dealt to
    the ranks in turn as ``InfiniteSampler`` deals it. It can start at any position of the stream
    (the samples all ranks took before) without drawing the passes before."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: Optional[int] = None) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed)
        self._start = 0
        seed_per_sample(dataset, self.seed)

    def start_at(self, samples: int) -> None:
        """Begin the next iteration after this rank's first ``samples`` samples of the stream."""
        self._start = int(samples)

    def _pass(self, number: int) -> List[int]:
        """The order of pass ``number`` over the data."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + number)
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self) -> Iterator[SampleKey]:
        start, self._start = self._start, 0
        position = start * self.world_size + self.rank  # in the stream of all ranks
        number, order = -1, []
        while True:
            current, offset = divmod(position, self.size)
            if current != number:
                number, order = current, self._pass(current)
            yield SampleKey(order[offset], number)
            position += self.world_size


@DATA_SAMPLERS.register_module(name='ResumableAspectRatioBatchSampler')
def _build_aspect_ratio_batch_sampler(**kwargs: Any) -> Any:
    """Build a ``ResumableAspectRatioBatchSampler`` named in a config (mmdet imported only then)."""
    from .aspect_ratio import ResumableAspectRatioBatchSampler
    return ResumableAspectRatioBatchSampler(**kwargs)


def can_start_at(dataloader: Any) -> bool:
    """Whether :func:`start_at` can place ``dataloader``: its sampler is the toolkit's (which seeds
    each sample: skipped samples then leave the others' augmentations as they were), under the
    toolkit's batch sampler or a plain ``BatchSampler``."""
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    return hasattr(getattr(batch_sampler, 'sampler', None), 'start_at') and (
        hasattr(batch_sampler, 'start_at') or type(batch_sampler) is torch.utils.data.BatchSampler)


def start_at(dataloader: Any, batches: int) -> None:
    """Start the next pass of ``dataloader`` after its first ``batches`` batches, without producing
    them (see :func:`can_start_at`)."""
    if not can_start_at(dataloader):
        raise TypeError(f'{type(dataloader.batch_sampler).__name__} cannot start at a batch: '
                        'use the samplers of xcit_dense.datasets.samplers')
    batch_sampler = dataloader.batch_sampler
    if hasattr(batch_sampler, 'start_at'):
        batch_sampler.start_at(batches)
    else:  # plain batches: runs of the sampler's indices
        batch_sampler.sampler.start_at(batches * batch_sampler.batch_size)
