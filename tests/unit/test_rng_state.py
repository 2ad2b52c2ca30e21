"""RNG states survive a checkpoint file read weights-only; a seedless resume takes the checkpoint's seed."""
import random

import numpy as np
import torch
from mmengine.config import Config

from xcit_dense.checkpoint import allow_mmengine_checkpoints
from xcit_dense.models.weights import read_checkpoint
from xcit_dense.engine.hooks.rng_state import get_rng_state, set_rng_state
from xcit_dense.engine.run_config import seed_from_checkpoint


def draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'meta': {'rng_states': [get_rng_state()]}}, path)
    expected = draws()
    allow_mmengine_checkpoints()
    set_rng_state(read_checkpoint(str(path))['meta']['rng_states'][0])
    assert draws() == expected


def test_a_seedless_config_resumes_under_the_checkpoint_seed(tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'meta': {'seed': 1234}}, path)
    cfg = Config(dict(randomness=dict(seed=None, deterministic=True)))
    seed_from_checkpoint(cfg, str(path))
    assert cfg.randomness == dict(seed=1234, deterministic=True)
    bare = Config(dict())
    seed_from_checkpoint(bare, str(path))
    assert bare.randomness == dict(seed=1234)
    seeded = Config(dict(randomness=dict(seed=7)))
    seed_from_checkpoint(seeded, str(path))
    assert seeded.randomness.seed == 7
