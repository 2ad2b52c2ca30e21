"""XCiT's speed options: channels_last changes the speed, never the numbers (torch.compile: test_compile.py)."""
import pytest
import torch
from helpers import randomize_

from xcit_dense.config_check import check_backbone
from xcit_dense.models import xcit as xcit_module


def _pair(tiny_xcit, patch, **options):
    plain = randomize_(tiny_xcit(patch_size=patch), seed=patch)
    fast = tiny_xcit(patch_size=patch, **options)
    fast.load_state_dict(plain.state_dict())
    return plain, fast


@pytest.mark.parametrize('patch', [16, 8])
@pytest.mark.parametrize('train', [False, True])
def test_channels_last_gives_the_same_outputs_and_gradients(tiny_xcit, patch, train):
    plain, fast = _pair(tiny_xcit, patch, channels_last=True)
    plain.train(train)
    fast.train(train)
    x = torch.randn(2, 3, 72, 100, generator=torch.Generator().manual_seed(0))  # not divisible by 32
    outs_plain, outs_fast = plain(x), fast(x)
    for a, b in zip(outs_plain, outs_fast):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    if train:
        sum((o ** 2).mean() for o in outs_plain).backward()
        sum((o ** 2).mean() for o in outs_fast).backward()
        grads = dict(fast.named_parameters())
        for name, param in plain.named_parameters():
            torch.testing.assert_close(grads[name].grad, param.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_channels_last_converts_the_patch_embedding_and_pyramid_only(tiny_xcit):
    model = tiny_xcit(channels_last=True)
    cl = torch.channels_last
    assert model.patch_embed.proj[0][0].weight.is_contiguous(memory_format=cl)
    assert model.fpn1[0].weight.is_contiguous(memory_format=cl)
    assert model.blocks[0].local_mp.conv1.weight.is_contiguous()
    with torch.no_grad():
        maps = model.eval().forward_token_maps(torch.randn(1, 3, 64, 64))
    assert all(m.is_contiguous(memory_format=cl) for m in maps)  # views of the tokens


def test_speed_options_are_checked_in_configs():
    check_backbone(dict(type='XCiT', channels_last=True, compile=False, with_cp=True))
    with pytest.raises(ValueError, match=r'model\.backbone\.channels_last=.*expected bool'):
        check_backbone(dict(type='XCiT', channels_last='yes'))


def test_with_cp_checkpoints_the_first_trainable_block_after_frozen_stages(monkeypatch):
    calls = []
    real = xcit_module.cp.checkpoint
    monkeypatch.setattr(xcit_module.cp, 'checkpoint',
                        lambda block, *a, **k: calls.append(block) or real(block, *a, **k))
    model = xcit_module.XCiT(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), frozen_stages=1,
                 with_cp=True).train()
    sum(out.sum() for out in model(torch.randn(1, 3, 64, 64))).backward()
    assert calls == list(model.blocks[1:])
    assert model.blocks[1].mlp.fc1.weight.grad is not None and model.blocks[0].mlp.fc1.weight.grad is None
