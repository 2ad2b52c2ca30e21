"""A checkpoint is read once per use: the inferencer checks the model against the contents it loaded, and
``load_from`` is read once, checked and handed to the Runner's load (a path or an hf-hub: name)."""
import pytest
import torch
from helpers import cached_hub_repo, own_runner_instances, randomize_, tiny_seg_config
from mmengine.config import Config
from mmengine.registry import RUNNERS
from safetensors.torch import save_file

import xcit_dense.io.checkpoint as checkpoint_io
from xcit_dense.builder import build_model
from xcit_dense.engine.training.fine_tune import hand_load_from
from xcit_dense.inference import build_inferencer
from xcit_dense.io.checkpoint_schemes import install_checked_schemes

pytestmark = pytest.mark.quick


@pytest.fixture
def reads(monkeypatch):
    """The files the toolkit's checked reader reads whole, in order."""
    seen, read = [], checkpoint_io.load_weights_file

    def counted(path, *args, **kwargs):
        seen.append(str(path))
        return read(path, *args, **kwargs)
    monkeypatch.setattr(checkpoint_io, 'load_weights_file', counted)
    return seen


@pytest.fixture
def segmentor(tmp_path, seg_data):
    """A tiny Semantic FPN config, and its model's weights (random: not what it initialises) in model.pth."""
    config = tiny_seg_config(tmp_path, seg_data)
    state = randomize_(build_model(str(config), init=False), seed=5).state_dict()
    torch.save({'state_dict': state, 'meta': {}}, tmp_path / 'model.pth')
    return config, state


def test_the_inferencer_reads_its_checkpoint_once(tmp_path, segmentor, reads):
    """The stock inferencer's read is the one the model check uses."""
    config, _ = segmentor
    build_inferencer(str(config), str(tmp_path / 'model.pth'), device='cpu')
    assert reads == [str(tmp_path / 'model.pth')]


@pytest.mark.parametrize('hub', [False, True], ids=['path', 'hf-hub'])
def test_load_from_is_read_once_checked_and_handed_to_the_runner(tmp_path, segmentor, reads, offline_hub_cache,
                                                                 hub):
    """tools/train.py's fine-tuning start: the file read once (the check and the Runner's load share it),
    whether ``load_from`` names a path or a name another reader serves, and the Runner loads its weights."""
    config, state = segmentor
    name = str(tmp_path / 'model.pth')
    if hub:
        cached_hub_repo(offline_hub_cache, 'someone/seg', {
            'model.safetensors': lambda path: save_file({k: v.contiguous() for k, v in state.items()}, path)})
        name = 'hf-hub:someone/seg'
    install_checked_schemes()  # (as tools/train.py has)
    cfg = Config.fromfile(str(config))
    cfg.work_dir, cfg.load_from = str(tmp_path / 'run'), name
    with own_runner_instances():
        runner = RUNNERS.build(cfg)
        assert hand_load_from(runner, name) == []
        runner.load_or_resume()
    assert len(reads) == 1, reads
    loaded = runner.model.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in state.items())
