"""XCiT's speed options: channels_last and torch.compile change the speed, never the numbers."""
import contextlib
import functools
import logging

import pytest
import torch
from mmengine.logging import MMLogger

from helpers import randomize_
from xcit_dense.engine.config_check import check_backbone
from xcit_dense.models import xcit as xcit_module


@contextlib.contextmanager
def log_records():
    """The records the current MMEngine logger emits inside the block."""
    logger = MMLogger.get_instance('xcit_dense_speed_test', log_level='INFO')  # the current logger
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


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


def test_compile_gives_the_same_outputs(tiny_xcit, monkeypatch):
    # the graph capture of the real torch.compile; the 'eager' backend skips minutes of C++ codegen
    monkeypatch.setattr(xcit_module, '_compiled',
                        functools.lru_cache(maxsize=None)(lambda fn: torch.compile(fn, backend='eager')))
    plain, compiled = _pair(tiny_xcit, 16, compile=True)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected, got = plain.eval()(x), compiled.eval()(x)
    assert not compiled._compile_failed
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def _run_twice_beside_eager(tiny_xcit):
    """A compiled tiny XCiT run twice and its eager twin once on one input: the compiled model, the
    eager and compiled outputs, and the log records of the compiled runs."""
    plain, compiled = _pair(tiny_xcit, 8, compile=True)
    x = torch.randn(1, 3, 64, 64)
    with log_records() as records, torch.no_grad():
        got = [compiled.eval()(x) for _ in range(2)][-1]
    with torch.no_grad():
        expected = plain.eval()(x)
    return compiled, expected, got, records


def test_compile_failure_falls_back_with_one_log_line(tiny_xcit, monkeypatch):
    def broken(fn):
        def run(*args):  # what torch.compile raises when it cannot compile (inductor's come wrapped)
            raise torch._dynamo.exc.InternalTorchDynamoError('no C++ compiler found\nlong traceback ...')
        return run
    monkeypatch.setattr(xcit_module, '_compiled', broken)
    compiled, expected, got, records = _run_twice_beside_eager(tiny_xcit)
    assert compiled._compile_failed
    assert [r.getMessage() for r in records] == [
        'XCiT: torch.compile failed, running eagerly (InternalTorchDynamoError: no C++ compiler found)']
    assert records[0].levelno == logging.WARNING
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_without_a_c_compiler_compile_runs_eagerly_with_one_warning(tiny_xcit, monkeypatch, tmp_path):
    """No compiler on PATH and none named by CC/CXX: the real torch.compile is not tried."""
    monkeypatch.setenv('PATH', str(tmp_path))
    for name in ('CC', 'CXX'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(xcit_module, '_compiled', lambda fn: pytest.fail('torch.compile tried without a compiler'))
    compiled, expected, got, records = _run_twice_beside_eager(tiny_xcit)
    assert [r.getMessage() for r in records] == [
        'XCiT: torch.compile needs a C compiler (inductor on CPUs, Triton on GPUs) and none was found '
        '(CXX, CC, g++, gcc, clang++, clang, c++, cc): running eagerly']
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_speed_options_are_checked_in_configs():
    check_backbone(dict(type='XCiT', channels_last=True, compile=False, with_cp=True))
    with pytest.raises(ValueError, match=r'model\.backbone\.channels_last=.*expected bool'):
        check_backbone(dict(type='XCiT', channels_last='yes'))


def test_an_error_of_the_compiled_run_is_not_a_compile_failure(tiny_xcit, monkeypatch):
    """An out-of-memory (or any error) while the compiled code runs is the run's: no eager re-run,
    which would issue the SyncBN collectives a second time on this rank alone."""
    def oom(fn):
        def run(*args):
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
        return run
    monkeypatch.setattr(xcit_module, '_compiled', oom)
    _, compiled = _pair(tiny_xcit, 16, compile=True)
    with pytest.raises(torch.OutOfMemoryError), torch.no_grad():
        compiled.eval()(torch.randn(1, 3, 64, 64))
    assert not compiled._compile_failed


def test_with_cp_checkpoints_the_first_trainable_block_after_frozen_stages(monkeypatch):
    calls = []
    real = xcit_module.cp.checkpoint
    monkeypatch.setattr(xcit_module.cp, 'checkpoint', lambda block, *a, **k: calls.append(block) or real(block, *a, **k))
    model = xcit_module.XCiT(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), frozen_stages=1,
                 with_cp=True).train()
    sum(out.sum() for out in model(torch.randn(1, 3, 64, 64))).backward()
    assert calls == list(model.blocks[1:])
    assert model.blocks[1].mlp.fc1.weight.grad is not None and model.blocks[0].mlp.fc1.weight.grad is None


def test_compiled_training_builds_no_graph_per_input_size(tiny_xcit, monkeypatch):
    """Multi-scale training: the second input size makes dynamo trace the sizes as symbols, and no
    later size builds another graph (a graph per size would recompile up to dynamo's
    cache limit, then silently run eagerly)."""
    from torch._dynamo.utils import counters
    monkeypatch.setattr(xcit_module, '_compiled',
                        functools.lru_cache(maxsize=None)(lambda fn: torch.compile(fn, backend='eager')))
    torch._dynamo.reset()
    counters.clear()
    model = tiny_xcit(compile=True).train()
    graphs = []
    for height, width in ((96, 128), (128, 96), (112, 160), (64, 200)):
        model(torch.randn(2, 3, height, width))
        graphs.append(counters['stats']['unique_graphs'])
    assert not model._compile_failed
    assert graphs == [1, 2, 2, 2], graphs  # (dynamo gives a batch of 1 a graph of its own too)
