"""Subprocesses under a time limit: each in a session of its own, the whole group killed past the
limit or when the caller is interrupted (a step's budget), so nothing it started outlives it.
Standard library only: the GPU machine's device check runs it before the stack is installed."""
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import List

SETTLE_S = 5.0  # how long a killed group may take to end (SIGKILL acts when each process next runs)


def group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (per /proc; an ended, unreaped one does not)."""
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            state, _, group = stat.read_text().rsplit(')', 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state != 'Z' and int(group) == pgid:
            return True
    return False


def kill_group(proc: subprocess.Popen) -> None:
    """Kill proc's process group (what is left of it), reap proc, and wait until none of the group runs."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + SETTLE_S
    while group_runs(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def run_bounded(cmd: List[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """Run cmd, its output captured unless ``stdout``/``stderr`` say otherwise; past ``timeout``
    seconds the group is killed and returncode is 'timeout'."""
    popen_kwargs = dict(dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE), **popen_kwargs)
    proc = subprocess.Popen(cmd, text=True, start_new_session=True, **popen_kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, 'timeout', out or '', (err or '') + f'\n[killed after {timeout:.0f} s]')
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out or '', err or '')
