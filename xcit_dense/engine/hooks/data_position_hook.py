"""The data position in checkpoints, and a resume that continues at the next sample: no batch
trained twice, none left out, in epoch loops as in iteration loops.

MMEngine's epoch loop starts a resumed epoch from its first batch (a preemption mid-epoch replays
the epoch); its iteration loop skips as many batches as iterations were done, whatever their size.
Here the resumed run continues the checkpoint's epoch in the sampler's order after the samples
already trained. The toolkit's samplers (``datasets.samplers``) start there without producing the
trained batches (an aspect-ratio batch sampler regroups the epoch's indices, loading no image), and
the toolkit's iteration loop (``engine.loops``) iterates over none of them. Other samplers rebuild
the epoch and the trained batches are loaded and dropped.
"""
from typing import Callable, List, Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...datasets.samplers import can_start_at, start_at
from ..data_position import META_KEY, DataPosition, batch_size, recorded_position
from ..dist import world_size


def _set_sampler_epoch(dataloader, epoch: int) -> None:
    """Give the sampler its epoch (its order), as MMEngine's loops do."""
    sampler = getattr(dataloader, 'sampler', None)
    if not hasattr(sampler, 'set_epoch'):
        sampler = getattr(getattr(dataloader, 'batch_sampler', None), 'sampler', None)
    if hasattr(sampler, 'set_epoch'):
        sampler.set_epoch(epoch)


class _ResumedIterations:
    """MMEngine's iteration loop's batch iterator on resume. MMEngine's own skip (one call per iteration
    done) passes without loading anything; the first real call moves the sampler to the
    checkpoint's epoch, drops the batches already trained of it, and then serves batches."""

    def __init__(self, batches, hook: 'DataPositionHook', ignore: int, epoch: int, skip: int,
                 count_skipped: bool) -> None:
        self._batches, self._hook = batches, hook
        self._ignore, self._epoch, self._skip = ignore, epoch, skip
        self._count_skipped = count_skipped  # the position is known only once they are dropped

    def __getattr__(self, name: str):
        return getattr(self._batches, name)

    def __iter__(self) -> '_ResumedIterations':
        return self

    def __next__(self):
        if self._ignore:
            self._ignore -= 1
            return None
        if self._skip is not None:
            inner = self._batches  # MMEngine's _InfiniteDataloaderIterator
            if inner._epoch != self._epoch:
                inner._epoch = self._epoch
                _set_sampler_epoch(inner._dataloader, self._epoch)
                inner._iterator = iter(inner._dataloader)
            for _ in range(self._skip):
                next(inner)
                if self._count_skipped:
                    self._hook.count_batch(inner._epoch)
            self._skip = None
            self._hook.reached()
        return next(self._batches)


@HOOKS.register_module()
class DataPositionHook(Hook):
    """Record the data position (``data_position.DataPosition``) in every checkpoint's meta; on
    resume, continue the sampler's epoch after the samples the checkpoint had trained on.

    The position counts whole batches of this run's world size x images per GPU. A resume under a
    batch that does not divide the samples done continues at the last whole batch (the rest of the
    samples are trained again, said in the log). A checkpoint without a position resumes as
    MMEngine does. Hooks that must act once the run is back at its position (the RNG states, after
    the data loader's iterator drew its base seed and any dropped batches their augmentations)
    register with :func:`when_resumed`.
    """

    priority = 'NORMAL'  # counts before the checkpoint and preemption hooks save (VERY_LOW);
    # before_train before RNGStateHook's (LOW), which registers with when_resumed

    def __init__(self) -> None:
        self._position = DataPosition(0, 0)
        self._loaded: Optional[DataPosition] = None
        self._loop = None
        self._global_batch = 1
        self._waiting: Optional[List[Callable[[], None]]] = None  # until the position is reached

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Note the checkpoint's position (used if the run resumes from it)."""
        self._loaded = recorded_position(checkpoint.get('meta', {}))

    def before_train(self, runner) -> None:
        """Start counting; on resume, start the data after the samples of the checkpoint's epoch
        already trained."""
        loop = self._loop = runner.train_loop
        self._global_batch = batch_size(loop.dataloader) * world_size()
        loaded, self._loaded = self._loaded, None
        self._position = DataPosition(self._sampler_epoch(runner), 0)
        if runner.iter == 0:  # a fresh run, or weights loaded for fine-tuning
            return
        if not hasattr(loop, 'dataloader_iterator'):  # an epoch loop
            if loaded is None or loaded.epoch != runner.epoch:  # no position: the epoch from its start
                return
            skip = min(self._batches_done(runner, loaded), len(loop.dataloader))
            if skip:  # (none: the epoch starts as the loop's own, nothing to wait for)
                self._position = DataPosition(loaded.epoch, skip * self._global_batch)
                self._waiting = []
                self._resume_epoch(runner, skip)
            return
        if getattr(loop, 'positioned', False):  # the toolkit's loop over the toolkit's samplers
            # no position: MMEngine's rule, one batch per iteration done from the first pass
            epoch, skip = (loaded.epoch, self._batches_done(runner, loaded)) if loaded else (0, runner.iter)
            loop.start_data_at(epoch, skip)
            self._position = DataPosition(epoch, skip * self._global_batch)
            return
        self._waiting = []
        batches = loop.dataloader_iterator
        if loaded is None:  # MMEngine's rule: one batch per iteration done, from the first epoch
            loop.dataloader_iterator = _ResumedIterations(batches, self, runner.iter, 0, runner.iter,
                                                          count_skipped=True)
            return
        skip = self._batches_done(runner, loaded)
        self._position = DataPosition(loaded.epoch, skip * self._global_batch)
        loop.dataloader_iterator = _ResumedIterations(batches, self, runner.iter, loaded.epoch, skip,
                                                      count_skipped=False)

    def _batches_done(self, runner, loaded: DataPosition) -> int:
        """This run's batches that hold the checkpoint's samples of its epoch (whole ones)."""
        whole, rest = divmod(loaded.samples, self._global_batch)
        if rest:
            runner.logger.warning(
                f'the checkpoint trained on {loaded.samples} samples of epoch {loaded.epoch}, not a '
                f"multiple of this run's batch of {self._global_batch} (world size x images per "
                f'GPU): continuing after {whole * self._global_batch}, the last {rest} are trained again')
        if loaded.samples:
            how = ('started there' if can_start_at(runner.train_loop.dataloader)
                   else 'loaded and dropped (the toolkit\'s samplers would skip them unloaded)')
            runner.logger.info(f'resuming epoch {loaded.epoch} of the data after {whole} batch(es) '
                               f'of {self._global_batch} samples, {how}')
        return whole

    def _resume_epoch(self, runner, skip: int) -> None:
        """Run the epoch loop's current epoch from batch ``skip`` (its index kept for the hooks),
        without producing the batches before where the samplers can start there; the later epochs
        run as the loop's own."""
        loop = runner.train_loop

        def run_epoch() -> None:
            del loop.run_epoch
            runner.call_hook('before_train_epoch')  # the sampler's epoch is set here
            runner.model.train()
            positioned = can_start_at(loop.dataloader)
            if positioned:
                start_at(loop.dataloader, skip)
            batches = iter(loop.dataloader)  # (its base seed drawn before the RNG states return)
            for _ in range(0 if positioned else skip):
                next(batches)
            self.reached()
            for idx, data_batch in enumerate(batches, start=skip):
                loop.run_iter(idx, data_batch)
            runner.call_hook('after_train_epoch')
            loop._epoch += 1
        loop.run_epoch = run_epoch

    def wait_for_position(self, action: Callable[[], None]) -> bool:
        """Queue ``action`` until the resumed run reaches its position; False: nothing to wait for."""
        if self._waiting is None:
            return False
        self._waiting.append(action)
        return True

    def reached(self) -> None:
        """The resumed run is at its position: run what waited for it."""
        waiting, self._waiting = self._waiting or [], None
        for action in waiting:
            action()

    def count_batch(self, epoch: int) -> None:
        """One more global batch consumed, of the sampler's ``epoch``."""
        samples = self._position.samples if epoch == self._position.epoch else 0
        self._position = DataPosition(epoch, samples + self._global_batch)

    def _sampler_epoch(self, runner) -> int:
        """The epoch the sampler draws from: the loop's in an epoch loop, the iterator's in an
        iteration loop (it starts another pass over the data when one ends)."""
        if not hasattr(self._loop, 'dataloader_iterator'):
            return runner.epoch
        return getattr(self._loop.dataloader_iterator, '_epoch', 0)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.count_batch(self._sampler_epoch(runner))

    def after_train_epoch(self, runner) -> None:
        """An epoch loop's epoch is done: the position is the next one's start."""
        if not hasattr(self._loop, 'dataloader_iterator'):
            self._position = DataPosition(runner.epoch + 1, 0)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})[META_KEY] = self._position.as_meta()


def when_resumed(runner, action: Callable[[], None]) -> None:
    """Run ``action`` once a resumed run is back at its data position (the trained batches
    dropped), or now when there is none to reach."""
    for hook in runner.hooks:
        if isinstance(hook, DataPositionHook) and hook.wait_for_position(action):
            return
    action()

