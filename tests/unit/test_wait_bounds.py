"""The wait bounds of a run: their variables, the NCCL settings they give, and the step watch that
names a lost peer when a step outlives its bound."""
import subprocess
import sys
import threading
import types

import pytest
from helpers import ROOT, env, free_port

from xcit_dense.engine import wait_bounds as wait_bounds_module
from xcit_dense.engine.wait_bounds import StepWatch, nccl_environment, wait_bounds


def test_bounds_default_and_overrides():
    assert wait_bounds({}) == (300, 1800)
    assert wait_bounds({'XCIT_STEP_TIMEOUT': '20', 'XCIT_WAIT_TIMEOUT': '600'}) == (20, 600)
    with pytest.raises(ValueError, match=r"XCIT_STEP_TIMEOUT must be a positive number of seconds, got '0'"):
        wait_bounds({'XCIT_STEP_TIMEOUT': '0'})
    with pytest.raises(ValueError, match='XCIT_STEP_TIMEOUT=900 is longer than XCIT_WAIT_TIMEOUT=600'):
        wait_bounds({'XCIT_STEP_TIMEOUT': '900', 'XCIT_WAIT_TIMEOUT': '600'})


def test_nccl_settings_follow_the_step_bound_and_keep_the_users(monkeypatch):
    monkeypatch.delenv('TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC', raising=False)
    monkeypatch.setenv('TORCH_NCCL_ASYNC_ERROR_HANDLING', '1')
    settings = nccl_environment(wait_bounds({'XCIT_STEP_TIMEOUT': '100'}))
    assert settings['TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC'] == '220'
    assert settings['TORCH_NCCL_DUMP_ON_TIMEOUT'] == '1' and int(settings['TORCH_NCCL_TRACE_BUFFER_SIZE']) > 0
    assert settings['TORCH_NCCL_ASYNC_ERROR_HANDLING'] == '1'  # the user's


def test_step_watch_fires_once_armed_and_not_after_disarm(monkeypatch):
    """On an injected clock: a step disarmed before its bound never fires, however late the clock runs
    afterwards (under load a real 0.2 s bound could pass before disarm()); an armed one fires, once,
    as soon as the clock passes its bound."""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(wait_bounds_module, 'time', types.SimpleNamespace(monotonic=lambda: clock.now))
    fired = threading.Event()
    seen = []
    watch = StepWatch(lambda: (seen.append(clock.now), fired.set()))
    watch.arm(0.05)  # the watch rechecks every 0.05 s of real time, reading the injected clock
    watch.disarm()
    clock.now += 3600  # far past the disarmed bound
    # a correct watch never fires here, so no load can fail this; a watch that kept the bound would
    # fire within 0.05 s of its recheck
    assert not fired.wait(0.5)
    watch.arm(0.05)
    assert not fired.is_set()  # the clock has not moved: the bound is not reached
    clock.now += 1
    assert fired.wait(60) and seen == [4601.0]


def test_a_step_past_its_bound_is_reported_with_the_resume_hint():
    """The step watch of a real (one-process gloo) group reports while the main thread is stuck,
    and ends the process with status 1."""
    script = ('import time\n'
              'from xcit_dense.engine import dist\n'
              'dist.init_distributed("pytorch")\n'
              'dist._WATCH.arm(1)\n'
              'time.sleep(120)\n')
    variables = dict(XCIT_STEP_TIMEOUT=1, RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR='127.0.0.1',
                     MASTER_PORT=free_port())
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env(**variables))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert 'error: rank 0 lost its peers: a training step has not finished within XCIT_STEP_TIMEOUT=1 s; gone: ' \
           'every rank is still alive. The checkpoints already written are complete: continue with --resume.' \
           in proc.stderr, proc.stderr[-2000:]
