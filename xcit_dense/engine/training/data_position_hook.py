"""The data position in checkpoints, and a resume that continues at the next sample: no batch
trained twice, none left out, in epoch loops as in iteration loops.

MMEngine's epoch loop starts a resumed epoch from its first batch (a preemption mid-epoch replays
the epoch); its iteration loop skips as many batches as iterations were done, whatever their size.
Here the resumed run continues the checkpoint's epoch in the sampler's order after the samples
already trained: the hook tells the toolkit's loops (``engine.training.loops``, which ``ToolkitRunner`` runs
for MMEngine's) where to start, and they start the samplers there.
"""
from typing import Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..distributed.process_group import world_size
from .data_position import META_KEY, DataPosition, batch_size, recorded_position
from .loops import ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop, how_placed

TOOLKIT_LOOPS = (ResumableEpochBasedTrainLoop, ResumableIterBasedTrainLoop)


@HOOKS.register_module()
class DataPositionHook(Hook):
    """Record the data position (``data_position.DataPosition``) in every checkpoint's meta; on
    resume, continue the sampler's epoch after the samples the checkpoint had trained on.

    The position counts whole batches of this run's world size x images per GPU. A resume under a
    batch that does not divide the samples done continues at the last whole batch (the rest of the
    samples are trained again, said in the log). A checkpoint without a position resumes as
    MMEngine does. A loop other than the toolkit's records no position and resumes as it does.
    """

    priority = 'NORMAL'  # before the checkpoint and preemption hooks save (VERY_LOW); before_train
    # before RNGStateHook's (LOW), which waits for the position this one places

    def __init__(self) -> None:
        self._loop = None  # the toolkit's loop being trained
        self._position: Optional[DataPosition] = None  # an epoch loop's, counted here
        self._loaded: Optional[DataPosition] = None
        self._global_batch = 1

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Note the checkpoint's position (used if the run resumes from it)."""
        self._loaded = recorded_position(checkpoint.get('meta', {}))

    def before_train(self, runner) -> None:
        """Start counting; on resume, start the data after the samples of the checkpoint's epoch
        already trained."""
        loop = runner.train_loop
        loaded, self._loaded, self._loop, self._position = self._loaded, None, None, None
        if not isinstance(loop, TOOLKIT_LOOPS):
            runner.logger.warning(f'{type(loop).__name__} is not one of the toolkit\'s loops '
                                  '(engine/training/loops.py): checkpoints record no data position, '
                                  'a resume continues as the loop does')
            return
        self._loop, self._global_batch = loop, batch_size(loop.dataloader) * world_size()
        if isinstance(loop, ResumableIterBasedTrainLoop):  # the loop keeps its position
            if runner.iter and loaded is not None:  # (none: the loop's own rule, a batch per iteration done)
                loop.start_data_at(loaded.epoch, self._batches_done(runner, loaded))
            return
        self._position = DataPosition(runner.epoch, 0)
        if runner.iter == 0:  # a fresh run, or weights loaded for fine-tuning
            return
        if loaded is None or loaded.epoch != runner.epoch:  # no position: the epoch from its start
            return
        skip = min(self._batches_done(runner, loaded), len(loop.dataloader))
        loop.start_data_at(loaded.epoch, skip)
        self._position = DataPosition(loaded.epoch, skip * self._global_batch)

    def _batches_done(self, runner, loaded: DataPosition) -> int:
        """This run's batches that hold the checkpoint's samples of its epoch (whole ones)."""
        whole, rest = divmod(loaded.samples, self._global_batch)
        if rest:
            runner.logger.warning(
                f'the checkpoint trained on {loaded.samples} samples of epoch {loaded.epoch}, not a '
                f"multiple of this run's batch of {self._global_batch} (world size x images per "
                f'GPU): continuing after {whole * self._global_batch}, the last {rest} are trained again')
        if loaded.samples:
            runner.logger.info(f'resuming epoch {loaded.epoch} of the data after {whole} batch(es) '
                               f'of {self._global_batch} samples, {how_placed(runner.train_loop.positioned)}')
        return whole

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """An epoch loop's batch ``batch_idx`` of its epoch is trained."""
        if self._position is not None:
            self._position = DataPosition(runner.epoch, (batch_idx + 1) * self._global_batch)

    def after_train_epoch(self, runner) -> None:
        """An epoch loop's epoch is done: the position is the next one's start."""
        if self._position is not None:
            self._position = DataPosition(runner.epoch + 1, 0)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if isinstance(self._loop, ResumableIterBasedTrainLoop):
            epoch, batches = self._loop.data_position
            position = DataPosition(epoch, batches * self._global_batch)
        elif self._position is not None:
            position = self._position
        else:
            return
        checkpoint.setdefault('meta', {})[META_KEY] = position.as_meta()
