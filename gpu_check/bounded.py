"""Subprocesses under a time limit, nothing they started outliving them. Standard library only:
the GPU machine's device check runs it before the stack is installed.

When ``run_bounded`` returns, every process its command started has ended, those in sessions of
their own included (torchrun starts each worker with ``start_new_session``, so killing the
command's process group misses them): ``end_tree`` walks /proc for the descendants by parent pid
before the first signal, stops each one it finds (SIGSTOP: a stopped process neither forks nor
exits, so a second walk finds the complete tree), walks again until nothing new appears, then kills
them all and the command's group. A process orphaned before the walk (its parent ended first and
init adopted it) is out of the walk's reach; torchrun ends its workers before it exits, so that
takes a crash of the launcher itself. (``PR_SET_CHILD_SUBREAPER`` would bring such orphans back,
but it changes the whole calling process, a test runner too, which must then reap every orphan of
every later subprocess.)
"""
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

SETTLE_S = 5.0  # how long killed processes may take to end (SIGKILL acts when each process next runs)
READ_S = 5.0  # how long the output of a killed command is read (a process out of reach may hold the pipe)


class BudgetCut(BaseException):
    """Raised by a caller's timer to cut what it runs (the GPU check's step budget): a BaseException,
    which no ``except Exception`` swallows. On its way out it collects what the cut work had done:
    ``run_bounded`` ends the command it interrupts and appends that command's output to ``outputs``;
    a caller running several commands puts the results it already has into ``kept``."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.outputs: List[str] = []
        self.kept: Dict[str, object] = {}


class BoundedProcess(subprocess.CompletedProcess):
    """A command's outcome; ``killed_after_s``: when it was killed past its limit (None: it ended)."""

    def __init__(self, args, returncode, stdout, stderr, killed_after_s: Optional[float] = None):
        super().__init__(args, returncode, stdout, stderr)
        self.killed_after_s = killed_after_s


def _parents() -> Dict[int, int]:
    """Each running process's parent, per /proc (an ended, unreaped one is left out)."""
    parents = {}
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            state, ppid = stat.read_text().rsplit(')', 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state != 'Z':
            parents[int(stat.parent.name)] = int(ppid)
    return parents


def descendants(pid: int) -> List[int]:
    """The running processes below ``pid`` (children, their children, ...), whatever their session."""
    children: Dict[int, List[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def running(pids: Set[int]) -> List[int]:
    """Those of ``pids`` still running (an ended, unreaped one is not)."""
    alive = _parents()
    return [pid for pid in pids if pid in alive]


def end_tree(proc: subprocess.Popen) -> None:
    """Stop proc and every descendant (walking again until no new one appears), kill them all and
    proc's process group, reap proc, and wait until none of them runs (at most ``SETTLE_S``). Of a
    proc already reaped, only the group is left to kill (its children were orphaned when it ended)."""
    frozen: Set[int] = set()
    while proc.returncode is None:  # not reaped yet: its pid is still its own (an ended, reaped one's is not)
        new = [pid for pid in [proc.pid, *descendants(proc.pid)] if pid not in frozen]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen.update(new)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + SETTLE_S
    while running(frozen - {proc.pid}) and time.monotonic() < deadline:
        time.sleep(0.01)


def _read_rest(proc: subprocess.Popen) -> tuple:
    """What a killed command wrote, read for at most ``READ_S``; the pipes are then closed."""
    try:
        return proc.communicate(timeout=READ_S)
    except subprocess.TimeoutExpired as exc:  # a process out of reach holds the pipe: keep what came
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return tuple(b.decode(errors='replace') if isinstance(b, bytes) else b for b in (exc.output, exc.stderr))


def run_bounded(cmd: List[str], timeout: float, **popen_kwargs) -> BoundedProcess:
    """Run cmd in a session of its own, its output captured unless ``stdout``/``stderr`` say
    otherwise; past ``timeout`` seconds, or when the caller is interrupted (a step's budget), the
    whole tree is ended. Killed past its limit: returncode 'timeout', ``killed_after_s`` set, and
    stderr ending with a line saying so. Cut by a ``BudgetCut``: the captured output so far, with a
    line saying when, is appended to the cut's ``outputs`` (a stuck run can then be diagnosed) and
    the cut goes on."""
    popen_kwargs = dict(dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE), **popen_kwargs)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, text=True, start_new_session=True, **popen_kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed_after = time.monotonic() - start
        end_tree(proc)
        out, err = _read_rest(proc)
        note = f'\n[killed after {killed_after:.1f} s: over its limit of {timeout:g} s; every process it started ended]'
        return BoundedProcess(cmd, 'timeout', out or '', (err or '') + note, killed_after)
    except BudgetCut as cut:
        cut_after = time.monotonic() - start
        end_tree(proc)
        out, err = _read_rest(proc)  # communicate keeps what it read before the cut
        cut.outputs.append((out or '') + (err or '') +
                           f'\n[cut after {cut_after:.1f} s by its caller\'s budget; every process it started ended]')
        raise
    finally:
        end_tree(proc)
    return BoundedProcess(cmd, proc.returncode, out or '', err or '')
