"""Pretrained loading: the three layouts, the summary, and every way a checkpoint can be wrong."""
import logging
import pickle

import pytest
import torch
from helpers import PickleExploit, randomize_
from mmengine.logging import MMLogger

from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.weights import check_finetune_fits, check_matches_model
from xcit_dense.models.xcit import XCiT


def pretrained(path, **kwargs):
    model = XCiT(arch=kwargs.pop('arch', 'tiny_12'), patch_size=kwargs.pop('patch_size', 16),
                 init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kwargs)
    model.init_weights()
    return model


def source_weights(arch='tiny_12', patch_size=16):
    return randomize_(XCiT(arch=arch, patch_size=patch_size), seed=7).state_dict()


def classification_extras(dims):
    return {'cls_token': torch.zeros(1, 1, dims), 'norm.weight': torch.ones(dims),
            'head.weight': torch.zeros(1000, dims), 'cls_attn_blocks.0.attn.qkv.weight': torch.zeros(3 * dims, dims)}


@pytest.fixture
def captured_log():
    logger = MMLogger.get_instance('xcit_dense_test', log_level='INFO')
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def assert_backbone_equal(model, state, skip=('fpn',)):
    for key, value in model.state_dict().items():
        if not key.startswith(skip):
            assert torch.equal(value, state[key]), key


def test_official_layout_loads_and_summarises(tmp_path, captured_log):
    state = source_weights()
    official = {k.replace('pos_embed.', 'pos_embeder.'): v for k, v in state.items()
                if not k.startswith('fpn')}
    official.update(classification_extras(192))
    torch.save({'model': official, 'epoch': 400}, tmp_path / 'official.pth')
    model = pretrained(tmp_path / 'official.pth')
    assert_backbone_equal(model, state)
    summary = ' '.join(r.getMessage() for r in captured_log)
    assert 'Loaded' in summary and 'left at initial values: fpn1.0.weight' in summary
    assert 'cls_token' in summary and 'head.weight' in summary


def test_toolkit_layout_loads_the_pyramid_too(tmp_path):
    state = source_weights()
    whole = {f'backbone.{k}': v for k, v in state.items()}
    whole['neck.lateral_convs.0.conv.weight'] = torch.zeros(256, 192, 1, 1)
    torch.save({'state_dict': whole, 'meta': {'epoch': 3}}, tmp_path / 'mine.pth')
    model = pretrained(tmp_path / 'mine.pth')
    assert_backbone_equal(model, state, skip=())


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / 'nope.pth')):
        pretrained(tmp_path / 'nope.pth')


@pytest.mark.parametrize('content', [b'', b'not a checkpoint at all'])
def test_unreadable_file_names_the_path(tmp_path, content):
    path = tmp_path / 'broken.pth'
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match='broken.pth'):
        pretrained(path)


def test_truncated_file_names_the_path(tmp_path):
    torch.save({'model': source_weights()}, tmp_path / 'full.pth')
    data = (tmp_path / 'full.pth').read_bytes()
    (tmp_path / 'cut.pth').write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='cut.pth'):
        pretrained(tmp_path / 'cut.pth')


def test_code_in_a_checkpoint_never_runs(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save({'model': source_weights(), 'payload': PickleExploit(str(marker))}, path,
               pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(CheckpointError, match='could run code'):
        pretrained(path)
    assert not marker.exists()


def test_other_size_is_a_shape_mismatch_naming_keys(tmp_path):
    torch.save({'model': source_weights('small_12')}, tmp_path / 'small.pth')
    with pytest.raises(CheckpointError, match=r'shape mismatches: .*patch_embed\.proj\.0\.0\.weight'):
        pretrained(tmp_path / 'small.pth', arch='tiny_12')


def test_deeper_model_is_refused_naming_keys(tmp_path):
    torch.save({'model': source_weights('tiny_24')}, tmp_path / 't24.pth')
    with pytest.raises(CheckpointError, match=r'does not have: blocks\.12\.'):
        pretrained(tmp_path / 't24.pth', arch='tiny_12')


def test_missing_backbone_weights_are_refused(tmp_path):
    state = source_weights()
    del state['blocks.3.attn.temperature']
    torch.save(state, tmp_path / 'partial.pth')
    with pytest.raises(CheckpointError, match=r'missing from the checkpoint: blocks\.3\.attn\.temperature'):
        pretrained(tmp_path / 'partial.pth')


def test_checkpoint_of_another_model_is_refused(tmp_path):
    import torchvision
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / 'resnet.pth')
    with pytest.raises(CheckpointError, match='another architecture'):
        pretrained(tmp_path / 'resnet.pth')


def test_other_init_types_are_rejected():
    model = XCiT(arch='tiny_12', init_cfg=dict(type='Kaiming'))
    with pytest.raises(ValueError, match='Pretrained'):
        model.init_weights()


def test_nan_or_infinite_weights_are_refused_for_test_inference_and_load_from(tmp_path):
    """NaN weights (all-NaN ones predicted one class everywhere without a word) and an infinite running
    variance: refused, naming the keys, by the check of tools/test.py and tools/infer.py
    (check_matches_model) and by that of load_from (check_finetune_fits); finite weights pass both."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    state = {key: value.clone() for key, value in model.state_dict().items()}
    state['0.weight'][:] = float('nan')
    state['1.running_var'][0] = float('inf')
    torch.save({'state_dict': state}, tmp_path / 'nan.pth')
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'finite.pth')
    for check in (check_matches_model, check_finetune_fits):
        with pytest.raises(CheckpointError, match=r'nan\.pth holds NaN or infinite weights in 0\.weight, '
                                                  r'1\.running_var: refused'):
            check(model, str(tmp_path / 'nan.pth'))
    check_matches_model(model, str(tmp_path / 'finite.pth'))
    assert check_finetune_fits(model, str(tmp_path / 'finite.pth')) == []
