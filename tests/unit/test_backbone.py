"""The XCiT backbone: presets, pyramid sizes, errors, freezing, norm_eval and with_cp."""
import math

import pytest
import torch
from mmengine.registry import DefaultScope
from torch.nn.modules.batchnorm import _BatchNorm

from xcit_dense.models.presets import PRESETS
from xcit_dense.models.xcit import ARCH_SETTINGS, XCiT


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_builds_from_config_in_both_scopes(scope):
    import importlib
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(dict(type='XCiT', arch='tiny_12', depth=4, out_indices=(0, 1, 2, 3)))
    assert isinstance(model, XCiT)


@pytest.mark.parametrize('arch', sorted(PRESETS))
def test_presets(arch):
    preset = PRESETS[arch]
    dims, depth, heads, eta = preset.embed_dims, preset.depth, preset.num_heads, preset.eta
    assert ARCH_SETTINGS[arch] == (dims, depth, heads, eta)  # the tuple form, kept for users
    model = XCiT(arch=arch, patch_size=8)
    assert (model.embed_dims, model.depth, model.num_heads) == (dims, depth, heads)
    assert model.out_indices == ((3, 5, 7, 11) if depth == 12 else (7, 11, 15, 23))
    assert len(model.blocks) == depth
    assert torch.all(model.blocks[0].gamma1 == eta)
    assert model.blocks[0].attn.qkv.bias is not None
    assert model.blocks[0].mlp.fc1.out_features == 4 * dims


def test_preset_values_can_be_overridden():
    model = XCiT(arch='small_12', embed_dims=96, depth=6, num_heads=3, eta=0.5, mlp_ratio=2,
                 out_indices=(1, 2, 4, 5), drop_path_rate=0.1)
    assert (model.embed_dims, model.depth, model.num_heads) == (96, 6, 3)
    assert torch.all(model.blocks[-1].gamma2 == 0.5)
    assert model.blocks[0].mlp.fc1.out_features == 192
    # the same drop-path rate in every block, not a ramp
    assert [b.drop_path.drop_prob for b in model.blocks] == [0.1] * 6


@pytest.mark.parametrize('patch_size', [16, 8])
@pytest.mark.parametrize('size', [(64, 96), (100, 75), (33, 47)])
def test_pyramid_sizes_match_strides(tiny_xcit, patch_size, size):
    model = tiny_xcit(patch_size=patch_size).eval()
    height, width = size
    with torch.no_grad():
        outs = model(torch.randn(2, 3, height, width))
    assert len(outs) == 4
    for out, stride in zip(outs, (4, 8, 16, 32)):
        assert out.shape == (2, 64, math.ceil(height / stride), math.ceil(width / stride))


def test_pyramid_ops_follow_the_recipe():
    p16, p8 = (XCiT(arch='tiny_12', patch_size=patch, fast_layers=False) for patch in (16, 8))
    assert [type(m).__name__ for m in p16.fpn1] == ['ConvTranspose2d', 'BatchNorm2d', 'GELU', 'ConvTranspose2d']
    assert [type(m).__name__ for m in p16.fpn2] == ['ConvTranspose2d']
    assert all(isinstance(m, torch.nn.ConvTranspose2d) and m.kernel_size == m.stride == (2, 2)
               for m in (*p16.fpn1[::3], *p16.fpn2, *p8.fpn1))
    assert isinstance(p16.fpn3, torch.nn.Identity) and p16.fpn4.kernel_size == 2
    assert [type(m).__name__ for m in p8.fpn1] == ['ConvTranspose2d']
    assert isinstance(p8.fpn2, torch.nn.Identity)
    assert p8.fpn3.kernel_size == 2 and p8.fpn4.kernel_size == 4
    assert [k for k in p16.state_dict() if k.startswith('patch_embed.proj.') and k.endswith('.0.weight')] == \
        [f'patch_embed.proj.{i}.0.weight' for i in (0, 2, 4, 6)]


def test_norm_cfg_selects_the_norm_layer():
    model = XCiT(arch='tiny_12', norm_cfg=dict(type='SyncBN'))
    kinds = {type(m).__name__ for m in model.modules() if isinstance(m, _BatchNorm)}
    assert kinds == {'SyncBatchNorm'}


@pytest.mark.parametrize('kwargs, message', [
    (dict(arch='huge_48'), 'unknown XCiT arch'),
    (dict(patch_size=14), 'patch_size must be 8 or 16'),
    (dict(out_indices=(3, 5, 7, 12)), 'outside the 12 blocks'),
    (dict(out_indices=(5, 7, 11)), 'needs 4 entries'),
    (dict(out_indices=(7, 5, 3, 11)), 'strictly increasing'),
    (dict(frozen_stages=13), 'frozen_stages'),
    (dict(depth=7), 'no default out_indices'),
    (dict(embed_dims=100, num_heads=8), 'divisible by num_heads'),
])
def test_bad_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        XCiT(arch=kwargs.pop('arch', 'tiny_12'), **kwargs)


def test_frozen_stages_and_norm_eval(tiny_xcit):
    model = tiny_xcit(frozen_stages=2, norm_eval=True).train()
    frozen = [model.patch_embed, model.pos_embed, model.blocks[0], model.blocks[1]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters())
    assert all(not m.training for m in model.modules() if isinstance(m, _BatchNorm))
    before = model.patch_embed.proj[0][1].running_mean.clone()
    sum(out.sum() for out in model(torch.randn(2, 3, 32, 32))).backward()
    assert torch.equal(before, model.patch_embed.proj[0][1].running_mean)
    assert model.blocks[0].attn.qkv.weight.grad is None
    assert model.blocks[2].attn.qkv.weight.grad is not None


def forward_backward(model: XCiT, x: torch.Tensor, seed: int) -> dict:
    """One training step's forward and backward under a seed: outputs, gradients, the blocks'
    forward calls during each pass, and the bytes autograd saved for the backward."""
    calls = {'forward': [], 'backward': []}
    phase = 'forward'
    hooks = [block.register_forward_pre_hook(lambda module, args, i=i: calls[phase].append(i))
             for i, block in enumerate(model.blocks)]
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        outs = model(x)
    phase = 'backward'
    sum(o.square().mean() for o in outs).backward()
    for hook in hooks:
        hook.remove()
    return dict(outs=outs, grads={n: p.grad for n, p in model.named_parameters()}, calls=calls,
                saved_bytes=sum(saved))


def test_with_cp_recomputes_blocks_in_backward_replaying_drop_path(tiny_xcit):
    """with_cp keeps only each block's input: the blocks run again during backward (in reverse
    order), and that recomputation replays the random state, so drop path drops the same samples
    as in the forward; outputs and gradients equal those without checkpointing."""
    torch.manual_seed(0)
    plain = tiny_xcit(drop_path_rate=0.5).train()
    ckpt = tiny_xcit(drop_path_rate=0.5, with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(4, 3, 48, 64)
    ref, got = forward_backward(plain, x, seed=1), forward_backward(ckpt, x, seed=1)
    assert ref['calls'] == {'forward': [0, 1, 2, 3], 'backward': []}
    assert got['calls'] == {'forward': [0, 1, 2, 3], 'backward': [3, 2, 1, 0]}
    assert got['saved_bytes'] < ref['saved_bytes'] / 2, (got['saved_bytes'], ref['saved_bytes'])
    for a, b in zip(ref['outs'], got['outs']):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert ref['grads'].keys() == got['grads'].keys()
    for name in ref['grads']:
        torch.testing.assert_close(ref['grads'][name], got['grads'][name], rtol=1e-5, atol=1e-7, msg=name)
    # drop path did drop: another seed gives other outputs
    other = forward_backward(plain, x, seed=2)
    assert not torch.allclose(other['outs'][0], ref['outs'][0])
