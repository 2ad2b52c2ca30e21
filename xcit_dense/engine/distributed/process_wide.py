"""The only run state held by the process rather than by a run's context (``run_context.RunContext``).

Three things must be process-wide:

- the stop signal a handler noted, and whether the main thread is fetching the next training batch
  (the preemption hook's handler reads it, to stop at once): a signal handler belongs to the process
  (``signal.signal``), runs in the main thread between any two of its bytecodes, and receives no
  argument but the signal, so what it writes and reads can only be found through the process;
- which run context is open: MMEngine builds the toolkit's hooks from configs, dynamo and signal
  handlers call back without arguments, so the code they run finds its run through the process.

Everything else of a run lives in its context, made and closed by ``process_group``.
"""
from typing import Any


class ProcessWide:
    """The process's noted signal, its batch-fetching flag and its open run context."""

    def __init__(self) -> None:
        self.signal = 0  # the stop signal this process received since the last step agreement (0: none)
        self.loading = False  # the main thread is waiting for the next training batch (it may be interrupted)
        self.context: Any = None  # the open ``RunContext`` (None: the default one is made when first asked for)


PROCESS = ProcessWide()
