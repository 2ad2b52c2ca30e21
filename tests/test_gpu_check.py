"""tools/gpu_check.py: every step at tiny sizes on the CPU, and results kept step by step."""
import json
import sys

import torch

from helpers import ROOT, run
from xcit_dense.benchmark import gpu_check


def test_every_step_runs_tiny_on_the_cpu(tmp_path):
    proc = run([sys.executable, str(ROOT / 'tools/gpu_check.py'), '--device', 'cpu', '--tiny',
                '--out-dir', str(tmp_path)], timeout=1200)
    data = json.loads((tmp_path / 'gpu_check.json').read_text())
    steps = data['steps']
    assert list(steps) == ['ops', 'det_train', 'seg_train', 'benchmark', 'compile', 'launch'], proc.stderr[-3000:]
    assert proc.returncode == 0, {k: v.get('error') for k, v in steps.items()}
    assert steps['ops']['all_ok'] and len(steps['ops']['rows']) == 5
    det = {row['precision']: row for row in steps['det_train']['rows']}
    assert torch.isfinite(torch.tensor(det['fp32']['loss'])) and 'loss_mask' in det['fp32']['losses']
    seg = {row['precision']: row for row in steps['seg_train']['rows']}
    assert seg['bf16']['loss_rel_to_fp32'] < 0.01  # the target for fp16/bf16 on a GPU
    assert {row['status'] for row in steps['benchmark']['rows']} == {'ok'}
    assert steps['compile']['max_abs_diff'] < 1e-4
    launch = steps['launch']
    assert launch['exit_status'] == 0 and launch['backend'] == launch['expected_backend'] == 'gloo'
    assert 'world size 1' in launch['plan']
    markdown = (tmp_path / 'gpu_check.md').read_text()
    assert '## ops' in markdown and '| roi_align (mask targets) |' in markdown


def test_a_failing_step_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    written = []

    def broken(device, tiny):
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


def test_ops_disagreeing_beyond_the_tolerance_are_flagged(monkeypatch):
    import torchvision
    real = torchvision.ops.roi_align
    monkeypatch.setattr(torchvision.ops, 'roi_align', lambda *a, **k: real(*a, **k) + 1e-3)
    result = gpu_check.check_ops(torch.device('cpu'), tiny=True)
    flagged = {row['op'] for row in result['rows'] if not row['ok']}
    assert not result['all_ok'] and {'RoIAlign (mmcv kernel)', 'roi_align (mask targets)'} <= flagged
    assert not flagged & {'nms (kept indices)', 'batched_nms (kept indices)'}
