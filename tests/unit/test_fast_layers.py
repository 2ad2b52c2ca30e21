"""The fast set against the plain model: every swapped layer and the whole backbone, outputs and
gradients; what the swap covers; the plain source free of run-time switches; the ``fast_layers`` choice.

float32 outputs within 1e-5, float64 outputs and gradients within 1e-10, bfloat16 autocast within
2e-2 (relative and absolute), in training and evaluation, and without autograd (where the CPU layouts
write in place). Each comparison runs twice: in the CPU layouts (what the fast set runs here) and in
the fast layers' plain layout (``reference_layout``: what they run on a GPU, saving functions and folds).
"""
import copy
import inspect
import logging

import pytest
import torch
from helpers import log_records, randomize_

from xcit_dense.models import fast, layers, xcit
from xcit_dense.models.fast import FAST_LAYERS, install_fast_layers
from xcit_dense.models.fast.cpu_layouts import reference_layout, use_cpu_layouts
from xcit_dense.models.fast.fast_layers import FastUpConv2x2


@pytest.fixture(params=['cpu layouts', 'reference layout'])
def layout(request):
    """Each test once per layout of the fast layers; the check that the switch switches is part of it."""
    if request.param == 'cpu layouts':
        assert use_cpu_layouts(torch.zeros(1))
        yield
        return
    with reference_layout():
        assert not use_cpu_layouts(torch.zeros(1))
        yield


def _fast_twin(plain: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(plain)
    assert install_fast_layers(twin)
    return twin


def _tensors(out) -> list:
    """A layer's output tensors (the patch embedding's come with its grid size)."""
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]


def _run(module: torch.nn.Module, x: torch.Tensor, args: tuple, seed: int, autocast: bool = False) -> tuple:
    """Outputs and the gradients of the input and parameters (None where no path reaches one)."""
    x = x.clone().requires_grad_()
    params = [p for p in module.parameters() if p.requires_grad]
    torch.manual_seed(seed)  # drop path
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        out = module(x, *args)
    outs = _tensors(out)
    loss = sum((o.float() * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
    grads = torch.autograd.grad(loss, [x, *params], allow_unused=True)
    return [o.detach() for o in outs], list(grads)


def _assert_close(got, want, tol: float) -> None:
    """Within ``tol`` absolute; ``tol`` of 2e-2 (bfloat16) relative and absolute, in units of the
    tensor's largest value where that exceeds 1 (one bfloat16 step at 8 to 16 is 0.06)."""
    for a, b in zip(got, want, strict=True):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert a.dtype == b.dtype
        if tol < 1e-2:
            torch.testing.assert_close(a, b, rtol=0, atol=tol)
        else:
            unit = b.abs().max().clamp_min(1)
            torch.testing.assert_close(a / unit, b / unit, rtol=tol, atol=tol)


def assert_fast_equals_plain(plain: torch.nn.Module, x: torch.Tensor, *args, train: bool) -> None:
    fast_model = _fast_twin(plain)
    plain.train(train), fast_model.train(train)
    got, want = _run(fast_model, x, args, seed=1), _run(plain, x, args, seed=1)
    _assert_close(got[0], want[0], 1e-5)
    if not train:
        with torch.no_grad():  # the inference path (in place where nothing is recorded)
            _assert_close(_tensors(fast_model(x.clone(), *args)), _tensors(plain(x.clone(), *args)), 1e-5)
    got, exact = (_run(copy.deepcopy(m).double(), x.double(), args, seed=1) for m in (fast_model, plain))
    _assert_close(got[0] + got[1], exact[0] + exact[1], 1e-10)
    # bfloat16 autocast, the backward outside it (as AmpOptimWrapper runs it); a gradient that is zero
    # in exact arithmetic (a bias before a BatchNorm in training) is the rounding of a cancelled sum in
    # both, left out
    got, want = (_run(m, x, args, seed=1, autocast=True) for m in (fast_model, plain))
    kept = [t is None or t.abs().max() > 1e-8 for t in exact[0] + exact[1]]
    _assert_close(*([t for t, keep in zip(ts[0] + ts[1], kept) if keep] for ts in (got, want)), 2e-2)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('train', [False, True])
def test_xca(train):
    assert_fast_equals_plain(randomize_(layers.XCA(64, num_heads=4), 1), _randn(3, 7 * 9, 64, seed=1), train=train)


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('train', [False, True])
def test_lpi(train):
    assert_fast_equals_plain(randomize_(layers.LPI(32), 2), _randn(2, 5 * 6, 32, seed=2), 5, 6, train=train)


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('train', [False, True])
def test_mlp(train):
    assert_fast_equals_plain(randomize_(layers.Mlp(32, 128), 3), _randn(2, 30, 32, seed=3), train=train)


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('train', [False, True])
def test_block_with_drop_path(train):
    block = randomize_(layers.XCABlock(64, 4, drop_path_rate=0.3), 4)
    assert_fast_equals_plain(block, _randn(2, 4 * 6, 64, seed=4), 4, 6, train=train)


@pytest.mark.usefixtures('layout')
def test_patch_embedding():
    assert_fast_equals_plain(randomize_(layers.ConvPatchEmbed(16, 3, 64), 5), _randn(2, 3, 40, 56, seed=5),
                             train=True)


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('memory_format', [torch.contiguous_format, torch.channels_last])
def test_pyramid_upsampling(memory_format):
    conv = randomize_(torch.nn.ConvTranspose2d(6, 6, kernel_size=2, stride=2), 6)
    x = _randn(2, 6, 3, 5, seed=6).contiguous(memory_format=memory_format)
    assert_fast_equals_plain(conv, x, train=True)


@pytest.mark.usefixtures('layout')
@pytest.mark.parametrize('train, with_cp', [
    (False, False), (True, False),
    pytest.param(True, True, marks=pytest.mark.slow),  # the costliest case (about 20 s on 2 cores): slow stage
])
def test_backbone(tiny_xcit, train, with_cp):
    plain = randomize_(tiny_xcit(embed_dims=32, fast_layers=False, with_cp=with_cp, drop_path_rate=0.2), 7)
    assert_fast_equals_plain(plain, _randn(2, 3, 40, 56, seed=7), train=train)  # not divisible by 32


def test_the_swap_covers_exactly_the_named_layers_on_the_same_parameters(tiny_xcit):
    plain = tiny_xcit(fast_layers=False)
    assert not [n for n, m in plain.named_modules() if type(m) in FAST_LAYERS.values()]
    params = dict(plain.named_parameters())
    swapped = install_fast_layers(plain)
    blocks = [f'blocks.{i}{part}' for i in range(4) for part in ('', '.attn', '.local_mp', '.mlp')]
    assert sorted(swapped) == sorted(['patch_embed', *blocks, 'fpn1.0', 'fpn1.3', 'fpn2.0'])
    assert {n: type(m) for n, m in plain.named_modules() if n in swapped} == {
        n: FAST_LAYERS[type(m).__mro__[1]] for n, m in plain.named_modules() if n in swapped}
    assert not [n for n, m in plain.named_modules() if n not in swapped and type(m) in FAST_LAYERS.values()]
    assert all(p is params[n] for n, p in plain.named_parameters()) and len(params) == len(
        list(plain.parameters()))
    # the same with fast_layers=True at build, before the stages are frozen
    built = tiny_xcit(fast_layers=True, frozen_stages=1)
    assert sorted(n for n, m in built.named_modules() if type(m) in FAST_LAYERS.values()) == sorted(swapped)
    assert list(built.state_dict()) == list(plain.state_dict())
    assert not any(p.requires_grad for p in built.blocks[0].parameters())


def test_only_the_pyramids_transposed_convolutions_are_swapped():
    other = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 4, 2, stride=2),
                                torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1))
    assert install_fast_layers(other) == ['0']
    assert type(other[0]) is FastUpConv2x2 and type(other[1]) is torch.nn.ConvTranspose2d


_SWITCHES = ('device.type', 'is_grad_enabled', 'is_autocast_enabled', 'is_tracing', 'is_compiling',
             'autograd.Function', 'use_cpu_layouts')


@pytest.mark.parametrize('module', [layers, xcit])
def test_the_plain_source_holds_no_run_time_switch(module):
    source = inspect.getsource(module)
    assert [s for s in _SWITCHES if s in source] == []


def _said(records) -> list:
    return [(r.getMessage(), r.levelno) for r in records if r.getMessage().startswith('XCiT')]


def test_auto_is_fast_without_a_gpu_and_plain_with_one_said_in_the_log(tiny_xcit, monkeypatch):
    with log_records() as records:
        model = tiny_xcit()
    assert model.fast_layers and type(model.blocks[0]) is fast.fast_layers.FastXCABlock
    assert _said(records) == [
        ("XCiT: the CPU's fast layers (the default on CPUs; model.backbone.fast_layers=False gives the plain layers)",
         logging.INFO)]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with log_records() as records:
        model = tiny_xcit()
    assert not model.fast_layers
    assert not [n for n, m in model.named_modules() if type(m) in FAST_LAYERS.values()]
    assert _said(records) == [
        ('XCiT: the plain layers (the default on GPUs, where the fast set is not yet measured; '
         'model.backbone.fast_layers=True gives the fast layers)', logging.INFO)]
    with log_records() as records:
        assert tiny_xcit(fast_layers=True).fast_layers and tiny_xcit(fast_layers=False).fast_layers is False
    assert _said(records) == []


@pytest.mark.parametrize('value', ['on', 1, None])
def test_fast_layers_refuses_other_values(tiny_xcit, value):
    with pytest.raises(ValueError, match="fast_layers must be 'auto', True or False"):
        tiny_xcit(fast_layers=value)
