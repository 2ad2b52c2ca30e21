"""Per-sample augmentation seeding: each sample's random augmentation follows from the sampler's
seed, the sampler's epoch (a pass over the data) and the sample's index in the dataset.

The toolkit's samplers (``samplers``) yield :class:`SampleKey`, an index that carries its epoch,
and give their dataset a batched fetch (``__getitems__``, what torch's data loader calls for a
batch of indices when the dataset has one) that loads each sample under its own seed. A sample is
then augmented the same way whichever worker or rank loads it, and a resumed run that never
loads the samples it skips still augments the rest as the uninterrupted run did.

The seeding covers what pipelines draw from: Python's ``random``, NumPy's global generator and
torch's CPU generator. Their states are put back after each sample, so that loading in the main
process (``num_workers=0``) leaves the streams of training (drop path, dropout) untouched.
"""
import random
from typing import Any, List, Sequence

import numpy as np
import torch


class SampleKey(int):
    """A dataset index, with the sampler's ``epoch`` it was drawn in."""

    epoch: int

    def __new__(cls, index: int, epoch: int) -> 'SampleKey':
        key = super().__new__(cls, index)
        key.epoch = int(epoch)
        return key

    def __reduce__(self):
        return SampleKey, (int(self), self.epoch)

    def __repr__(self) -> str:
        return f'SampleKey({int(self)}, epoch={self.epoch})'


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 32-bit seed of one sample's augmentation (a hash of the three, not their sum: nearby
    seeds, epochs and indices give unrelated streams)."""
    return int(np.random.SeedSequence([seed % 2**32, epoch, index]).generate_state(1)[0])


class SeededItems:
    """A dataset's batched fetch that loads each :class:`SampleKey` under its
    :func:`sample_seed`, leaving the process's generator states as they were."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, int(seed)

    def __call__(self, keys: Sequence[int]) -> List[Any]:
        return [self.load(key) for key in keys]

    def load(self, key: int) -> Any:
        """The sample ``key`` (a plain index: epoch 0), augmented under its own seed."""
        saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        seed = sample_seed(self.seed, getattr(key, 'epoch', 0), int(key))
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)  # the CPU's alone: a GPU's streams are training's
        try:
            return self.dataset[int(key)]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


def seed_per_sample(dataset: Any, seed: int) -> None:
    """Make ``dataset`` load the batches of a data loader under per-sample seeds."""
    dataset.__getitems__ = SeededItems(dataset, seed)
