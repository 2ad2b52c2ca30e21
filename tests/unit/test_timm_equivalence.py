"""Numerical equivalence with timm's XCiT (an implementation nobody here wrote) on shared weights: the
plain model (``fast_layers=False``) in outputs and gradients, and the fast set in outputs (against
the plain model in every layer: test_fast_layers.py)."""
from pathlib import Path

import pytest
import timm
import torch
from helpers import randomize_

from xcit_dense.models.xcit import XCiT

DENSE_PRESETS = [(arch, patch) for arch in ('tiny_12', 'small_12', 'small_24', 'medium_24')
                 for patch in (16, 8)]
SIZES = [(64, 64), (72, 100)]  # the second is not divisible by 32


def timm_reference(arch: str, patch: int) -> torch.nn.Module:
    model = timm.create_model(f'xcit_{arch}_p{patch}_224', pretrained=False)
    return randomize_(model, seed=patch).eval()


def authors_layout(timm_state: dict) -> dict:
    """The layout of the authors' released files: under 'model', pos_embeder, fused class-attn qkv."""
    out = {}
    for key, value in timm_state.items():
        if key.startswith('pos_embed.'):
            key = 'pos_embeder.' + key[len('pos_embed.'):]
        if '.attn.q.' in key and key.startswith('cls_attn_blocks.'):
            k, v = (timm_state[key.replace('.attn.q.', f'.attn.{n}.')] for n in ('k', 'v'))
            out[key.replace('.attn.q.', '.attn.qkv.')] = torch.cat([value, k, v])
            continue
        if key.startswith('cls_attn_blocks.') and ('.attn.k.' in key or '.attn.v.' in key):
            continue
        out[key] = value
    return {'model': out}


def batch(size) -> torch.Tensor:
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))


def timm_maps(reference: torch.nn.Module, indices, size) -> list:
    with torch.no_grad():
        return reference.forward_intermediates(batch(size), indices=list(indices), intermediates_only=True)


def compare(ours: XCiT, expected: list, size) -> float:
    """The largest difference between our token maps of the batch at ``size`` and ``expected`` (timm's)."""
    with torch.no_grad():
        got = ours.forward_token_maps(batch(size))
    assert len(got) == len(expected) == 4
    worst = 0.0
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        worst = max(worst, (a - b).abs().max().item())
    return worst


def loaded(arch: str, patch: int, state: dict, path: Path) -> XCiT:
    """Our XCiT with `state` saved to path and loaded through init_cfg; the file (up to hundreds of
    MB for M24) is deleted at once, so that the temp dirs pytest keeps stay small."""
    torch.save(state, path)
    try:
        model = XCiT(arch=arch, patch_size=patch, fast_layers=False,
                     init_cfg=dict(type='Pretrained', checkpoint=str(path)))
        model.init_weights()
    finally:
        path.unlink()
    return model.eval()


@pytest.mark.parametrize('arch, patch', DENSE_PRESETS)
def test_token_maps_match_timm(arch, patch, tmp_path):
    reference = timm_reference(arch, patch)
    # the size not divisible by 32 (padding, the positional encoding's grid) is the same code for every
    # width and depth: the tiny presets check it, at both patch sizes; timm's maps computed once per size
    sizes = SIZES if arch == 'tiny_12' else SIZES[:1]
    # 1) the timm state dict, loaded through init_cfg
    ours = loaded(arch, patch, reference.state_dict(), tmp_path / 'timm.pth')
    expected = {size: timm_maps(reference, ours.out_indices, size) for size in sizes}
    for size in sizes:
        assert compare(ours, expected[size], size) <= 1e-5, (arch, patch, size)
    # 2) the same weights saved in the authors' layout, loaded through init_cfg
    ours = loaded(arch, patch, authors_layout(reference.state_dict()),
                  tmp_path / f'xcit_{arch}_p{patch}_384_dist.pth')
    for size in sizes:
        assert compare(ours, expected[size], size) <= 1e-5, (arch, patch, size)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize('patch', [16, 8])
def test_fast_layers_match_timm(patch):
    reference = timm_reference('tiny_12', patch)
    ours = XCiT(arch='tiny_12', patch_size=patch, fast_layers=True)
    ours.load_state_dict(reference.state_dict(), strict=False)
    for size in SIZES:
        assert compare(ours.eval(), timm_maps(reference, ours.out_indices, size), size) <= 1e-5, (patch, size)


@pytest.mark.parametrize('with_cp', [False, True])
def test_backbone_gradients_match_timm(with_cp):
    """The plain model in training: token maps within 1e-5 (float32), every parameter's gradient within
    1e-9 (float64)."""
    ref = timm.create_model('xcit_nano_12_p16_224', pretrained=False)
    randomize_(ref, 4).train()
    ours = XCiT(arch='nano_12', with_cp=with_cp, fast_layers=False)
    ours.load_state_dict(ref.state_dict(), strict=False)
    ours.train()
    x = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(5))
    indices = list(ours.out_indices)
    for a, b in zip(ours.forward_token_maps(x), ref.forward_intermediates(x, indices=indices, intermediates_only=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    ours, ref, x = ours.double(), ref.double(), x.double()
    got = ours.forward_token_maps(x)
    want = ref.forward_intermediates(x, indices=indices, intermediates_only=True)
    for maps in (got, want):
        sum((m * torch.linspace(-1, 1, m.numel(), dtype=m.dtype).view_as(m)).sum() for m in maps).backward()
    grads = dict(ref.named_parameters())
    checked = 0
    for name, param in ours.named_parameters():
        if name in grads and grads[name].grad is not None:
            torch.testing.assert_close(param.grad, grads[name].grad, rtol=0, atol=1e-9, msg=name)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize('patch', [16, 8])
def test_pyramid_matches_plain_torch_ops_on_timm_maps(patch):
    """The pyramid equals the recipe's ops written in plain torch, applied to timm's maps."""
    import torch.nn.functional as F
    reference = timm_reference('tiny_12', patch)
    ours = XCiT(arch='tiny_12', patch_size=patch, fast_layers=False)
    randomize_(ours, seed=3)
    ours.load_state_dict({**ours.state_dict(), **{k: v for k, v in reference.state_dict().items()
                                                  if k in ours.state_dict()}})
    ours.eval()
    x = torch.randn(1, 3, 128, 96)
    with torch.no_grad():
        maps = reference.forward_intermediates(x, indices=[3, 5, 7, 11], intermediates_only=True)
        sd = ours.state_dict()

        def convt(t, prefix):
            return F.conv_transpose2d(t, sd[prefix + '.weight'], sd[prefix + '.bias'], stride=2)

        def bn(t, prefix):
            return F.batch_norm(t, sd[prefix + '.running_mean'], sd[prefix + '.running_var'],
                                sd[prefix + '.weight'], sd[prefix + '.bias'], False, 0.0, 1e-5)
        if patch == 16:
            expected = [convt(F.gelu(bn(convt(maps[0], 'fpn1.0'), 'fpn1.1')), 'fpn1.3'),
                        convt(maps[1], 'fpn2.0'), maps[2], F.max_pool2d(maps[3], 2)]
        else:
            expected = [convt(maps[0], 'fpn1.0'), maps[1], F.max_pool2d(maps[2], 2),
                        F.max_pool2d(maps[3], 4)]
        got = ours(x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
