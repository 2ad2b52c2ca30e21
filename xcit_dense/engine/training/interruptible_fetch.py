"""The training loops' batch fetches, which a stop signal interrupts in a run of one process: a batch
may take long to load (bad samples retried, slow storage), and the run stops at once, with nothing of
the iteration to lose. Ranks of a larger run stop only where they agree (``step_agreement``), so
their fetches are not interrupted.

The preemption hook's signal handler raises ``SignalWhileFetching`` while ``PROCESS.loading`` says
a fetch is under way; the fetch then calls the hooks' ``after_signal_while_fetching(runner, signum)``
(MMEngine's ``call_hook``), where the preemption hook checkpoints the last completed iteration and
stops the run."""
from typing import Any, Callable

from ..distributed.process_group import world_size
from ..distributed.process_wide import PROCESS
from .step_agreement import noted_signal


class SignalWhileFetching(BaseException):
    """Raised by a signal handler inside a batch fetch. A BaseException: no ``except Exception`` of a
    pipeline or of the bad-sample loop swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class InterruptibleFetch:
    """A loop's batch fetches, interrupted by a stop signal (in a run of one process)."""

    def __init__(self, runner) -> None:
        self._runner = runner

    def __call__(self, fetch: Callable[[], Any]) -> Any:
        """``fetch()``, a batch; on a signal noted before or received during the fetch, the hooks'
        ``after_signal_while_fetching`` (the preemption hook's stops the run; without one, the
        fetch goes on)."""
        if world_size() > 1:
            return fetch()
        signum = noted_signal()  # noted during validation, say: stop before loading more
        if not signum:
            PROCESS.loading = True  # (process-wide: the signal handler reads it)
            try:
                return fetch()
            except SignalWhileFetching as stop:
                signum = stop.signum
            finally:
                PROCESS.loading = False
        self._runner.call_hook('after_signal_while_fetching', signum=signum)
        return fetch()
