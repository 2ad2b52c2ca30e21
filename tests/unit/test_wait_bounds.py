"""The wait bounds of a run: their variables, the NCCL settings they give, and the step watch that
names a lost peer when a step outlives its bound."""
import subprocess
import sys
import threading
import types

import pytest
from helpers import ROOT, env, free_port

from xcit_dense.engine.distributed import wait_bounds as wait_bounds_module
from xcit_dense.engine.distributed.wait_bounds import StepWatch, nccl_environment, wait_bounds


def test_bounds_default_and_overrides():
    assert wait_bounds({}) == (300, 1800, 900)
    assert wait_bounds({'XCIT_STEP_TIMEOUT': '20', 'XCIT_WAIT_TIMEOUT': '600',
                        'XCIT_COMPILE_TIMEOUT': '60'}) == (20, 600, 60)
    with pytest.raises(ValueError, match=r"XCIT_COMPILE_TIMEOUT must be a positive number of seconds, got '-1'"):
        wait_bounds({'XCIT_COMPILE_TIMEOUT': '-1'})
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
              'from xcit_dense.engine.distributed import process_group as dist\n'
              'from xcit_dense.engine.distributed.run_context import current_context\n'
              'dist.init_distributed("pytorch")\n'
              'current_context().watch.arm(1)\n'
              'time.sleep(120)\n')
    variables = dict(XCIT_STEP_TIMEOUT=1, RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR='127.0.0.1',
                     MASTER_PORT=free_port())
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env(**variables))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert 'error: rank 0 lost its peers: a training step has not finished within XCIT_STEP_TIMEOUT=1 s; gone: ' \
           'every rank is still alive. The checkpoints already written are complete: continue with --resume.' \
           in proc.stderr, proc.stderr[-2000:]


def test_step_watch_asks_once_for_more_time_and_fires_when_that_passes_too(monkeypatch):
    """On an injected clock: past its bound the watch asks for an extension (a rank compiling) and
    does not fire within it; past the extension it fires, without asking again. Without an
    extension it fires at the bound."""
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(wait_bounds_module, 'time', types.SimpleNamespace(monotonic=lambda: clock.now))
    asked, fired, seen = threading.Event(), threading.Event(), []

    def extension():
        asked.set()
        return 0.5

    watch = StepWatch(lambda: (seen.append(clock.now), fired.set()), extension)
    watch.arm(0.05)
    clock.now += 0.1  # past the bound
    assert asked.wait(60)
    # within the extension (the clock stands still): a correct watch never fires here; one that does
    # not extend fires within 0.05 s of asking
    assert not fired.wait(0.6) and watch.granted_s == 0.5
    clock.now += 0.5  # past the extension
    assert fired.wait(60) and seen == [1000.6]

    plain = threading.Event()
    watch = StepWatch(plain.set, lambda: 0)
    watch.arm(0.05)
    clock.now += 0.1
    assert plain.wait(60) and watch.granted_s == 0
