"""``ResumableAspectRatioBatchSampler``: mmdet's aspect-ratio grouping, started at a batch of the
epoch without loading the batches before. This module imports mmdet (``samplers`` imports it
when a config names the class)."""
from typing import Iterator, List

from mmdet.datasets.samplers import AspectRatioBatchSampler


class ResumableAspectRatioBatchSampler(AspectRatioBatchSampler):
    """``AspectRatioBatchSampler`` whose next epoch may start at a batch: the epoch's indices are
    drawn and grouped as always (reading only the images' sizes from the annotations), and the
    batches before the start are not handed to the data loader, so their images are never read."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._start = 0

    def start_at(self, batches: int) -> None:
        """Begin the next epoch after its first ``batches`` batches."""
        self._start = int(batches)

    def __iter__(self) -> Iterator[List[int]]:
        start, self._start = self._start, 0
        self._aspect_ratio_buckets = [[] for _ in range(2)]  # an abandoned pass leaves no index
        for number, batch in enumerate(super().__iter__()):
            if number >= start:
                yield batch
