"""``ResumableIterBasedTrainLoop``: MMEngine's iteration loop, resumed without iterating over the
trained batches.

MMEngine's ``IterBasedTrainLoop`` starts its data loader when it is built (its workers prefetch the
first batches of the run) and, on resume, calls ``next()`` once per iteration done, loading every
trained batch again. This loop, when its samplers can start at a position (``datasets.samplers``),
starts its data loader only once ``DataPositionHook`` has placed them (``start_data_at``, on
resume) or at the first batch, and then trains from the next batch. With other samplers it runs as
MMEngine's loop.
"""
from typing import Any, Union

from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator
from torch.utils.data import DataLoader

from ..datasets.samplers import can_start_at, start_at


class _NotStarted:
    """What MMEngine's loop builds its data iterator from while this loop defers it: the dataset
    (for its metainfo) and no batches."""

    def __init__(self, dataloader: DataLoader) -> None:
        self.dataset = dataloader.dataset

    def __iter__(self):
        return iter(())


class _StartedOnDemand(_InfiniteDataloaderIterator):
    """MMEngine's endless iterator over a data loader, whose first pass starts when asked
    (``start``, once the samplers are placed) or else at the first batch."""

    def __init__(self, dataloader: DataLoader) -> None:  # (MMEngine's starts the pass here)
        self._dataloader, self._iterator, self._epoch = dataloader, None, 0

    def start(self, epoch: int) -> None:
        """Start the pass of the sampler's ``epoch`` (the data loader draws its base seed now)."""
        self._epoch = epoch
        self._iterator = iter(self._dataloader)

    @property
    def started(self) -> bool:
        return self._iterator is not None

    def __next__(self):
        if not self.started:
            self.start(self._epoch)
        return super().__next__()


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(IterBasedTrainLoop):
    """``IterBasedTrainLoop`` that starts its data at the run's position (see the module)."""

    def __init__(self, runner, dataloader: Union[DataLoader, dict], *args: Any, **kwargs: Any) -> None:
        if isinstance(dataloader, dict):  # built as MMEngine's BaseLoop builds it
            dataloader = runner.build_dataloader(
                dataloader, seed=runner.seed, diff_rank_seed=runner._randomness_cfg.get('diff_rank_seed', False))
        self.positioned = can_start_at(dataloader)
        super().__init__(runner, _NotStarted(dataloader) if self.positioned else dataloader, *args, **kwargs)
        self.dataloader = dataloader
        if self.positioned:  # hooks may wrap the iterator in before_train: it exists, unstarted
            self.dataloader_iterator = self._batches = _StartedOnDemand(dataloader)

    def start_data_at(self, epoch: int, batches: int) -> None:
        """Start the data at the sampler's ``epoch``, after its first ``batches`` batches (from a
        hook's ``before_train``: the pass, whose data loader draws its base seed from torch's
        generator, starts before the RNG states are restored)."""
        if not self.positioned:
            raise RuntimeError("this loop's samplers cannot start at a position")
        sampler = self.dataloader.batch_sampler.sampler
        if hasattr(sampler, 'set_epoch'):
            sampler.set_epoch(epoch)
        start_at(self.dataloader, batches)
        self._batches.start(epoch)

    def run(self) -> Any:
        """Train from the current iteration to the last."""
        if not self.positioned:
            return super().run()
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')  # the whole run counts as one epoch, as in MMEngine
        if self._iter:
            if not self._batches.started:  # resumed without DataPositionHook: MMEngine's rule
                self.start_data_at(0, self._iter)
            print_log(f'resumed at iteration {self._iter}: the data continues at the next sample, '
                      'without loading the trained ones', logger='current')
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            self.run_iter(next(self.dataloader_iterator))
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._iter >= self.val_begin
                    and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
                self.runner.val_loop.run()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model
