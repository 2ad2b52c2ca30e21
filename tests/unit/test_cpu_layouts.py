"""The CPU layouts of XCA, LPI and the block residuals against timm's modules, and the pyramid's
upsampling against torch's transposed convolution: outputs and gradients.

In float64 the gradients agree to rounding (the same function); in float32 the outputs agree to 1e-5.
Every test runs twice: with the CPU layouts, and with the reference layout (what GPUs run) switched
on, so that its gradients, training mode and ``with_cp`` are checked without a GPU.
"""
import copy
from functools import partial

import pytest
import timm.models.xcit as timm_xcit
import torch

from helpers import randomize_
from xcit_dense.models.cpu_layouts import reference_layout, use_cpu_layouts
from xcit_dense.models.layers import LPI, XCA, UpConv2x2, XCABlock
from xcit_dense.models.xcit import XCiT


@pytest.fixture(autouse=True, params=['cpu layouts', 'reference layout'])
def layout(request):
    """Each test once per layout; the check that the switch really switches is part of it."""
    if request.param == 'cpu layouts':
        assert use_cpu_layouts(torch.zeros(1))
        yield
        return
    with reference_layout():
        assert not use_cpu_layouts(torch.zeros(1))
        yield


def _shared(ours: torch.nn.Module, reference: torch.nn.Module, seed: int = 0) -> None:
    randomize_(reference, seed)
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and all('num_batches_tracked' in k for k in missing)


def _outputs_and_grads(module: torch.nn.Module, x: torch.Tensor, *args) -> tuple:
    x = x.clone().requires_grad_()
    out = module(x, *args)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}


def _assert_same(ours: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, *args) -> None:
    """float32 outputs within 1e-5; float64 outputs, input and parameter gradients within 1e-10."""
    torch.testing.assert_close(_outputs_and_grads(ours, x, *args)[0], _outputs_and_grads(ref, x, *args)[0],
                               rtol=0, atol=1e-5)
    got, want = (_outputs_and_grads(copy.deepcopy(m).double(), x.double(), *args) for m in (ours, ref))
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize('batch', [1, 3])
def test_folded_xca_matches_timm(batch):
    ours, ref = XCA(64, num_heads=4), timm_xcit.XCA(64, num_heads=4, qkv_bias=True)
    ref.fused_attn = False
    _shared(ours, ref)
    x = torch.randn(batch, 7 * 9, 64, generator=torch.Generator().manual_seed(1))
    _assert_same(ours, ref, x)


@pytest.mark.parametrize('train', [False, True])
def test_channels_last_lpi_matches_timm(train):
    ours, ref = LPI(32), timm_xcit.LPI(32)
    _shared(ours, ref)
    ours.train(train), ref.train(train)
    x = torch.randn(2, 5 * 6, 32, generator=torch.Generator().manual_seed(2))
    _assert_same(ours, ref, x, 5, 6)


def test_block_matches_timm_in_training():
    ours, ref = XCABlock(64, 4), timm_xcit.XCABlock(
        64, 4, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
    ref.attn.fused_attn = False
    _shared(ours, ref)
    ours.train(), ref.train()
    x = torch.randn(2, 4 * 6, 64, generator=torch.Generator().manual_seed(3))
    _assert_same(ours, ref, x, 4, 6)


@pytest.mark.parametrize('with_cp', [False, True])
def test_backbone_gradients_match_timm(with_cp):
    ref = timm_xcit.xcit_nano_12_p16_224(pretrained=False)
    randomize_(ref, 4).train()
    ours = XCiT(arch='nano_12', with_cp=with_cp)
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


@pytest.mark.parametrize('memory_format', [torch.contiguous_format, torch.channels_last])
def test_pyramid_upsampling_matches_transposed_convolution(memory_format):
    ours = UpConv2x2(6)
    ref = torch.nn.ConvTranspose2d(6, 6, kernel_size=2, stride=2)
    _shared(ours, ref)
    x = torch.randn(2, 6, 3, 5, generator=torch.Generator().manual_seed(6)).contiguous(memory_format=memory_format)
    _assert_same(ours, ref, x)
    grads = []
    for module in (ours, ref):  # bf16 autocast, the backward outside it (as AmpOptimWrapper runs it)
        inputs = (x.clone().requires_grad_(), *module.parameters())
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = module(inputs[0])
        grads.append((out, *torch.autograd.grad(out, inputs, torch.linspace(-1, 1, out.numel()).view_as(out))))
    for got, want in zip(*grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
    x = x.double().requires_grad_()
    weight, bias = (p.detach().double().requires_grad_() for p in (ours.weight, ours.bias))
    assert torch.autograd.gradcheck(
        lambda *inputs: torch.func.functional_call(ours, dict(weight=inputs[1], bias=inputs[2]), inputs[:1]),
        (x, weight, bias))


def test_backbone_pyramid_runs_the_layout_upsampling():
    """In the CPU layout the pyramid's backward goes through the layout's upsampling; in the
    reference layout through torch's transposed convolution."""
    backbone = XCiT(arch='nano_12').train()
    out = backbone(torch.randn(1, 3, 64, 64))[0]
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(n for n, _ in node.next_functions)
    names = [type(node).__name__ for node in seen]
    assert names.count('_UpConv2x2Backward') == (2 if use_cpu_layouts(out) else 0)  # fpn1's two
