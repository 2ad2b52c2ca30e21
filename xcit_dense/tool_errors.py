"""How the tools stop: the one place that turns the toolkit's errors into the line a tool prints and its
exit status. The library raises (errors.py); a tool runs its ``main`` through ``exit_status`` and wraps
the library calls whose errors are the user's to fix (a config, a checkpoint, a bad sample) in
``stop_on`` or ``stop_on_bad_samples``, which turn them into a ToolkitError saying what stopped the tool.

Inside ``process_group`` of a multi-process run (engine/distributed/process_group.py) the tool's
ToolkitError ends the process with the same line and status; that is why the blocks turn errors into
a ToolkitError rather than print.
"""
import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Tuple, Type

from .datasets.problems import bad_sample_message
from .errors import Preempted, ToolkitError

Log = Callable[[str], object]  # a logger's method (``runner.logger.error``)


class ToolStop(ToolkitError):
    """A library error that stops a tool (``stop_on``), printed as ``<heading>: <message>``: the heading
    is ``error``, or ``error in CONFIG`` for a config that does not load."""

    def __init__(self, message: str, heading: str = 'error') -> None:
        super().__init__(message)
        self.heading = heading


def how_it_stops(exc: BaseException) -> Optional[Tuple[Optional[str], int]]:
    """The line a tool prints on stderr for ``exc`` (None: silent) and its exit status: a ToolkitError's
    ``<heading>: <message>`` and ``exit_status`` (1; 3 for out of memory), a preemption's 128 + the signal
    number, silently. None for anything else (a bug: its traceback). The one mapping, for ``exit_status``
    and for the multi-process run's ending (engine/distributed/process_group.py)."""
    if isinstance(exc, ToolkitError):
        heading = exc.heading if isinstance(exc, ToolStop) else 'error'
        return f'{heading}: {exc}', exc.exit_status
    if isinstance(exc, Preempted):
        return None, exc.exit_status
    return None


def exit_status(main: Callable[[], None]) -> int:
    """Run a tool's ``main``: 0 when it returns; for the toolkit's errors and a preemption, the status
    ``how_it_stops`` gives, its line printed on stderr. Anything else passes on (a bug: its traceback)."""
    try:
        main()
    except (ToolkitError, Preempted) as exc:
        line, status = how_it_stops(exc)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return status
    return 0


def defer_to_node_leader(grace_s: float = 30.0) -> None:
    """Before a tool stops on an error every process of this node meets alike (its config, its
    files): return at once on local rank 0, on the others only after ``grace_s`` (the launcher ends
    them when rank 0 exits), so that the message is printed once and never lost."""
    if int(os.environ.get('LOCAL_RANK', 0)) != 0:
        time.sleep(grace_s)


@contextmanager
def stop_on(*errors: Type[Exception], prefix: str = '', heading: str = 'error', log: Optional[Log] = None,
            every_rank_alike: bool = False) -> Iterator[None]:
    """Inside the block, an exception of ``errors`` stops the tool: a ToolStop of message ``prefix`` + its
    own under ``heading``; ``every_rank_alike``: an error every process of the node meets alike
    (``defer_to_node_leader``). A ToolkitError stays as it is (its message says all). Either is written
    to ``log`` first: the run's log then says why it ended."""
    try:
        yield
    except ToolkitError as exc:
        if log is not None:
            log(str(exc))
        raise
    except errors as exc:
        stop = ToolStop(f'{prefix}{exc}', heading)
        if log is not None:
            log(str(stop))
        if every_rank_alike:
            defer_to_node_leader()
        raise stop from exc


@contextmanager
def stop_on_bad_samples(loop: str, log: Log) -> Iterator[None]:
    """Inside the block (a validation or test loop), a bad sample (``bad_sample_message``: raised in this
    process or a DataLoader worker) stops the tool, logged first: ``<loop> stopped: <file>: <reason>``.
    The metric would otherwise be over fewer images than the set holds."""
    try:
        yield
    except Exception as exc:
        bad = bad_sample_message(exc)
        if bad is None:
            raise
        log(f'{loop} stopped: {bad}')
        raise ToolStop(f'{loop} stopped: {bad}') from exc
