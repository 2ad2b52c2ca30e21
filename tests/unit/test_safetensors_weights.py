"""Safetensors files and ``hf-hub:`` names wherever a checkpoint is accepted: the three layouts read
by content, equal to the same weights from a ``.pth``; damaged files refused in one line; a hub
cache laid out by hand as huggingface_hub lays it, read offline."""
import hashlib
import json
import pickle
import struct

import pytest
import torch
from helpers import HUB_COMMIT, PickleExploit, cached_hub_repo, randomize_
from mmengine.runner.checkpoint import load_checkpoint
from safetensors.torch import save_file

from xcit_dense.io.checkpoint import CheckpointError, read_checkpoint_file
from xcit_dense.io.checkpoint_schemes import install_checked_schemes

pytestmark = pytest.mark.quick


@pytest.fixture
def weights(tiny_xcit):
    """A tiny backbone's state dict (random values) and a builder of models to load it into."""
    state = randomize_(tiny_xcit(), seed=3).state_dict()
    return state, tiny_xcit


def pretrained(build, checkpoint):
    model = build(init_cfg=dict(type='Pretrained', checkpoint=str(checkpoint)))
    model.init_weights()
    return model


def timm_layout(state):
    return {k: v.contiguous() for k, v in state.items() if not k.startswith('fpn')}


def assert_same_backbone(model, other):
    for key, value in model.state_dict().items():
        if not key.startswith('fpn'):
            assert torch.equal(value, other.state_dict()[key]), key


def test_timm_layout_loads_as_the_same_weights_from_a_pth(tmp_path, weights):
    state, build = weights
    save_file(timm_layout(state), tmp_path / 'model.safetensors')
    torch.save(timm_layout(state), tmp_path / 'model.pth')
    from_safetensors = pretrained(build, tmp_path / 'model.safetensors')
    assert_same_backbone(from_safetensors, pretrained(build, tmp_path / 'model.pth'))
    assert torch.equal(from_safetensors.state_dict()['blocks.0.attn.temperature'], state['blocks.0.attn.temperature'])


def test_authors_names_and_toolkit_keys_are_read_by_content(tmp_path, weights):
    state, build = weights
    authors = {k.replace('pos_embed.', 'pos_embeder.'): v for k, v in timm_layout(state).items()}
    authors['cls_token'] = torch.zeros(1, 1, 64)
    save_file(authors, tmp_path / 'authors.bin')  # the name says nothing: the bytes do
    whole = {f'backbone.{k}': v.contiguous() for k, v in state.items()}
    whole['neck.lateral_convs.0.conv.weight'] = torch.zeros(8, 64, 1, 1)
    save_file(whole, tmp_path / 'whole.safetensors')
    assert_same_backbone(pretrained(build, tmp_path / 'authors.bin'), pretrained(build, tmp_path / 'whole.safetensors'))
    pyramid = pretrained(build, tmp_path / 'whole.safetensors')
    assert torch.equal(pyramid.state_dict()['fpn1.0.weight'], state['fpn1.0.weight'])


def test_key_checks_say_what_they_say_for_a_pth(tmp_path, weights):
    state, build = weights
    deeper = randomize_(build(depth=5), seed=1).state_dict()
    save_file(timm_layout(deeper), tmp_path / 'deeper.safetensors')
    torch.save(dict(sorted(timm_layout(deeper).items())), tmp_path / 'deeper.pth')  # read back in name order
    messages = []
    for name in ('deeper.safetensors', 'deeper.pth'):
        with pytest.raises(CheckpointError, match=r'does not have: blocks\.4\.') as caught:
            pretrained(build, tmp_path / name)
        messages.append(str(caught.value).replace(name, 'FILE'))
    assert messages[0] == messages[1]


def test_load_from_reads_a_whole_model_file_through_mmengine(tmp_path, weights):
    state, build = weights
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / 'model.safetensors')
    install_checked_schemes()
    model = build()
    load_checkpoint(model, str(tmp_path / 'model.safetensors'), strict=True)
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items())


def rewritten(data: bytes, change) -> bytes:
    """A safetensors file's bytes with its JSON header passed through ``change`` (the data kept)."""
    length = struct.unpack('<Q', data[:8])[0]
    header = change(json.loads(data[8:8 + length]))
    text = json.dumps(header).encode()
    return struct.pack('<Q', len(text)) + text + data[8 + length:]


def overlapping(header):
    first, second = sorted((k for k in header if k != '__metadata__'), key=lambda k: header[k]['data_offsets'])[:2]
    header[second]['data_offsets'] = [header[first]['data_offsets'][0], header[second]['data_offsets'][1]]
    return header


def unknown_dtype(header):
    next(v for k, v in header.items() if k != '__metadata__')['dtype'] = 'F12'
    return header


DAMAGED = {
    'header length beyond the file': (lambda data: struct.pack('<Q', len(data)) + data[8:], 'invalid header length'),
    'overlapping offsets': (lambda data: rewritten(data, overlapping), 'invalid offset'),
    'unknown dtype': (lambda data: rewritten(data, unknown_dtype), 'unknown variant'),
}


@pytest.mark.parametrize('damage', DAMAGED)
def test_damaged_file_is_refused_in_one_line(tmp_path, weights, damage):
    state, build = weights
    save_file(timm_layout(state), tmp_path / 'good.safetensors')
    change, reason = DAMAGED[damage]
    path = tmp_path / 'damaged.safetensors'
    path.write_bytes(change((tmp_path / 'good.safetensors').read_bytes()))
    with pytest.raises(CheckpointError) as caught:
        pretrained(build, path)
    message = str(caught.value)
    assert '\n' not in message and str(path) in message and 'not a readable safetensors file' in message
    assert reason in message


def test_pickle_named_safetensors_is_refused_not_unpickled(tmp_path, weights):
    state, build = weights
    marker = tmp_path / 'pwned'
    path = tmp_path / 'model.safetensors'
    torch.save({'model': timm_layout(state), 'payload': PickleExploit(str(marker))}, path,
               pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(CheckpointError, match=r'model\.safetensors: named \.safetensors but .*not unpickled'):
        pretrained(build, path)
    assert not marker.exists()


def test_hub_name_reads_the_cached_safetensors_offline(offline_hub_cache, weights):
    """By name and by commit; a pinned digest (``init_cfg``'s ``sha256``) is checked as for any other file
    (before: ignored for a hub name, a wrong one loaded)."""
    state, build = weights
    folder = cached_hub_repo(offline_hub_cache, 'timm/xcit_tiny', {
        'model.safetensors': lambda p: save_file(timm_layout(state), p),
        'pytorch_model.bin': lambda p: p.write_bytes(b'not read')})
    for name in ('hf-hub:timm/xcit_tiny', f'hf-hub:timm/xcit_tiny@{HUB_COMMIT}'):
        model = pretrained(build, name)
        assert torch.equal(model.state_dict()['blocks.1.mlp.fc1.weight'], state['blocks.1.mlp.fc1.weight'])
    digest = hashlib.sha256((folder / 'blobs/model-safetensors').read_bytes()).hexdigest()
    pinned = read_checkpoint_file('hf-hub:timm/xcit_tiny', sha256=digest[:12])
    assert set(pinned['state_dict']) == set(timm_layout(state))
    with pytest.raises(CheckpointError, match=f'model.safetensors has sha256 {digest}, expected 000000000000$'):
        read_checkpoint_file('hf-hub:timm/xcit_tiny', sha256='0' * 12)  # (init_cfg's sha256 reaches it)


def test_hub_name_takes_the_pickle_where_the_repository_has_no_safetensors(offline_hub_cache, weights):
    state, build = weights
    cached_hub_repo(offline_hub_cache, 'timm/older', {'pytorch_model.bin': lambda p: torch.save(timm_layout(state), p)})
    model = pretrained(build, 'hf-hub:timm/older')
    assert torch.equal(model.state_dict()['pos_embed.token_projection.weight'],
                       state['pos_embed.token_projection.weight'])


def test_offline_miss_names_the_repository_the_cache_and_the_fetch(offline_hub_cache, weights):
    _, build = weights
    with pytest.raises(CheckpointError) as caught:
        pretrained(build, 'hf-hub:timm/xcit_missing@v1')
    message = str(caught.value)
    assert '\n' not in message
    assert 'timm/xcit_missing' in message and str(offline_hub_cache / 'models--timm--xcit_missing') in message
    assert 'hf download timm/xcit_missing model.safetensors --revision v1' in message


@pytest.mark.parametrize('name', ['hf-hub:xcit', 'hf-hub:a/b/c', 'hf-hub:timm/x@'])
def test_malformed_hub_name_is_refused(offline_hub_cache, weights, name):
    _, build = weights
    with pytest.raises(CheckpointError, match='hf-hub:OWNER/NAME'):
        pretrained(build, name)


def test_load_from_takes_a_hub_name_through_mmengine(offline_hub_cache, weights):
    state, build = weights
    cached_hub_repo(offline_hub_cache, 'someone/whole', {
        'model.safetensors': lambda p: save_file({k: v.contiguous() for k, v in state.items()}, p)})
    install_checked_schemes()
    model = build()
    load_checkpoint(model, 'hf-hub:someone/whole', strict=True)
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items())
