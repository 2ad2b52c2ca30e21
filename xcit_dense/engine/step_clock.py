"""Each rank's own step time: from the start of its optimizer step to its first gradient bucket.

A rank's iteration as the wall clock sees it includes the wait, inside DDP's all-reduce, for the
slowest peer, so every rank's iteration takes as long as the slowest one's. What a rank computes
on its own ends when its first gradient bucket is ready: DDP then hands that bucket to its
communication hook. ``time_first_bucket`` registers such a hook (the plain all-reduce, timed) on
a DDP wrapper, once, before its first forward; ``StepClock`` holds the times.

Counting: a step starts at the ``begin_step`` call of its first micro-batch (the runner's
``before_train_iter``, after the batch was fetched) and ends at its first bucket. Under gradient
accumulation DDP does not communicate for the micro-batches before the last, so the step spans
all its micro-batches (the fetches between them included) up to the last one's first bucket. The
first step of a run is left out: DDP's first backward puts its gradients in buckets by the
parameters' order (it rebuilds them in the order they become ready afterwards), so its first
bucket may be ready only at the end of the backward, and that step carries the warm-up.
"""
import time
from typing import List, Optional

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


class StepClock:
    """The own step times of this rank (seconds) since they were last taken."""

    def __init__(self) -> None:
        self._start: Optional[float] = None  # the running step's start; None: no step running
        self._steps_seen = 0
        self._times: List[float] = []

    def begin_step(self) -> None:
        """A micro-batch begins; it starts a step unless an earlier one awaits its bucket (accumulation)."""
        if self._start is None:
            self._start = time.perf_counter()

    def bucket_ready(self) -> None:
        """A gradient bucket is ready: the first one of a step ends the step's own time."""
        if self._start is None:
            return
        elapsed, self._start = time.perf_counter() - self._start, None
        self._steps_seen += 1
        if self._steps_seen > 1:  # the run's first step is not counted (see the module)
            self._times.append(elapsed)

    def take(self) -> List[float]:
        """The own step times since the last call, in order."""
        times, self._times = self._times, []
        return times


class _TimedAllReduce:
    """The state of the communication hook: the clock and the wrapper's process group."""

    def __init__(self, clock: StepClock, group: Optional[dist.ProcessGroup]) -> None:
        self.clock, self.group = clock, group


def _timed_allreduce(state: _TimedAllReduce, bucket: dist.GradBucket):
    state.clock.bucket_ready()
    return allreduce_hook(state.group, bucket)  # DDP's own all-reduce (the mean over ranks)


def time_first_bucket(ddp) -> StepClock:
    """Register the timed all-reduce on ``ddp`` (a ``DistributedDataParallel``, before its first
    forward; DDP takes one communication hook) and return its clock."""
    clock = StepClock()
    ddp.register_comm_hook(_TimedAllReduce(clock, ddp.process_group), _timed_allreduce)
    return clock
