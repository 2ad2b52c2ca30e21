"""A checkpoint is read once per use: the inferencer checks the model against the contents it loaded."""
import pytest
import torch
from helpers import randomize_, tiny_seg_config

import xcit_dense.io.checkpoint as checkpoint_io
from xcit_dense.builder import build_model
from xcit_dense.inference import build_inferencer

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
