"""Each rank's own step time and its wait in gradient communication, the same on CPUs and GPUs.

A rank's iteration as the wall clock sees it includes the wait, inside DDP's all-reduce, for the
slowest peer, so every rank's iteration takes as long as the slowest one's. ``time_steps`` registers
DDP's all-reduce, timed, as the wrapper's communication hook (once, before its first forward) and
returns the ``StepClock`` that holds three marks of each step:

- its start: the ``begin_step`` call of its first micro-batch (the runner's ``before_train_iter``,
  after the batch was fetched);
- its last gradient bucket ready (``bucket.is_last()`` in the hook, before that bucket's all-reduce
  is launched): the rank's forward and backward are done;
- the completion of its last all-reduce: each bucket's future notes its completion, the latest counts.

"Own step time" = last bucket ready - start: what the rank computes itself. "Communication wait" = last
completion - last bucket ready: the all-reduce of the last bucket plus any wait for a slower peer (the
earlier buckets' all-reduces overlap the backward and count only where they end later).

A mark is the host clock on CPUs (gloo completes the all-reduces on its worker threads, in no fixed
order: the latest is taken) and a CUDA timing event on GPUs, recorded on the current stream: at the
start and in the hook that is the stream the forward and backward run on, and in a future's callback
it is a stream that waits for the all-reduce (the callback itself runs when the all-reduce is queued,
so the host clock there would be wrong). The events are read when the times are taken (``take``,
once per logger interval), after one synchronisation.

Under gradient accumulation DDP does not communicate for the micro-batches before the last, so a step
spans all its micro-batches (the fetches between them included) up to the last one's last bucket. The
first step of a run is left out: it carries the warm-up (DDP's first backward also fills its buckets
by the parameters' order before rebuilding them in the order they become ready).
"""
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

Mark = Union[float, torch.cuda.Event]  # the host clock (CPU) or a recorded CUDA event


@dataclass
class StepTime:
    """One step's own time and communication wait (seconds)."""

    own_s: float
    wait_s: float


@dataclass
class _Step:
    start: Mark
    ready: Optional[Mark] = None  # the last bucket ready
    done: List[Mark] = field(default_factory=list)  # the all-reduces' completions


class StepClock:
    """The marks of this rank's steps (see the module); ``take`` turns them into ``StepTime``s."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == 'cuda'
        self._running: Optional[_Step] = None  # the step awaiting its last bucket
        self._steps_seen = 0
        self._ended: List[_Step] = []
        self._lock = threading.Lock()  # completions arrive on gloo's threads

    def mark(self) -> Mark:
        """Now: the host clock, or an event recorded on the current CUDA stream."""
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin_step(self) -> None:
        """A micro-batch begins; it starts a step unless an earlier one awaits its last bucket (accumulation)."""
        if self._running is None:
            self._running = _Step(self.mark())

    def bucket_ready(self, bucket: dist.GradBucket) -> Optional[_Step]:
        """A gradient bucket is about to be all-reduced: the last one ends the step's own time. The step
        it belongs to (None outside a timed step)."""
        step = self._running
        if step is not None and bucket.is_last():
            step.ready, self._running = self.mark(), None
            self._steps_seen += 1
            if self._steps_seen > 1:  # the run's first step is not counted (see the module)
                self._ended.append(step)
        return step

    def watch(self, step: Optional[_Step], future: torch.futures.Future) -> torch.futures.Future:
        """``future`` (a bucket's all-reduce) with its completion noted in ``step``; its value unchanged."""
        if step is None:
            return future

        def completed(fut: torch.futures.Future) -> torch.Tensor:
            done = self.mark()
            with self._lock:
                step.done.append(done)
            return fut.value()
        return future.then(completed)

    def take(self) -> List[StepTime]:
        """The ended steps' times since the last call, in order (one CUDA synchronisation on GPUs)."""
        ended, self._ended = self._ended, []
        if ended and self._cuda:
            torch.cuda.synchronize()
        times = []
        for step in ended:
            with self._lock:
                done = list(step.done)
            own = self._seconds(step.start, step.ready)
            wait = max((self._seconds(step.ready, mark) for mark in done), default=0.0)
            times.append(StepTime(own, max(wait, 0.0)))
        return times

    def _seconds(self, start: Mark, end: Mark) -> float:
        if self._cuda:
            return start.elapsed_time(end) / 1e3
        return end - start


class _TimedAllReduce:
    """The state of the communication hook: the clock and the wrapper's process group."""

    def __init__(self, clock: StepClock, group: Optional[dist.ProcessGroup]) -> None:
        self.clock, self.group = clock, group


def _timed_allreduce(state: _TimedAllReduce, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    step = state.clock.bucket_ready(bucket)
    # DDP's own all-reduce (the mean over ranks), its completion noted
    return state.clock.watch(step, allreduce_hook(state.group, bucket))


def time_steps(ddp: torch.nn.parallel.DistributedDataParallel) -> StepClock:
    """Register the timed all-reduce on ``ddp`` (before its first forward; DDP takes one communication
    hook) and return its clock, on the device of the wrapped module's parameters."""
    device = next((p.device for p in ddp.module.parameters()), torch.device('cpu'))
    clock = StepClock(device)
    ddp.register_comm_hook(_TimedAllReduce(clock, ddp.process_group), _timed_allreduce)
    return clock
