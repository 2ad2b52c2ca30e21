"""The toolkit's training loops: MMEngine's epoch and iteration loops whose data, on resume, continues
at the checkpoint's data position, and which say when it stands there.

``start_data_at(epoch, batches)`` (called by ``DataPositionHook`` in ``before_train``) places the data
at a batch of the sampler's epoch. The toolkit's samplers (``datasets.samplers``) start their pass
there without producing the batches before; with other samplers the loop loads and drops them (the
trained batches are loaded again, said in the log). ``when_at_position`` runs an action once the
pass has begun at its position, before its first batch loads: the RNG states are restored then
(``RNGStateHook``), after the data loader drew its base seed from torch's generator.

``ToolkitRunner`` runs a config's ``EpochBasedTrainLoop`` and ``IterBasedTrainLoop`` as these.
The iteration loop starts its data loader at its first batch (MMEngine's starts it when the loop is
built), and MMEngine's resume skip, one ``next`` per iteration done, gets ``None`` without loading.

Both loops time their batch fetches (``fetch_clock``, a ``FetchClock``): every ``next`` of the
batches the loop trains on, and the start of each pass over the data loader (its workers starting),
batches loaded and dropped on resume included. ``RankFiguresHook`` reads it as the data wait.
In a run of one process a stop signal interrupts each batch fetch (``InterruptibleFetch``).
"""
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from ...datasets.samplers import can_start_at, start_at
from .interruptible_fetch import InterruptibleFetch


class FetchClock:
    """Seconds a training loop spent fetching batches, since last taken."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def take(self) -> float:
        """The seconds since the last call (and start again from zero)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def timed(self, fetch: Callable[[], Any]) -> Any:
        """``fetch()``, its duration added (also when it raises, e.g. ``StopIteration``)."""
        start = time.perf_counter()
        try:
            return fetch()
        finally:
            self.seconds += time.perf_counter() - start


class _TimedBatches:
    """An iterator of batches whose every ``next`` is interruptible and timed on a ``FetchClock``."""

    def __init__(self, batches: Iterator, clock: FetchClock, interruptible: InterruptibleFetch) -> None:
        self._batches, self._clock, self._interruptible = batches, clock, interruptible

    def __iter__(self) -> '_TimedBatches':
        return self

    def __next__(self) -> Any:
        return self._clock.timed(lambda: self._interruptible(lambda: next(self._batches)))


def set_sampler_epoch(dataloader: Any, epoch: int) -> None:
    """Give the data loader's sampler (or its batch sampler's) its epoch, as MMEngine's loops do."""
    sampler = getattr(dataloader, 'sampler', None)
    if not hasattr(sampler, 'set_epoch'):
        sampler = getattr(getattr(dataloader, 'batch_sampler', None), 'sampler', None)
    if hasattr(sampler, 'set_epoch'):
        sampler.set_epoch(epoch)


def how_placed(positioned: bool) -> str:
    """How the batches before a resumed position are passed over, for the log."""
    return 'started there' if positioned else "loaded and dropped (the toolkit's samplers would skip them unloaded)"


class _Waiting:
    """Actions waiting until a resumed run's data stands at its position (None: nothing to wait for)."""

    def __init__(self, waiting: bool) -> None:
        self._actions: Optional[List[Callable[[], None]]] = [] if waiting else None

    def wait(self) -> None:
        if self._actions is None:
            self._actions = []

    def add(self, action: Callable[[], None]) -> None:
        if self._actions is None:
            action()
        else:
            self._actions.append(action)

    def reached(self) -> None:
        actions, self._actions = self._actions or [], None
        for action in actions:
            action()


class _EpochPass:
    """The data loader of one epoch as the epoch loop iterates over it: the pass, and each batch,
    timed on the loop's ``FetchClock``, each batch fetched interruptibly; a resumed pass begins after
    its first ``skip`` batches (started there, or loaded and dropped), then calls ``reached``.
    Everything else, read or set (by hooks during the epoch), is the data loader's."""

    _OWN = ('dataloader', 'skip', 'positioned', 'reached', 'clock', 'interruptible')

    def __init__(self, dataloader: DataLoader, skip: int, positioned: bool, reached: Callable[[], None],
                 clock: FetchClock, interruptible: InterruptibleFetch) -> None:
        for name, value in zip(self._OWN, (dataloader, skip, positioned, reached, clock, interruptible)):
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataloader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:  # (e.g. mmdet's PipelineSwitchHook restarting persistent workers)
            setattr(self.dataloader, name, value)

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> _TimedBatches:
        return _TimedBatches(self.clock.timed(self._begin), self.clock, self.interruptible)

    def _begin(self) -> Iterator:
        if not self.skip:
            return iter(self.dataloader)
        if self.positioned:
            start_at(self.dataloader, self.skip)
        batches = iter(self.dataloader)  # (the base seed drawn before the RNG states return)
        for _ in range(0 if self.positioned else self.skip):
            self.interruptible(lambda: next(batches))
        self.reached()
        return batches


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` whose resumed epoch continues at a batch (see the module); its batches
    keep their index in the epoch (the log's ``[epoch][batch/batches]``, the checkpoint schedule)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.positioned = can_start_at(self.dataloader)
        self._skip = 0  # batches of the current epoch before this run's first
        self._waiting = _Waiting(False)
        self.fetch_clock = FetchClock()
        self._interruptible = InterruptibleFetch(self.runner)

    def start_data_at(self, epoch: int, batches: int) -> None:
        """Run the current ``epoch`` from its batch ``batches`` on (on resume, before training)."""
        if epoch != self.epoch:
            raise ValueError(f'the data of epoch {epoch} cannot start in epoch {self.epoch} of the loop')
        self._skip = int(batches)
        if self._skip:
            self._waiting.wait()

    def when_at_position(self, action: Callable[[], None]) -> None:
        """Run ``action`` once a resumed epoch's pass has begun at its batch, or now."""
        self._waiting.add(action)

    def run_epoch(self) -> None:
        """MMEngine's ``run_epoch`` over the data loader's pass (``_EpochPass``: timed, resumed)."""
        dataloader = self.dataloader
        self.dataloader = _EpochPass(dataloader, self._skip, self.positioned, self._waiting.reached, self.fetch_clock,
                                     self._interruptible)
        try:
            super().run_epoch()
        finally:
            self.dataloader, self._skip = dataloader, 0

    def run_iter(self, idx: int, data_batch: Any) -> None:
        super().run_iter(idx + self._skip, data_batch)


class _Unstarted:
    """What MMEngine's iteration loop builds its batch iterator from (which the toolkit's replaces):
    the dataset, for its metainfo, and no batches."""

    def __init__(self, dataloader: DataLoader) -> None:
        self.dataset = dataloader.dataset

    def __iter__(self):
        return iter(())


class _EndlessBatches:
    """An iteration loop's batches: passes over the data loader one after another (the sampler's epoch
    set to the pass's number), the first one begun at its first batch, at the position ``place`` set;
    each fetch interruptible and timed. ``ignore`` calls get ``None`` (MMEngine's resume skip)."""

    def __init__(self, dataloader: DataLoader, positioned: bool, reached: Callable[[], None],
                 clock: FetchClock, interruptible: InterruptibleFetch) -> None:
        self.dataloader, self.positioned, self.reached, self.clock = dataloader, positioned, reached, clock
        self.interruptible = interruptible
        self.epoch = 0  # the pass
        self.batches = 0  # of this pass, handed out or passed over
        self.ignore = 0
        self._pass = None

    def place(self, epoch: int, batches: int) -> None:
        if self._pass is not None:
            raise RuntimeError('the data has started: its position can no longer be set')
        self.epoch, self.batches = int(epoch), int(batches)

    def __iter__(self) -> '_EndlessBatches':
        return self

    def __next__(self) -> Any:
        if self.ignore:
            self.ignore -= 1
            return None
        return self.clock.timed(lambda: self.interruptible(self._next))

    def _next(self) -> Any:
        if self._pass is None:
            self._begin()
        try:
            batch = next(self._pass)
        except StopIteration:
            self.epoch, self.batches = self.epoch + 1, 0
            set_sampler_epoch(self.dataloader, self.epoch)
            self._pass = iter(self.dataloader)
            batch = next(self._pass)
        self.batches += 1
        return batch

    def _begin(self) -> None:
        set_sampler_epoch(self.dataloader, self.epoch)
        if self.positioned:
            start_at(self.dataloader, self.batches)
        self._pass = iter(self.dataloader)  # (the base seed drawn before the RNG states return)
        if not self.positioned:
            skip, self.batches = self.batches, 0
            for _ in range(skip):
                self._next()
        self.reached()


def _diff_rank_seed(runner) -> bool:
    """The run's ``randomness.diff_rank_seed``, as MMEngine's loops build their data loader with it."""
    randomness = getattr(runner, 'randomness', None) or runner.cfg.get('randomness') or {}
    return bool(randomness.get('diff_rank_seed', False))


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(IterBasedTrainLoop):
    """``IterBasedTrainLoop`` whose data starts at its first batch and at the run's position (see the
    module)."""

    def __init__(self, runner, dataloader: Union[DataLoader, dict], *args: Any, **kwargs: Any) -> None:
        if isinstance(dataloader, dict):  # built as MMEngine's loops build it
            dataloader = runner.build_dataloader(dataloader, seed=runner.seed, diff_rank_seed=_diff_rank_seed(runner))
        super().__init__(runner, _Unstarted(dataloader), *args, **kwargs)
        self.dataloader = dataloader
        self.positioned = can_start_at(dataloader)
        self._waiting = _Waiting(True)  # until the first batch: the data starts there
        self.fetch_clock = FetchClock()
        self.dataloader_iterator = _EndlessBatches(dataloader, self.positioned, self._waiting.reached, self.fetch_clock,
                                                   InterruptibleFetch(runner))

    def start_data_at(self, epoch: int, batches: int) -> None:
        """Start the data at batch ``batches`` of the sampler's ``epoch`` (on resume, before training)."""
        self.dataloader_iterator.place(epoch, batches)

    def when_at_position(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the data has begun at its position (at the first batch)."""
        self._waiting.add(action)

    @property
    def data_position(self) -> Tuple[int, int]:
        """The sampler's epoch (the pass over the data) and the batches of it trained."""
        return self.dataloader_iterator.epoch, self.dataloader_iterator.batches

    def run(self) -> Any:
        """MMEngine's ``run``; on resume its skip of the iterations done loads nothing, and the data
        continues at its position (without ``DataPositionHook``: one batch per iteration done)."""
        if self.iter:
            batches = self.dataloader_iterator
            batches.place(0, self.iter)  # MMEngine's rule, unless a hook places it in before_train
            batches.ignore = self.iter
            self.when_at_position(lambda: print_log(
                f'resumed at iteration {self.iter}: the data continues after {batches.batches} batch(es) of '
                f'pass {batches.epoch}, ' + ('without loading the trained ones' if self.positioned
                                             else how_placed(False)), logger='current'))
        return super().run()
