"""tools/gpu_check.py: every step at tiny sizes on the CPU, results kept step by step, failures
counted from the results, budgets that cut a step, and subprocesses that never outlive it."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, launch_env, spawned
from xcit_dense.acceptance import gpu_check


@pytest.mark.slow  # the whole check: the slow stage
def test_every_step_runs_tiny_on_the_cpu_and_the_benchmark_writes_after_each_backbone(tmp_path):
    """The whole check; the benchmark step's results are on disk after each backbone, read at its log line."""
    benchmark_on_disk = []
    with spawned([sys.executable, str(ROOT / 'tools/gpu_check.py'), '--device', 'cpu', '--tiny',
                  '--out-dir', str(tmp_path / 'out')], env=launch_env(), stdout=subprocess.PIPE,
                 stderr=open(tmp_path / 'stderr', 'w'), text=True) as proc:
        for line in proc.stdout:
            if 'rows written' in line:
                steps = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())['steps']
                benchmark_on_disk.append(steps['benchmark'])
        returncode = proc.wait(timeout=1200)
    stderr = (tmp_path / 'stderr').read_text()
    data = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())
    steps = data['steps']
    assert list(steps) == ['ops', 'det_train', 'seg_train', 'launch', 'compile', 'benchmark'], stderr[-3000:]
    assert returncode == 0, {k: v['failed'] for k, v in steps.items()}
    assert not any(v['failed'] for v in steps.values())
    assert steps['ops']['all_ok'] and len(steps['ops']['rows']) == 19
    det = {row['precision']: row for row in steps['det_train']['rows']}
    assert torch.isfinite(torch.tensor(det['fp32']['loss'])) and 'loss_mask' in det['fp32']['losses']
    assert det['fp16']['skipped'].startswith('not run') and torch.isfinite(torch.tensor(det['bf16']['loss']))
    seg = {row['precision']: row for row in steps['seg_train']['rows']}
    assert seg['bf16']['loss_rel_to_fp32'] < 0.01  # the target for fp16/bf16 on a GPU
    assert {row['status'] for row in steps['benchmark']['rows']} == {'ok'} and 'partial' not in steps['benchmark']
    first, second = gpu_check.benchmark_plan(True)[0]
    assert [[row['model'] for row in step['rows']] for step in benchmark_on_disk] == [[first], [first, second]]
    assert benchmark_on_disk[0]['partial']  # (the last one may already be the final result, written right after)
    assert steps['compile']['max_abs_diff'] < 1e-4
    launch = steps['launch']
    assert launch['exit_status'] == 0 and launch['backend'] == launch['expected_backend'] == 'gloo'
    assert 'world size 1' in launch['plan']
    markdown = (tmp_path / 'out' / 'gpu_check.md').read_text()
    assert '## ops' in markdown and '| mask targets (crop_and_resize) |' in markdown


def test_a_failing_step_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    written = []

    def broken(device):
        written.append(json.loads((tmp_path / 'gpu_check.json').read_text())['steps'])
        raise RuntimeError('no kernel image is available')

    monkeypatch.setattr(gpu_check, 'check_ops', broken)
    monkeypatch.setattr(gpu_check, 'compile_backbone', lambda device, tiny, repeats: dict(speedup=1.0))
    data = gpu_check.run_check(torch.device('cpu'), True, tmp_path, ['compile', 'ops', 'compile'],
                               log=lambda line: None)
    assert [list(steps) for steps in written] == [['compile']]  # on disk before the next step ran
    assert data['steps']['ops']['error'] == 'RuntimeError: no kernel image is available'
    assert data['steps']['compile']['speedup'] == 1.0
    on_disk = json.loads((tmp_path / 'gpu_check.json').read_text())
    assert on_disk['steps']['ops']['error'] == data['steps']['ops']['error']
    assert 'error: RuntimeError: no kernel image' in (tmp_path / 'gpu_check.md').read_text()


def _shifted_roi_align(monkeypatch) -> None:
    """mmcv.ops.roi_align, its outputs shifted by 1e-3 (about 5e-4 of the largest golden value)."""
    import mmcv.ops
    real = mmcv.ops.roi_align
    monkeypatch.setattr(mmcv.ops, 'roi_align', lambda *a, **k: real(*a, **k) + 1e-3)


def test_ops_disagreeing_beyond_the_tolerance_are_flagged(monkeypatch):
    _shifted_roi_align(monkeypatch)
    result = gpu_check.check_ops(torch.device('cpu'))
    flagged = {row['op'] for row in result['rows'] if not row['ok']}
    assert not result['all_ok'] and {'roi_align aligned=True sampling=0', 'roi_align aligned=False sampling=2',
                                     'roi_align from channels_last features'} <= flagged
    assert not {op for op in flagged if 'nms' in op or 'backward' in op}


def test_an_ops_mismatch_fails_its_step_and_the_exit_status(tmp_path, monkeypatch):
    """The installed kernels shifted by 1e-3 against the goldens: the check exits 1, naming the ops."""
    _shifted_roi_align(monkeypatch)
    status = gpu_check.main(['--device', 'cpu', '--tiny', '--steps', 'ops', '--out-dir', str(tmp_path)])
    ops = json.loads((tmp_path / 'gpu_check.json').read_text())['steps']['ops']
    assert status == 1 and ops['all_ok'] is False
    assert any(reason.startswith('roi_align aligned=True sampling=0: max relative difference')
               for reason in ops['failed'])
    assert 'FAILED: roi_align aligned=False sampling=0' in (tmp_path / 'gpu_check.md').read_text()


LAUNCH_OK = dict(exit_status=0, plan='Run plan: world size 1, backend gloo', backend='gloo', syncbn_kept=True,
                 expected_backend='gloo')


@pytest.mark.parametrize('step, result, reason', [
    ('launch', dict(LAUNCH_OK, exit_status=1), 'the launched run exited 1'),
    ('launch', dict(LAUNCH_OK, exit_status='timeout'), 'the launched run exited timeout'),
    ('launch', dict(LAUNCH_OK, backend='gloo', expected_backend='nccl'), 'backend gloo, nccl expected'),
    ('launch', dict(LAUNCH_OK, plan=None, backend=None), 'backend None, gloo expected'),
    ('det_train', dict(rows=[dict(model='Mask R-CNN', precision='fp32', loss=1.0),
                             dict(model='Mask R-CNN', precision='bf16', error='not supported')]),
     'Mask R-CNN bf16: not supported'),
    ('benchmark', dict(rows=[dict(model='swin_t', resolution='512', mode='infer', status='error',
                                  note='exit 1: CUDA error')]), 'swin_t 512 infer: exit 1: CUDA error'),
    ('ops', dict(rows=[], all_ok=False), 'all_ok is False'),
    ('compile', dict(error='cut: over its budget of 5 s', cut=True), 'error: cut: over its budget of 5 s'),
])
def test_results_that_say_a_step_failed_fail_it_and_the_exit_status(step, result, reason):
    assert reason in gpu_check.step_failures(step, result)
    data = dict(steps={'ops': dict(rows=[], all_ok=True, failed=[]),
                       step: dict(result, failed=gpu_check.step_failures(step, result))})
    assert step in gpu_check.failed_steps(data)


def test_results_of_passing_steps_fail_nothing():
    assert gpu_check.step_failures('launch', LAUNCH_OK) == []
    assert gpu_check.step_failures('benchmark', dict(rows=[dict(model='r50', status='ok'),
                                                           dict(model='r50', status='skipped')])) == []
    assert gpu_check.step_failures('ops', dict(rows=[dict(op='nms', ok=True)], all_ok=True)) == []


def test_a_step_over_its_budget_is_cut_recorded_and_the_next_runs(tmp_path):
    data = gpu_check.run_check(torch.device('cpu'), True, tmp_path, ['compile', 'ops'], log=lambda line: None,
                               budgets={'compile': 0.3})
    compiled = data['steps']['compile']
    assert compiled['cut'] and compiled['error'] == 'cut: over its budget of 0.3 s'
    assert compiled['seconds'] < 3 and compiled['failed']
    assert data['steps']['ops']['failed'] == [] and gpu_check.failed_steps(data) == ['compile']
    assert json.loads((tmp_path / 'gpu_check.json').read_text())['steps']['compile']['cut']


def test_a_budget_cut_during_an_import_waits_for_the_import_to_end(tmp_path, monkeypatch):
    """The alarm comes while a module is being imported: the module is still imported whole (a
    half-run module, removed from sys.modules with its registrations kept, breaks every later
    import of it) and the cut comes right after."""
    (tmp_path / 'xcit_budget_probe.py').write_text(
        'import signal, sys\n'
        'from xcit_dense.acceptance import gpu_check\n'
        'gpu_check._budget._expire(signal.SIGALRM, sys._getframe())  # the alarm, during this import\n'
        'WHOLE = True\n')
    monkeypatch.syspath_prepend(tmp_path)
    try:
        with pytest.raises(gpu_check.StepBudgetExceeded):
            with gpu_check._budget(600):
                import xcit_budget_probe  # noqa: F401
                time.sleep(60)  # the deferred cut ends this at once
        assert sys.modules['xcit_budget_probe'].WHOLE
    finally:
        sys.modules.pop('xcit_budget_probe', None)


def _grandchild_command(pid_file: Path) -> list:
    """bash starting a long child of its own, as torchrun starts workers; its pid goes to pid_file."""
    return ['bash', '-c', f'sleep 300 & echo $! > {pid_file}; wait']


def _gone(pid: int) -> bool:
    try:
        state = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return True
    return '\nState:\tZ' in state  # reaped by nobody yet, but ended


def test_a_subprocess_past_its_timeout_is_killed_with_its_children(tmp_path):
    proc = gpu_check.run_bounded(_grandchild_command(tmp_path / 'pid'), timeout=1)
    assert proc.returncode == 'timeout' and 'killed after 1 s' in proc.stderr
    assert _gone(int((tmp_path / 'pid').read_text()))


def test_a_budget_cut_kills_the_running_subprocess_and_its_children(tmp_path):
    with pytest.raises(gpu_check.StepBudgetExceeded):
        with gpu_check._budget(1):
            gpu_check.run_bounded(_grandchild_command(tmp_path / 'pid'), timeout=120)
    assert _gone(int((tmp_path / 'pid').read_text()))
