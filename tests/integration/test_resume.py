"""Resuming: what a run continues from, and that an automatic resume reads its checkpoint once."""
import json
import sys

import pytest
import torch
from mmengine.config import Config

from helpers import ROOT, launch_env, run, tiny_seg_config, train_cmd
from xcit_dense.engine import resume
from xcit_dense.engine.resume import Restart, Resume

# tools/train.py run with every torch.load noted (the file it read) in $READS at exit
COUNTED_TRAIN = f"""
import atexit, json, os, runpy, sys
import torch
reads, load = [], torch.load
def counted(f, *args, **kwargs):
    reads.append(str(f))
    return load(f, *args, **kwargs)
torch.load = counted
atexit.register(lambda: open(os.environ['READS'], 'w').write(json.dumps(reads)))
sys.argv = [{str(ROOT / 'tools/train.py')!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_an_automatic_resume_reads_the_checkpoint_once(tmp_path, seg_data):
    """--resume: the newest checkpoint is found, seeded from, checked against the model and resumed
    from, on one read of the file (the hooks get the same contents)."""
    work_dir, reads = tmp_path / 'run', tmp_path / 'reads.json'
    first = tiny_seg_config(tmp_path, seg_data, train_cfg=dict(max_iters=2, val_interval=2),
                            default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1),
                                               visualization=dict(draw=False)),
                            randomness=dict(seed=None))
    proc = run(train_cmd(first, work_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = tiny_seg_config(tmp_path, seg_data, train_cfg=dict(max_iters=4, val_interval=4),
                            default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1),
                                               visualization=dict(draw=False)),
                            randomness=dict(seed=None))
    proc = run([sys.executable, '-c', COUNTED_TRAIN, str(again), '--work-dir', str(work_dir), '--resume'],
               env=launch_env(READS=reads))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-2000:]
    assert 'resumed epoch: 0, iter: 2' in output and 'RNG states restored from the checkpoint' in output
    assert json.loads(reads.read_text()) == [str(work_dir / 'iter_2.pth')]


@pytest.fixture
def work_dir(tmp_path):
    """A work dir with iter_2.pth and iter_4.pth (the newest), and a checkpoint elsewhere."""
    for name in ('run/iter_2.pth', 'run/iter_4.pth', 'other.pth'):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        torch.save({'meta': {'seed': 5, 'name': name}, 'state_dict': {}}, tmp_path / name)
    return tmp_path / 'run'


@pytest.mark.parametrize('asked, restarted, chosen', [
    (None, 0, None), ('auto', 0, 'run/iter_4.pth'), ('other.pth', 0, 'other.pth'),
    # a restarted group continues from the newest of its work dir, even when a path was given
    (None, 1, 'run/iter_4.pth'), ('other.pth', 1, 'run/iter_4.pth')])
def test_what_a_run_resumes_from(work_dir, monkeypatch, asked, restarted, chosen):
    monkeypatch.setattr(resume, '_restart', Restart(restarted, 'elastic restart' if restarted else ''))
    root = work_dir.parent
    point = Resume.choose(str(work_dir), asked if asked in (None, 'auto') else str(root / asked))
    assert point.path == (chosen and str(root / chosen))
    assert (point.checkpoint or {}).get('meta', {}).get('name') == chosen
    cfg = Config(dict(randomness=dict(seed=None)))
    point.configure(cfg)
    assert (cfg.get('resume'), cfg.get('load_from'), cfg.randomness.seed) == (
        (True, point.path, 5) if chosen else (None, None, None))


def test_a_restarted_group_without_a_checkpoint_starts_from_the_beginning(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, '_restart', Restart(1, 'Slurm requeue'))
    point = Resume.choose(str(tmp_path / 'run'), None)
    assert point.path is None
    assert point.describe(str(tmp_path / 'run')) == [
        'Slurm requeue 1 of the group (SLURM_RESTART_COUNT): resuming from the beginning (no complete '
        'checkpoint yet)', f'--resume: no checkpoint in {tmp_path / "run"} yet, starting from the beginning']
