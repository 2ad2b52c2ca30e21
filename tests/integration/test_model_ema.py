"""--ema: the average steps once per optimizer step, resumes exactly after a preemption, and is what
tools/test.py evaluates by default (the trained weights with --raw-weights)."""
import math
import shutil
import signal

import pytest
import torch
from helpers import launch_env, read_log, run, run_tool_in_process, tiny_seg_config, train_cmd

from xcit_dense.io.averaged_weights import trained_weights

pytestmark = pytest.mark.slow

DECAY, WARMUP = 0.9, 1.0  # a short warm-up: the second update's weight (0.22) tells one update from three


def ema_config(tmp_path, seg_data, hooks=()):
    """The tiny config: 2 optimizer steps of accumulation 2 (4 micro-batches of 2 images), a checkpoint
    after each step."""
    return tiny_seg_config(
        tmp_path, seg_data,
        custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=list(hooks), model_ema=dict(warmup=WARMUP),
        train_cfg=dict(max_iters=2, val_interval=2),
        default_hooks=dict(checkpoint=dict(interval=1), logger=dict(interval=1), visualization=dict(draw=False)))


def load(path):
    return torch.load(path, weights_only=False, map_location='cpu')


def test_ema_steps_per_optimizer_step_resumes_exactly_and_is_what_test_evaluates(tmp_path, seg_data):
    config = ema_config(tmp_path, seg_data)
    whole = run(train_cmd(config, tmp_path / 'whole', '--ema', str(DECAY), '--accumulation', '2'), env=launch_env())
    assert whole.returncode == 0, whole.stderr[-3000:]
    log = read_log(tmp_path / 'whole')
    assert 'EMA of the weights: decay 0.9 per optimizer step (effective batch 4, accumulation 2)' in log
    first, second = load(tmp_path / 'whole/iter_2.pth'), load(tmp_path / 'whole/iter_4.pth')
    w1, w2 = trained_weights(first), trained_weights(second)
    # the first update copies the weights; the second moves the average by (1 - m) exp(-2 / warm-up) + m
    weight = (1 - (1 - DECAY)) * math.exp(-2 / WARMUP) + (1 - DECAY)
    moved = 0
    for key, value in w2.items():
        if not value.is_floating_point():
            continue
        torch.testing.assert_close(first['state_dict'][key], w1[key], rtol=0, atol=0, msg=key)
        torch.testing.assert_close(second['state_dict'][key], w1[key] + weight * (w2[key] - w1[key]),
                                   rtol=1e-6, atol=1e-7, msg=key)
        moved += not torch.equal(w1[key], w2[key])
    assert moved > 10  # the weights trained between the two steps

    # cut by SIGTERM after the first optimizer step, resumed: weights and average as the whole run's
    (tmp_path / 'cut').mkdir()
    cut_config = ema_config(tmp_path / 'cut', seg_data, hooks=[dict(type='SigtermAfterIterHook', after_iter=2)])
    args = ('--ema', str(DECAY), '--accumulation', '2')
    cut = run(train_cmd(cut_config, tmp_path / 'cut/run', *args), env=launch_env())
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    resumed = run(train_cmd(cut_config, tmp_path / 'cut/run', *args, '--resume'), env=launch_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    end = load(tmp_path / 'cut/run/iter_4.pth')
    for part in ('state_dict', 'ema_state_dict'):
        assert end[part].keys() == second[part].keys()
        for key, value in second[part].items():
            torch.testing.assert_close(end[part][key], value, rtol=1e-6, atol=1e-7, msg=f'{part} {key}')

    # tools/test.py: the average by default, the trained weights on request, each named
    shutil.copy(tmp_path / 'whole/iter_4.pth', tmp_path / 'ema.pth')
    averaged = run_tool_in_process('tools/test.py', config, tmp_path / 'ema.pth', '--work-dir', 'avg', cwd=tmp_path)
    raw = run_tool_in_process('tools/test.py', config, tmp_path / 'ema.pth', '--work-dir', 'raw', '--raw-weights',
                              cwd=tmp_path)
    assert averaged.returncode == 0 and raw.returncode == 0, averaged.stderr + raw.stderr
    avg_log, raw_log = read_log(tmp_path / 'avg'), read_log(tmp_path / 'raw')
    assert 'weights: the EMA average of' in avg_log and 'weights: the trained weights of' in raw_log
    metric = [line.split('mIoU:')[1].split()[0] for line in (avg_log, raw_log) for line in line.splitlines()
              if 'mIoU:' in line]
    assert len(metric) == 2 and metric[0] != metric[1], metric
