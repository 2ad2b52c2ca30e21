"""How long a rank waits for its peers: a short bound inside a training step, a longer one elsewhere.

A peer that is lost without closing its connections (a stopped process, a node gone from the
network) shows up only as a wait that never ends. Inside a training step every rank does the same
work, so a few minutes are plenty (``XCIT_STEP_TIMEOUT``, default 300 s). Between steps and
before the first one the waits are legitimately long: rank 0 evaluating COCO while the others
wait, a checkpoint being written, datasets being built, the first step's compilation
(``XCIT_WAIT_TIMEOUT``, default 1800 s). The process groups start with the long bound;
``hooks.step_bound.StepBoundHook`` switches them to the step bound around each step after the first.

A run that compiles its backbone may compile again inside a later step (a new input size of
multi-scale training), on one rank only while its peers wait for it in a collective. A compile on
any rank inside a step extends that step's bound on every rank by ``XCIT_COMPILE_TIMEOUT`` (default
900 s; see ``engine.distributed.compile_bound``), granted by the ``StepWatch`` when the step bound runs out.

On GPUs the NCCL watchdog enforces the bound: ``nccl_environment`` sets torch's NCCL variables
(unless set already). The NCCL watchdog ends the process without a Python error, so a
``StepWatch`` thread names the lost ranks first (the toolkit's own message, with the ``--resume``
hint) and leaves NCCL ``DUMP_ALLOWANCE_S`` seconds to write its flight-recorder dump.
"""
import os
import sys
import threading
import time
from typing import Callable, Dict, NamedTuple, Optional

STEP_VARIABLE = 'XCIT_STEP_TIMEOUT'
WAIT_VARIABLE = 'XCIT_WAIT_TIMEOUT'
COMPILE_VARIABLE = 'XCIT_COMPILE_TIMEOUT'
DEFAULT_STEP_S = 300
DEFAULT_WAIT_S = 1800
DEFAULT_COMPILE_S = 900  # a cold inductor compile of a backbone's forward and backward takes minutes
DUMP_ALLOWANCE_S = 60  # NCCL's step timeout is this much longer than the toolkit's, for its dump


class WaitBounds(NamedTuple):
    step_s: int  # a training step's collectives
    wait_s: int  # everything else: set-up, evaluation, checkpoint writes, the first step
    compile_s: int = DEFAULT_COMPILE_S  # added to a step's bound where a rank compiles in that step


def _seconds(env, name: str, default: int) -> int:
    text = env.get(name) or str(default)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f'{name} must be a positive number of seconds, got {text!r}')
    return int(text)


def wait_bounds(env=os.environ) -> WaitBounds:
    """The bounds from ``XCIT_STEP_TIMEOUT``, ``XCIT_WAIT_TIMEOUT`` and ``XCIT_COMPILE_TIMEOUT`` (defaults
    300 s, 1800 s and 900 s)."""
    bounds = WaitBounds(_seconds(env, STEP_VARIABLE, DEFAULT_STEP_S), _seconds(env, WAIT_VARIABLE, DEFAULT_WAIT_S),
                        _seconds(env, COMPILE_VARIABLE, DEFAULT_COMPILE_S))
    if bounds.step_s > bounds.wait_s:
        raise ValueError(f'{STEP_VARIABLE}={bounds.step_s} is longer than {WAIT_VARIABLE}={bounds.wait_s}: '
                         f'the step bound is the shorter one')
    return bounds


def nccl_environment(bounds: WaitBounds) -> Dict[str, str]:
    """torch's NCCL variables for these bounds; a value the user set is kept (``os.environ`` wins).

    Async error handling 3 (torch's default, named here): a timed-out collective ends the process
    instead of leaving later CUDA work on undefined data. The flight recorder keeps the last
    collectives and is dumped on a timeout. The heartbeat monitor ends a process whose watchdog
    itself is stuck (inside a CUDA call) after the step bound plus twice the dump allowance."""
    wanted = {'TORCH_NCCL_ASYNC_ERROR_HANDLING': '3',
              'TORCH_NCCL_TRACE_BUFFER_SIZE': '2000',
              'TORCH_NCCL_DUMP_ON_TIMEOUT': '1',
              'TORCH_NCCL_ENABLE_MONITORING': '1',
              'TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC': str(bounds.step_s + 2 * DUMP_ALLOWANCE_S)}
    return {name: os.environ.get(name) or value for name, value in wanted.items()}


class StepWatch:
    """A daemon thread that reports once when an armed step outlives its bound.

    ``arm(seconds)`` at the start of a step, ``disarm()`` at its end. When ``seconds`` pass in
    between, the thread first asks ``extension()`` for more time, once per armed step (the seconds to
    add, 0 for none; ``granted_s`` keeps the answer); when none is given, or that time passes too,
    ``on_expiry()`` runs in the thread (it reports and ends the process). ``stop()`` ends the thread
    without a report, as the run ends."""

    def __init__(self, on_expiry: Callable[[], None], extension: Callable[[], float] = lambda: 0.0) -> None:
        self._on_expiry = on_expiry
        self._extension = extension
        self._deadline: Optional[float] = None
        self._armed = 0  # arm() calls so far: an extension asked for in one step applies to that step only
        self._asked = False  # whether the armed step's extension was asked for
        self.granted_s = 0.0  # the extension granted to the armed step
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name='xcit_step_watch', daemon=True)
        self._thread.start()

    def arm(self, seconds: float) -> None:
        with self._changed:
            self._deadline = time.monotonic() + seconds
            self._armed += 1
            self._asked, self.granted_s = False, 0.0
            self._changed.notify()

    def disarm(self) -> None:
        with self._changed:
            self._deadline = None
            self._changed.notify()

    def stop(self) -> None:
        """End the thread without a report and wait for it (a report under way ends the process first)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                if self._stopped:
                    return
                if self._deadline is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                if self._asked:
                    break
                armed = self._armed
            extra = self._ask_extension()  # outside the lock: it may ask the store, arm() and disarm() must not wait
            with self._changed:
                if self._armed == armed and self._deadline is not None:  # still the step it was asked for
                    self._asked, self.granted_s = True, extra
                    self._deadline += extra
        try:
            self._on_expiry()
        except BaseException as exc:  # noqa: B902  (the thread must end the process in every case)
            print(f'error: the step watch failed while reporting: {exc!r}', file=sys.stderr, flush=True)
            os._exit(1)

    def _ask_extension(self) -> float:
        try:
            return max(0.0, float(self._extension()))
        except Exception as exc:  # no extension then: the bound holds as it was
            print(f'warning: the step watch could not ask for more time: {exc!r}', file=sys.stderr, flush=True)
            return 0.0
