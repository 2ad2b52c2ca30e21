"""What the blocks keep for the backward: the fast set's recomputing autograd functions and layer
scales folded into the weights, and ``with_cp='selective'``.

The functions are checked by ``gradcheck`` and against the plain operators (in float64, under
autocast, where a norm is clamped); the whole fast layers against the plain ones in
test_fast_layers.py. The
selective option is checked against plain training (outputs, gradients, drop path replayed), for
what it saves, and under DDP with frozen stages.
"""
import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from test_backbone import forward_backward
from torch.nn.parallel import DistributedDataParallel

from xcit_dense.models import layers
from xcit_dense.models.fast import fast_layers, install_fast_layers, recompute
from xcit_dense.models.fast.cpu_layouts import reference_layout
from xcit_dense.models.fast.recompute import GeluLinear, NormalizedGram, NormLinear


def _plain_gelu_linear(h, weight, bias):
    return F.linear(F.gelu(h), weight, bias)


def _plain_norm_linear(x, norm_weight, norm_bias, weight, bias):
    return F.linear(F.layer_norm(x, x.shape[-1:], norm_weight, norm_bias, 1e-6), weight, bias)


def _plain_gram(q, k, eps=1e-12):
    return F.normalize(q, dim=-1, eps=eps) @ F.normalize(k, dim=-1, eps=eps).transpose(-2, -1)


def _grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), [t.grad for t in inputs]


def test_functions_pass_gradcheck():
    torch.manual_seed(0)
    h, w, b = (torch.randn(2, 5, 6, dtype=torch.double), torch.randn(3, 6, dtype=torch.double),
               torch.randn(3, dtype=torch.double))
    for approximate in ('none', 'tanh'):
        assert torch.autograd.gradcheck(lambda *t: GeluLinear.apply(*t, approximate),
                                        [t.requires_grad_() for t in (h, w, b)])
    q, k = torch.randn(2, 2, 3, 7, dtype=torch.double), torch.randn(2, 2, 3, 7, dtype=torch.double)
    assert torch.autograd.gradcheck(lambda *t: NormalizedGram.apply(*t, 1e-12), [t.requires_grad_() for t in (q, k)])
    x, nw, nb = (torch.randn(2, 5, 6, dtype=torch.double), torch.randn(6, dtype=torch.double),
                 torch.randn(6, dtype=torch.double))
    assert torch.autograd.gradcheck(lambda *t: NormLinear.apply(*t, 1e-6),
                                    [t.requires_grad_() for t in (x, nw, nb, w, b)])


def test_functions_equal_the_plain_operators_also_where_a_norm_is_clamped():
    torch.manual_seed(0)
    h, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    got, want = _grads(lambda *t: GeluLinear.apply(*t, 'none'), h, w, b), _grads(_plain_gelu_linear, h, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    x, nw, nb = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    got = _grads(lambda *t: NormLinear.apply(*t, 1e-6), x, nw, nb, w, b)
    torch.testing.assert_close(got, _grads(_plain_norm_linear, x, nw, nb, w, b), rtol=1e-5, atol=1e-6)
    q, k = torch.randn(1, 2, 4, 9, dtype=torch.double), torch.randn(1, 2, 4, 9, dtype=torch.double)
    q[0, 1, 2] *= 1e-4  # a row whose norm falls under eps: the clamped branch
    got = _grads(lambda *t: NormalizedGram.apply(*t, 1e-3), q, k)
    torch.testing.assert_close(got, _grads(lambda *t: _plain_gram(*t, eps=1e-3), q, k), rtol=1e-10, atol=1e-12)


def test_functions_under_autocast_give_the_plain_dtypes_and_values():
    torch.manual_seed(0)
    h, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    q, k = torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32)
    x, nw, nb = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    norm_linear = lambda *t: NormLinear.apply(*t, 1e-6)  # noqa: E731
    for ours, plain, inputs in ((lambda *t: GeluLinear.apply(*t, 'none'), _plain_gelu_linear, (h.bfloat16(), w, b)),
                                (lambda *t: NormalizedGram.apply(*t, 1e-12), _plain_gram, (q.bfloat16(), k.bfloat16())),
                                (norm_linear, _plain_norm_linear, (x, nw, nb, w, b)),  # the float32 residual stream
                                (norm_linear, _plain_norm_linear, (x.bfloat16(), nw, nb, w, b))):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            got, want = _grads(ours, *inputs), _grads(plain, *inputs)
        assert got[0].dtype == want[0].dtype
        assert [g.dtype for g in got[1]] == [g.dtype for g in want[1]]
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


class _Normed(torch.nn.Module):
    """``layer(x, norm=norm)``, as the block calls its MLP and XCA in training."""

    def __init__(self, layer, norm):
        super().__init__()
        self.layer, self.norm = layer, norm

    def forward(self, x):
        return self.layer(x, norm=self.norm)


def _fast(module: torch.nn.Module) -> torch.nn.Module:
    install_fast_layers(module)
    return module


def _saved_bytes(module, x, *args):
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x.requires_grad_(), *args)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


@pytest.mark.parametrize('layout', ['cpu layouts', 'reference layout'])
def test_mlp_keeps_no_gelu_output_and_xca_no_normalised_copies(layout):
    """The MLP saves its input and fc1's output only (GELU's output, 4x the embedding, is not kept);
    XCA (reference layout, what GPUs run) saves two embedding-sized tensors less than with F.normalize.
    Given the block's norm, either keeps the norm's input instead of its output."""
    torch.manual_seed(0)
    B, N, C = 2, 50, 16
    mlp, x, norm = _fast(layers.Mlp(C, 4 * C)), torch.randn(B, N, C), torch.nn.LayerNorm(C)
    with reference_layout() if layout == 'reference layout' else contextlib.nullcontext():
        assert _saved_bytes(mlp, x.clone()) == (B * N * C + B * N * 4 * C) * 4
        # with the block's norm: its input kept, not its output (nor the norm's statistics)
        assert _saved_bytes(_Normed(mlp, norm), x.clone()) == (B * N * C + B * N * 4 * C) * 4
    plain_xca = layers.XCA(C, num_heads=4)
    xca = _fast(copy.deepcopy(plain_xca))
    with reference_layout():
        kept = _saved_bytes(xca, x.clone())
        assert _saved_bytes(_Normed(xca, norm), x.clone()) == kept  # the norm's output not kept either
    plain_kept = _saved_bytes(plain_xca, x.clone())
    assert plain_kept - kept >= 2 * B * N * C * 4, (plain_kept, kept)  # and F.normalize's clamped norms


def _block_step(block, x, seed):
    """A training forward and backward of ``block`` under ``seed`` (its drop path): output and gradients."""
    torch.manual_seed(seed)
    x = x.detach().clone().requires_grad_()
    out = block(x, 8, 8)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


@pytest.mark.parametrize('layout', ['cpu layouts', 'reference layout'])
def test_blocks_fold_their_layer_scales_into_the_weights(layout, monkeypatch):
    """In training the three layer scales are folded into the sub-layers' last weights: no sub-layer
    output of the tokens' size is kept for the scales' gradients (the scaled weights are kept
    instead), with the plain block's output and gradients (float64, drop path replayed)."""
    torch.manual_seed(0)
    B, N, C = 2, 64, 16
    block, x = _fast(layers.XCABlock(C, 4, drop_path_rate=0.5)).double().train(), torch.randn(B, N, C).double()
    with torch.no_grad():
        for gamma in (block.gamma1, block.gamma2, block.gamma3):
            gamma.uniform_(0.1, 0.5)
    with reference_layout() if layout == 'reference layout' else contextlib.nullcontext():
        kept, folded = _saved_bytes(block, x.clone(), 8, 8), _block_step(block, x, seed=3)
        monkeypatch.setattr(fast_layers, 'folds_layer_scale', lambda *args: False)
        plain_kept, plain = _saved_bytes(block, x.clone(), 8, 8), _block_step(block, x, seed=3)
    scaled_weights = 8 * (C * C + 4 * C * C + 9 * C)  # proj, fc2, conv2 (float64)
    assert plain_kept - kept >= 3 * B * N * C * 8 - scaled_weights, (plain_kept, kept)
    torch.testing.assert_close(folded, plain, rtol=1e-10, atol=1e-12)


def test_layer_scales_stay_outside_float16_products():
    """Under float16 autocast (or on float16 inputs) the scale multiplies the sub-layer's output, as
    in the plain block: a weight times the deep presets' scale of 1e-5 can fall out of float16's
    normal range. bfloat16 has float32's range: folded."""
    gamma, x = torch.nn.Parameter(torch.full((4,), 1e-5)), torch.randn(2, 4)
    assert recompute.folds_layer_scale(gamma, x)
    assert not recompute.folds_layer_scale(gamma, x.half())
    with torch.autocast('cpu', dtype=torch.float16):
        assert not recompute.folds_layer_scale(gamma, x)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert recompute.folds_layer_scale(gamma, x)
    with torch.no_grad():
        assert not recompute.folds_layer_scale(gamma, x)


@pytest.mark.parametrize('layout', ['cpu layouts', 'reference layout'])
def test_folded_blocks_keep_the_residual_stream_in_float32_under_autocast(layout, monkeypatch):
    """``gamma * y`` is float32 under bfloat16 autocast (a float32 scale): the folded block's residual
    stream stays in float32 too, with the plain block's values."""
    torch.manual_seed(0)
    block, x = _fast(layers.XCABlock(32, 4)).train(), torch.randn(2, 16, 32).bfloat16()
    with reference_layout() if layout == 'reference layout' else contextlib.nullcontext():
        with torch.autocast('cpu', dtype=torch.bfloat16):
            folded = block(x.clone().requires_grad_(), 4, 4)
            monkeypatch.setattr(fast_layers, 'folds_layer_scale', lambda *args: False)
            plain = block(x.clone().requires_grad_(), 4, 4)
    assert folded.dtype == plain.dtype == torch.float32
    torch.testing.assert_close(folded, plain, rtol=2e-2, atol=2e-2)


def _held_after_forward(model, x) -> int:
    """Bytes of tensors a training forward leaves allocated (outputs and what the backward needs),
    from the profiler's allocation events: checkpointing keeps its tensors outside saved-tensor hooks."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        outs = model(x)
    del outs
    return sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == '[memory]')


def test_selective_checkpointing_equals_plain_training_and_keeps_less(tiny_xcit):
    """``with_cp='selective'``: outputs and gradients of plain training (drop path replayed in the
    recomputation), keeping less than without checkpointing and more than full checkpointing."""
    torch.manual_seed(0)
    plain = tiny_xcit(drop_path_rate=0.5).train()
    models = {mode: tiny_xcit(drop_path_rate=0.5, with_cp=mode).train() for mode in ('selective', True)}
    x = torch.randn(2, 3, 48, 64)
    with reference_layout():
        ref = forward_backward(plain, x, seed=1)
        runs = {}
        for mode, model in models.items():
            model.load_state_dict(plain.state_dict())
            runs[mode] = forward_backward(model, x, seed=1)
    got = runs['selective']
    for a, b in zip(ref['outs'], got['outs']):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for name in ref['grads']:
        torch.testing.assert_close(ref['grads'][name], got['grads'][name], rtol=1e-5, atol=1e-7, msg=name)
    with reference_layout():
        held = {mode: _held_after_forward(model, x) for mode, model in [('plain', plain), *models.items()]}
    # the patch embedding and pyramid are never checkpointed: a large part of this tiny model's memory
    assert held[True] < held['selective'] < held['plain'] * 0.85, held


def test_selective_checkpointing_under_ddp_with_frozen_stages(tiny_xcit, tmp_path):
    """DDP's reducer sees every trainable parameter's gradient once, the frozen ones never, with the
    first trainable block's input needing no gradient; the gradients equal plain training's."""
    torch.manual_seed(0)
    plain = tiny_xcit(frozen_stages=2).train()
    selective = tiny_xcit(frozen_stages=2, with_cp='selective').train()
    selective.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 48)
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(selective)
        for _ in range(2):  # a second step: the reducer was ready for the next iteration
            ddp.zero_grad()
            sum(o.square().mean() for o in ddp(x)).backward()
    finally:
        dist.destroy_process_group()
    sum(o.square().mean() for o in plain(x)).backward()
    for (name, p), q in zip(plain.named_parameters(), selective.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)
        else:
            assert q.grad is None, name


@pytest.mark.parametrize('value', [1, 'full', 'Selective'])
def test_with_cp_refuses_other_values(tiny_xcit, value):
    with pytest.raises(ValueError, match="with_cp must be one of False, True, 'selective'"):
        tiny_xcit(with_cp=value)
