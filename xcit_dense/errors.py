"""The toolkit's own reasons to stop a run, as exceptions: the library raises them and never ends the
process; the tools run their ``main`` through ``tool_errors.exit_status``, which turns them into exit statuses
(in a multi-process run, ``engine.distributed.process_group.process_group`` ends the process alike). Called
from a notebook or a sweep, the toolkit raises instead of exiting.
"""
import signal


class ToolkitError(Exception):
    """A failure whose message says all a user needs (what is wrong, what to do): the tools print
    ``error: <message>`` without a traceback and exit with ``exit_status`` (1; a subclass may name its own)."""

    exit_status = 1


class ConfigNotFoundError(ToolkitError, FileNotFoundError):
    """The config file a tool was given does not exist."""


class RankSetupError(ToolkitError):
    """This process cannot take part in a multi-process run (its wait bounds are set wrongly, its GPU
    cannot run the ops or is not its own), found before the process group forms or, for a GPU that
    two ranks drive, as it forms."""


class Preempted(BaseException):
    """The run stopped on a preemption signal after writing its checkpoint (``PreemptionHook``).

    A BaseException, as a signal's KeyboardInterrupt is: no ``except Exception`` of a pipeline, a
    hook or a retry loop may swallow the stop. The tools exit silently with ``exit_status``,
    128 + the signal number, as a shell reports a process ended by that signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f'stopped by {signal.Signals(signum).name} after writing a checkpoint')
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class UnsafeOutputError(ToolkitError):
    """A file the toolkit would write (a config dump, results.json, a picture, a plot, an export) is a
    link, or the log folder is a link, holds one or belongs to another user: nothing is written
    through it (``io.output_files``)."""
