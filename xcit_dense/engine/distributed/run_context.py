"""The state of one run in this process: made by ``process_group`` as the run begins, closed as it ends,
so that a second run in the same process (the tests run several) starts clean.

The run's code finds its context through ``current_context``; where no ``process_group`` is open (mmdet's
own tools/train.py on the toolkit's configs, a test that makes its own process group) a default context
serves, made when first asked for. Only what a signal handler needs stays with the process
(``process_wide``).
"""
import signal
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

import torch.distributed as dist

from .compile_bound import CompileBound
from .process_wide import PROCESS
from .wait_bounds import StepWatch, WaitBounds


class Restart(NamedTuple):
    """How many times a group was started again after a failure (0 for a fresh run), and by what."""

    count: int
    by: str  # 'elastic restart' (torchrun --max-restarts), 'Slurm requeue' (sbatch --requeue) or ''


class RunContext:
    """One run's network, Slurm hosts, wait bounds, step watch, gloo side group, reporting lock, compile
    bookkeeping and restart count, and the signal handlers it replaced. ``close`` stops the step watch,
    removes the dynamo callback and puts the replaced handlers back."""

    def __init__(self) -> None:
        self.network = ''  # how gloo/NCCL reach their peers, for the plan line ('' when the defaults were kept)
        self.slurm_hosts: List[str] = []  # the hosts of a Slurm job's node list
        self.bounds = WaitBounds(0, 0)  # set with the process group
        self.watch: Optional[StepWatch] = None  # reports a step that outlives its bound
        self.side_group: Optional[dist.ProcessGroup] = None  # the gloo side group of an NCCL (or other) run
        self.reporting = threading.Lock()  # held by whichever of the main thread and the step watch reports a lost peer
        self.compiles = CompileBound()
        self.restart = Restart(0, '')  # agreed on when the group forms
        self._replaced: Dict[int, Any] = {}  # signal -> the handler before this run's first own one

    def catch_signal(self, signum: int, handler: Any) -> None:
        """Install ``handler`` for ``signum`` for the rest of the run (``close`` puts back the one before)."""
        self._replaced.setdefault(signum, signal.getsignal(signum))
        signal.signal(signum, handler)

    def close(self) -> None:
        """End the run's own threads and callbacks: the step watch stopped, the dynamo callback removed,
        the signal handlers it replaced restored (from the main thread, the only one that may)."""
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        self.compiles.close()
        for signum, handler in self._replaced.items():
            signal.signal(signum, handler)
        self._replaced.clear()


def current_context() -> RunContext:
    """The open run's context: ``process_group``'s, else the process's default one."""
    if PROCESS.context is None:
        PROCESS.context = RunContext()
    return PROCESS.context


@contextmanager
def fresh_context() -> Iterator[RunContext]:
    """A new context for the run inside the block, closed at its end; the one before is current again."""
    before = PROCESS.context
    context = PROCESS.context = RunContext()
    try:
        yield context
    finally:
        context.close()
        PROCESS.context = before
