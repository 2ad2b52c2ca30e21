"""RNG states survive a checkpoint file read weights-only and MMEngine's resume onto another device; a
seedless resume takes the checkpoint's seed; a preemption checkpoint holds every rank's states."""
import logging
import random
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import tiny_seg_config
from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.registry import RUNNERS

from xcit_dense.engine.training import rng_state_hook
from xcit_dense.engine.training.preemption_hook import PreemptionHook
from xcit_dense.engine.training.resume import seed_from_checkpoint
from xcit_dense.engine.training.rng_state_hook import RNGStateHook, get_rng_state, set_rng_state
from xcit_dense.engine.training.step_agreement import clear_signal, note_signal
from xcit_dense.errors import Preempted
from xcit_dense.io.weights import read_checkpoint


def draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'meta': {'rng_states': [get_rng_state()]}}, path)
    expected = draws()
    set_rng_state(read_checkpoint(str(path))['meta']['rng_states'][0])
    assert draws() == expected


def test_states_stored_as_tensors_still_restore():
    """Checkpoints written before the states were NumPy arrays hold torch's as a ByteTensor."""
    state = dict(get_rng_state(), torch=torch.get_rng_state())
    expected = draws()
    set_rng_state(state)
    assert draws() == expected


def test_a_seedless_config_resumes_under_the_checkpoint_seed(tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'meta': {'seed': 1234}}, path)
    checkpoint = read_checkpoint(str(path))
    cfg = Config(dict(randomness=dict(seed=None, deterministic=True)))
    seed_from_checkpoint(cfg, checkpoint)
    assert cfg.randomness == dict(seed=1234, deterministic=True)
    bare = Config(dict())
    seed_from_checkpoint(bare, checkpoint)
    assert bare.randomness == dict(seed=1234)
    seeded = Config(dict(randomness=dict(seed=7)))
    seed_from_checkpoint(seeded, checkpoint)
    assert seeded.randomness.seed == 7


def test_states_restore_after_mmengine_resume_moves_every_tensor(tmp_path, seg_data):
    """mmdet's and mmseg's own tools/train.py resume through MMEngine's ``Runner.resume``, which maps
    the checkpoint to the run's device (a GPU). Here its map_location moves every tensor off the CPU
    (to the meta device), and the RNG states still restore."""
    cfg = Config.fromfile(str(tiny_seg_config(tmp_path, seg_data)))
    cfg.work_dir = str(tmp_path / 'run')
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)  # restores when training starts
    cfg.train_dataloader.sampler = dict(type='DefaultSampler', shuffle=False)
    cfg.randomness = dict(seed=0)  # (deterministic=True would switch algorithms for this whole process)
    runner = RUNNERS.build(cfg)
    hook = next(h for h in runner.hooks if isinstance(h, RNGStateHook))
    # a tensor that shows the map location at work (no model weight: none could be copied off meta)
    checkpoint = dict(meta=dict(epoch=0, iter=1), state_dict=dict(unused=torch.zeros(1)),
                      message_hub=runner.message_hub.state_dict())
    hook.before_save_checkpoint(runner, checkpoint)  # this process's states, as training stores them
    torch.save(checkpoint, tmp_path / 'ckpt.pth')
    expected = draws()
    moved = []

    def off_the_cpu(storage, location):
        moved.append(location)
        return torch.UntypedStorage(storage.nbytes(), device='meta')
    runner.resume(str(tmp_path / 'ckpt.pth'), map_location=off_the_cpu)
    hook.before_train(runner)
    assert draws() == expected
    assert moved == ['cpu']  # the one tensor, off the CPU


def test_a_preemption_checkpoint_holds_every_ranks_states(tmp_path, monkeypatch):
    """Between two scheduled checkpoints, a signal's checkpoint still holds the states of every rank:
    the preemption hook has the hooks gather them first (here two ranks, their gather stood in for)."""
    monkeypatch.setattr(rng_state_hook, 'world_size', lambda: 2)
    monkeypatch.setattr(rng_state_hook, 'gather_objects', lambda state: [state, state])
    monkeypatch.delenv('SLURM_JOB_ID', raising=False)
    hooks = [RNGStateHook(), PreemptionHook()]
    saved = []

    def call_hook(name, **kwargs):  # as MMEngine's Runner.call_hook: each hook that has the method
        for hook in hooks:
            if hasattr(hook, name):
                getattr(hook, name)(runner, **kwargs)

    def save_checkpoint(work_dir, filename, meta, **kwargs):  # rank 0's part of Runner.save_checkpoint
        saved.append(dict(meta=dict(meta)))
        call_hook('before_save_checkpoint', checkpoint=saved[-1])
    runner = SimpleNamespace(iter=4, rank=0, work_dir=str(tmp_path), hooks=hooks, logger=logging.getLogger(__name__),
                             optim_wrapper=SimpleNamespace(should_update=lambda: True),
                             call_hook=call_hook, save_checkpoint=save_checkpoint)
    call_hook('after_train_iter', batch_idx=4)  # no checkpoint hook: no checkpoint due, nothing gathered
    note_signal(signal.SIGTERM)
    try:
        with pytest.raises(Preempted):
            call_hook('after_train_iter', batch_idx=4)
    finally:
        clear_signal()
    assert [len(checkpoint['meta']['rng_states']) for checkpoint in saved] == [2]


def test_an_epoch_checkpoint_of_several_ranks_holds_their_states(monkeypatch):
    """An epoch schedule's checkpoint is written after MMEngine's epoch loop has counted the epoch's last
    iteration (runner.iter one more than at the gather, in after_train_iter): it still holds every rank's
    states (here two ranks, their gather stood in for). Once the next iteration begins, a checkpoint
    written then (none is scheduled) gets none: they would not be the states of its moment."""
    monkeypatch.setattr(rng_state_hook, 'world_size', lambda: 2)
    monkeypatch.setattr(rng_state_hook, 'gather_objects', lambda state: [state, state])
    hook = RNGStateHook()
    runner = SimpleNamespace(iter=3, epoch=0, max_epochs=2, train_dataloader=[0] * 4,
                             hooks=[CheckpointHook(interval=1, by_epoch=True)])
    hook.after_train_iter(runner, batch_idx=3)  # the epoch's last batch: a checkpoint is due
    runner.iter += 1  # EpochBasedTrainLoop.run_iter, after the hooks
    checkpoint = {'meta': {}}
    hook.before_save_checkpoint(runner, checkpoint)  # CheckpointHook.after_train_epoch's save
    assert len(checkpoint['meta']['rng_states']) == 2
    runner.epoch += 1
    hook.before_train_iter(runner, batch_idx=0)
    checkpoint = {'meta': {}}
    hook.before_save_checkpoint(runner, checkpoint)
    assert 'rng_states' not in checkpoint['meta']
