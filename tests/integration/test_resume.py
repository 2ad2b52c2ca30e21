"""Resuming: what a run continues from, that an automatic resume reads its checkpoint once, and that a
preempted epoch-based detector continues at its next sample."""
import json
import re
import signal
import sys

import pytest
import torch
from helpers import (
    ROOT,
    SGD,
    find_resumable_checkpoint,
    free_port,
    hooked_config,
    launch_env,
    read_log,
    resumable,
    run,
    run_together,
    tiny_seg_config,
    train_cmd,
)
from mmengine.config import Config

from xcit_dense.datasets.synthetic import write_coco_set
from xcit_dense.engine.distributed.run_context import Restart, current_context
from xcit_dense.engine.training.resume import Resume

# tools/train.py run with every torch.load noted (the file it read; '(meta)' after it when its tensors' data
# was not read: read_without_data) in $READS at exit
COUNTED_TRAIN = f"""
import atexit, json, os, runpy, sys
import torch
import xcit_dense.engine.training.resume as resume
import xcit_dense.io.checkpoint as checkpoint
reads, load, whole_read, without_data = [], torch.load, checkpoint.load_weights_file, resume.read_without_data
def counted(f, *args, **kwargs):  # a read around the toolkit's reader would come through here
    reads.append(str(f))
    return load(f, *args, **kwargs)
def counted_whole(path, *args):  # every whole read of the toolkit's reader
    reads.append(str(path))
    return whole_read(path, *args)
def counted_without_data(path):  # the scan of the candidates
    reads.append(str(path) + ' (meta)')
    return without_data(path)
torch.load, checkpoint.load_weights_file, resume.read_without_data = counted, counted_whole, counted_without_data
atexit.register(lambda: open(os.environ['READS'], 'w').write(json.dumps(reads)))
sys.argv = [{str(ROOT / 'tools/train.py')!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_an_automatic_resume_reads_the_checkpoint_once(tmp_path, seg_data, tiny_seg_run):
    """--resume on a work dir with iter_2.pth and iter_4.pth: the newest checkpoint is found (each one's
    meta read, its tensors' data not), seeded from, checked against the model and resumed from, on one read of
    that file (the hooks get the same contents)."""
    _, work_dir = tiny_seg_run  # trained once for the session to iteration 4
    reads = tmp_path / 'reads.json'
    again = hooked_config(tmp_path, seg_data, max_iters=6, interval=2)
    proc = run([sys.executable, '-c', COUNTED_TRAIN, str(again), '--work-dir', str(work_dir), '--resume',
                '--cfg-options', 'randomness.seed=None'], env=launch_env(READS=reads))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-2000:]
    assert 'resumed epoch: 0, iter: 4' in output and 'RNG states restored from the checkpoint' in output
    newest, older = str(work_dir / 'iter_4.pth'), str(work_dir / 'iter_2.pth')
    read = json.loads(reads.read_text())
    assert sorted(read[:2]) == [f'{older} (meta)', f'{newest} (meta)'] and read[2:] == [newest], read


@pytest.fixture
def work_dir(tmp_path):
    """A work dir with iter_2.pth and iter_4.pth (the newest), and a checkpoint elsewhere."""
    for done, name in ((2, 'run/iter_2.pth'), (4, 'run/iter_4.pth'), (0, 'other.pth')):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        torch.save(resumable(done, meta={'seed': 5, 'name': name, 'iter': done, 'epoch': 0}), tmp_path / name)
    return tmp_path / 'run'


@pytest.mark.parametrize('asked, restarted, chosen', [
    (None, 0, None), ('auto', 0, 'run/iter_4.pth'), ('other.pth', 0, 'other.pth'),
    # a restarted group continues from the newest of its work dir, even when a path was given
    (None, 1, 'run/iter_4.pth'), ('other.pth', 1, 'run/iter_4.pth')])
def test_what_a_run_resumes_from(work_dir, monkeypatch, asked, restarted, chosen):
    monkeypatch.setattr(current_context(), 'restart', Restart(restarted, 'elastic restart' if restarted else ''))
    root = work_dir.parent
    point = Resume.choose(str(work_dir), asked if asked in (None, 'auto') else str(root / asked))
    assert point.path == (chosen and str(root / chosen))
    assert (point.checkpoint or {}).get('meta', {}).get('name') == chosen
    cfg = Config(dict(randomness=dict(seed=None)))
    point.configure(cfg)
    assert (cfg.get('resume'), cfg.get('load_from'), cfg.randomness.seed) == (
        (True, point.path, 5) if chosen else (None, None, None))


def test_a_restarted_group_without_a_checkpoint_starts_from_the_beginning(tmp_path, monkeypatch):
    monkeypatch.setattr(current_context(), 'restart', Restart(1, 'Slurm requeue'))
    point = Resume.choose(str(tmp_path / 'run'), None)
    assert point.path is None
    assert point.describe_starting_point(str(tmp_path / 'run')) == [
        'Slurm requeue 1 of the group (SLURM_RESTART_COUNT): resuming from the beginning (no complete '
        'checkpoint yet)', f'--resume: no checkpoint in {tmp_path / "run"} yet, starting from the beginning']


def preempted_detector_config(tmp_path):
    """The demo's Mask R-CNN (the toolkit's aspect-ratio batch sampler over its shuffling sampler, random
    flips, an LR schedule by iteration) with a tiny backbone: 4 images of 64 px, batches of 2, 2 epochs
    of 2 iterations; SIGTERM after $XCIT_TEST_SIGTERM_AT iterations; each image the pipeline loads
    noted in $XCIT_TEST_LOADS, each batch trained in samples.txt."""
    data = tmp_path / 'coco'
    write_coco_set(data, 'train', 4, size=(64, 64), seed=0)
    pipeline = [dict(type='CountLoads'), dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
                dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                dict(type='Resize', scale=(128, 128), keep_ratio=True), dict(type='RandomFlip', prob=0.5),
                dict(type='PackDetInputs')]  # the demo's, counted
    loader = (f'dict(batch_size=2, num_workers=0, persistent_workers=False, '
              f'dataset=dict(data_root="{data}/", pipeline={pipeline!r}))')
    config = tmp_path / 'tiny_mask_rcnn.py'
    config.write_text('\n'.join([
        f"_base_ = [{str(ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py')!r}]",
        "custom_imports = dict(imports=['xcit_dense', 'xcit_dense.models.kernel_dtypes', 'launch_hooks'], "
        'allow_failed_imports=False)',
        'model = dict(backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3)), '
        'neck=dict(in_channels=[64] * 4))',
        f'train_dataloader = {loader}',
        'val_dataloader = None', 'val_cfg = None', 'val_evaluator = None', 'test_dataloader = None',
        'test_cfg = None', 'test_evaluator = None',
        'train_cfg = dict(max_epochs=2, val_interval=100)',
        'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))',
        "custom_hooks = [dict(type='DumpRankWeightsHook'), dict(type='SigtermAfterIterHook'), "
        "dict(type='RecordSamplesHook')]"]) + '\n')
    return config


@pytest.mark.slow  # three launched Mask R-CNN runs (about 36 s); the main stage keeps the aspect-ratio batches
# resumed at any batch (test_samplers) and the checkpoint chosen (test_what_a_run_resumes_from) in process
def test_a_preempted_epoch_continues_at_its_next_sample(tmp_path, monkeypatch):
    """Stopped by SIGTERM in epoch 2 (after 3 of 4 iterations) in the default, relative work dir, a bare
    --resume with 2 data workers trains the one remaining iteration, loading only its 2 images, and
    ends with the weights of the uninterrupted run (no workers: each image augmented alike); extended
    to 3 epochs, a bare --resume would continue from epoch_2.pth, the newest by contents (not iter_3.pth)."""
    config = preempted_detector_config(tmp_path)
    user = tmp_path / 'user'
    user.mkdir()
    train = [sys.executable, str(ROOT / 'tools/train.py'), str(config)]  # work_dirs/tiny_mask_rcnn
    work_dir = user / 'work_dirs' / 'tiny_mask_rcnn'
    whole, cut = run_together(  # independent: the uninterrupted run beside the one to be stopped
        dict(args=train_cmd(config, tmp_path / 'whole')),
        dict(args=train, cwd=user, env=launch_env(XCIT_TEST_SIGTERM_AT=3)))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_1.pth', 'iter_3.pth']
    loads = tmp_path / 'loads.txt'
    resumed = run([*train, '--resume', '--cfg-options', 'train_dataloader.num_workers=2',
                   'train_dataloader.persistent_workers=True'], cwd=user, env=launch_env(XCIT_TEST_LOADS=loads))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert 'resumed epoch: 1, iter: 3' in log and 'after 1 batch(es) of 2 samples, started there' in log
    assert re.findall(r'Epoch\(train\) +\[ *(\d+)\]\[ *(\d+)/2\]', log) == [('2', '2')]
    last_batch = (tmp_path / 'whole' / 'samples.txt').read_text().splitlines()[-1].split()
    assert sorted(loads.read_text().split()) == sorted(last_batch)  # the epoch's first batch not loaded
    reference = torch.load(tmp_path / 'whole' / 'rank0.pth', weights_only=True)
    weights = torch.load(work_dir / 'rank0.pth', weights_only=True)
    for key, value in reference.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6, msg=key)
    # extended to 3 epochs, a bare --resume continues from epoch_2.pth (written last, the furthest by
    # contents), found from the relative work dir: not iter_3.pth, the larger number in a name
    monkeypatch.chdir(user)
    assert find_resumable_checkpoint('work_dirs/tiny_mask_rcnn') == str(work_dir / 'epoch_2.pth')

def restart_config(folder, seg_data, hooks):
    """The tiny config under plain SGD (a wrong resume shows in the weights), 4 iterations, checkpoints
    after 2 and 4, each rank's weights dumped at the end."""
    folder.mkdir()
    return tiny_seg_config(
        folder, seg_data, optim_wrapper=SGD,
        custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=[dict(type='DumpRankWeightsHook'), *hooks],
        train_cfg=dict(max_iters=4, val_interval=100),
        default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1), visualization=dict(draw=False)))


@pytest.mark.slow
def test_torchrun_restarts_a_failed_group_which_resumes_by_itself(tmp_path, seg_data):
    """tools/dist_train.sh with MAX_RESTARTS=1 (torchrun --max-restarts 1), 2 processes on this machine, no
    root: rank 1 SIGKILLs itself after iteration 3 on the first attempt (its checkpoint after 2); torchrun
    starts the group again, which resumes from iter_2.pth without being asked and ends with the weights of
    an uninterrupted 2-process run (1e-6)."""
    def launch(config, work_dir, **extra):
        proc = run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '2', '--work-dir', str(work_dir)],
                   env=launch_env(PORT=free_port(), OMP_NUM_THREADS=1, **extra), timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr + read_log(work_dir)

    whole = tmp_path / 'whole'
    launch(restart_config(tmp_path / 'a', seg_data, []), whole)
    cut = tmp_path / 'cut'
    kill = dict(type='KillOnFirstAttemptHook', rank=1, after_iter=3)
    log = launch(restart_config(tmp_path / 'b', seg_data, [kill]), cut, MAX_RESTARTS=1)
    assert (cut / 'killed_rank1').exists(), log[-3000:]
    assert re.search(r'elastic restart 1 of the group \(torchrun --max-restarts\): resuming from \S*iter_2\.pth',
                     log), log[-4000:]
    assert 'resumed epoch: 0, iter: 2' in log and re.search(r'Iter\(train\) \[4/4\]', log)
    reference = torch.load(whole / 'rank0.pth', weights_only=True)
    for rank in (0, 1):
        weights = torch.load(cut / f'rank{rank}.pth', weights_only=True)
        assert weights.keys() == reference.keys()
        for key, value in reference.items():
            torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6, msg=key)
