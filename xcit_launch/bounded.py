"""Subprocesses under a time limit: each in a session of its own, the whole group killed past the
limit or when the caller is interrupted (a step's budget), so nothing it started outlives it.
Standard library only: the GPU machine's device check runs it before the stack is installed."""
import os
import signal
import subprocess
from typing import List


def kill_group(proc: subprocess.Popen) -> None:
    """Kill proc's process group (what is left of it), then reap proc."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


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
