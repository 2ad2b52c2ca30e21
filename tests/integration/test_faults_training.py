"""Training faults, provoked for real: a NaN loss, a rank killed mid-run, a change of world size."""
import re
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import ROOT, free_port, launch_env, read_log, rewind, run_tool_in_process, tiny_seg_config

from xcit_dense.io.checkpoint import read_checkpoint_file

HOOKS = dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False)


def nan_config(tmp_path, seg_data, iterations=(3,), max_iters=6):
    return tiny_seg_config(
        tmp_path, seg_data, custom_imports=HOOKS,
        custom_hooks=[dict(type='InjectNaNHook', iterations=list(iterations))],
        train_cfg=dict(max_iters=max_iters, val_interval=max_iters),
        default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1), visualization=dict(draw=False)))


def train_here(config: Path, work_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """tools/train.py in this process (run_tool_in_process): these tests read the status, output, log
    and checkpoints of a short run, which need no process of their own."""
    return run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, *args, cwd=cwd)


def test_nan_loss_stops_with_iteration_and_loss_names(tmp_path, seg_data):
    work_dir = tmp_path / 'run'
    proc = train_here(nan_config(tmp_path, seg_data), work_dir, cwd=tmp_path)
    assert proc.returncode != 0
    assert 'non-finite loss at iteration 3: ' in proc.stderr and 'decode.loss_ce=nan' in proc.stderr
    assert 'Traceback' not in proc.stderr.split('error:')[-1]
    # the checkpoint of iteration 2 is the last one, untouched and finite
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_2.pth')
    assert not (work_dir / 'iter_4.pth').exists()
    state = torch.load(work_dir / 'iter_2.pth', weights_only=False)['state_dict']
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_nan_loss_can_be_skipped_and_counted(tmp_path, seg_data):
    """Two of six steps skipped, with an EMA of the weights: the EMA counts the four steps taken. The
    guard reads the losses without torch's warning on a tensor that requires grad made a number."""
    work_dir = tmp_path / 'run'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        proc = train_here(nan_config(tmp_path, seg_data, iterations=(3, 5)), work_dir, '--skip-nonfinite',
                          '--ema', '0.9', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not [str(w.message) for w in caught if 'requires_grad' in str(w.message)]
    log = read_log(work_dir)
    assert 'non-finite loss at iteration 3 (decode.loss_ce=nan): batch skipped (1 so far)' in log
    assert 'batch skipped (2 so far)' in log and 'nonfinite_skipped: 2' in log
    checkpoint = torch.load(work_dir / 'iter_6.pth', weights_only=False)
    assert all(torch.isfinite(v).all() for v in checkpoint['state_dict'].values() if v.is_floating_point())
    assert int(checkpoint['ema_state_dict']['steps']) == 4


@pytest.mark.slow  # a launched 2-process run (about 24 s); the main stage keeps the lost peers' report in process
# (test_wait_bounds) and a launched failing rank (test_first_failure)
def test_killing_one_rank_stops_the_survivor_naming_the_lost_peer(tmp_path, seg_data):
    """The surviving rank exits non-zero soon after, naming the rank that is gone; the last
    checkpoint, written before the kill, is complete."""
    config = tiny_seg_config(
        tmp_path, seg_data, custom_imports=HOOKS,
        custom_hooks=[dict(type='SigkillAfterCheckpointHook', rank=1, after_iter=4)],
        train_cfg=dict(max_iters=50, val_interval=50),
        default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1), visualization=dict(draw=False)))
    work_dir = tmp_path / 'run'
    proc = subprocess.run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '2', '--work-dir',
                           str(work_dir)], env=launch_env(PORT=free_port()), capture_output=True, text=True,
                          timeout=600)
    ended = time.time()
    pid, killed_at = (work_dir / 'killed_rank1').read_text().split()
    assert proc.returncode != 0
    assert ended - float(killed_at) < 60, 'the survivor did not stop within 60 s of the kill'
    out = proc.stdout + proc.stderr
    named = re.search(r'error: rank 0 lost its peers: a collective failed \(.+\); gone: rank 1 \(\S+ pid (\d+)\)',
                      out)
    assert named and named.group(1) == pid, out[-3000:]
    last = work_dir / 'iter_4.pth'
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(last)
    checkpoint = read_checkpoint_file(str(last))
    assert checkpoint['meta']['iter'] == 4 and checkpoint['state_dict']


def group_lrs(checkpoint: Path) -> list:
    groups = torch.load(checkpoint, map_location='cpu', weights_only=False)['optimizer']['param_groups']
    return [(g['layer_id'], g['lr']) for g in groups]


@pytest.mark.slow  # a launched 2-process run (about 18 s); the main stage keeps a resume under a new batch plan
# (test_resume_with_more_accumulation_keeps_the_optimizer_steps) and the layer LRs (test_layer_decay) in process
def test_resume_with_another_world_size_re_resolves_the_plan_and_layer_lrs(tmp_path, seg_data):
    """Trained by 2 processes with --scale-lr under layer-wise LR decay, resumed by one: the plan and the
    LR are re-resolved, and every parameter group's LR stays base x 0.7 ** (5 - layer) of the new base."""
    decay = dict(constructor='XCiTLayerDecayOptimizerConstructor', paramwise_cfg=dict(layer_decay_rate=0.7))
    config = tiny_seg_config(tmp_path, seg_data, optim_wrapper=decay, train_cfg=dict(max_iters=4, val_interval=4),
                             default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1),
                                                visualization=dict(draw=False)))
    work_dir = tmp_path / 'run'
    two = subprocess.run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '2', '--work-dir',
                          str(work_dir), '--scale-lr', '--cfg-options', 'train_cfg.max_iters=2'],
                         env=launch_env(PORT=free_port()), capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-3000:]
    log = two.stdout + two.stderr
    # base lr 6e-5 (the recipe's) x effective batch 4 / reference 16 = 1.5e-5; layer 0 of 5: x 0.7 ** 5
    assert 'layer decay: layer 0/5, lr scale 0.1681 (lr 2.521e-06)' in log
    assert 'layer decay: layer 5/5, lr scale 1 (lr 1.5e-05)' in log
    first = group_lrs(work_dir / 'iter_2.pth')
    assert {layer for layer, _ in first} == {0, 1, 2, 3, 4, 5}
    for layer, lr in first:
        assert lr == pytest.approx(1.5e-5 * 0.7 ** (5 - layer))
    one = train_here(config, work_dir, '--resume', '--scale-lr', cwd=tmp_path)  # one process: this one
    assert one.returncode == 0, one.stderr[-3000:]
    log = one.stdout + one.stderr
    assert 'world size 1, 2 images per GPU, accumulation 1, effective batch 2' in log
    # the new base: 6e-5 x effective batch 2 / reference 16 = 7.5e-6
    assert 'Resuming under a new batch plan: world size 2 -> 1, accumulation 1 -> 1, lr 1.5e-05 -> 7.5e-06' in log
    assert 'resumed epoch: 0, iter: 2' in log
    assert 'RNG state not restored: the checkpoint holds 2 rank(s), this run has 1' in log
    assert 'Iter(train) [4/4]' in log
    # effective batch 2: every group's LR halves, the layer ratios kept
    resumed = group_lrs(work_dir / 'iter_4.pth')
    assert [layer for layer, _ in resumed] == [layer for layer, _ in first]
    for layer, lr in resumed:
        assert lr == pytest.approx(7.5e-6 * 0.7 ** (5 - layer))


def test_resume_with_more_accumulation_keeps_the_optimizer_steps(tmp_path, seg_data, tiny_seg_run):
    """Resumed at accumulation 2 after 2 iterations at accumulation 1 (4 of the 8 images; the session's
    trained run turned back to iteration 2), the run keeps its optimizer steps and continues at the fifth
    image: the samples trained, not the (recounted) iterations, say where."""
    config, work_dir = tiny_seg_run  # 4 iterations planned, each batch's images in samples.txt
    rewind(work_dir, 2)
    again = train_here(config, work_dir, '--resume', '--accumulation', '2', cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    log = again.stdout + again.stderr
    assert 'Resuming under a new batch plan: world size 1 -> 1, accumulation 1 -> 2' in log
    # 2 optimizer steps done = 4 micro-iterations at accumulation 2; 4 steps in all = 8 micro-iterations
    assert 'resumed epoch: 0, iter: 4' in log
    assert re.search(r'Iter\(train\) \[ ?8/8\]', log) and not re.search(r'Iter\(train\) \[ ?[1-4]/8\]', log)
    names = sorted(p.name for p in (seg_data / 'images/training').glob('*.jpg'))
    batches = (work_dir / 'samples.txt').read_text().split('\n')
    assert batches[:3] == [' '.join(names[0:2]), ' '.join(names[2:4]), ' '.join(names[4:6])]
