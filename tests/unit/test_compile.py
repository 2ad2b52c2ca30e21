"""torch.compile of the backbone as the run applies it (engine/training/compile.py): the same numbers, one
warning and eager where compiling fails (the backward included), no graph per input size, and the
config's ``model.backbone.compile`` taken by the run, not the model."""
import functools
import logging

import pytest
import torch
from helpers import log_records, randomize_
from torch._dynamo.backends.common import aot_autograd

from xcit_dense.compile_option import take_compile_option
from xcit_dense.config_check import check_backbone
from xcit_dense.engine.training import compile as compile_module
from xcit_dense.engine.training.compile import compile_forward


def _compiled_with(monkeypatch, **compile_kwargs) -> None:
    """engine/training/compile.py's torch.compile with these arguments (a cheap backend: no codegen)."""
    torch._dynamo.reset()
    monkeypatch.setattr(compile_module, '_compiled',
                        functools.lru_cache(maxsize=None)(lambda fn: torch.compile(fn, **compile_kwargs)))


SMALLEST = dict(embed_dims=32, depth=4, num_heads=2, out_indices=(0, 1, 2, 3))  # where a graph's size is what costs


def _pair(tiny_xcit, patch: int, **sizes):
    plain = randomize_(tiny_xcit(patch_size=patch, **sizes), seed=patch)
    compiled = tiny_xcit(patch_size=patch, **sizes)
    compiled.load_state_dict(plain.state_dict())
    return plain, compiled, compile_forward(compiled)


def test_compile_gives_the_same_outputs(tiny_xcit, monkeypatch):
    _compiled_with(monkeypatch, backend='eager')  # the graph capture of the real torch.compile
    plain, compiled, forward = _pair(tiny_xcit, 16)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected, got = plain.eval()(x), compiled.eval()(x)
    assert not forward.failed
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def _run_twice_beside_eager(tiny_xcit):
    plain, compiled, forward = _pair(tiny_xcit, 8)
    x = torch.randn(1, 3, 64, 64)
    with log_records() as records, torch.no_grad():
        got = [compiled.eval()(x) for _ in range(2)][-1]
    with torch.no_grad():
        expected = plain.eval()(x)
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    return forward, records


def test_compile_failure_falls_back_with_one_log_line(tiny_xcit, monkeypatch):
    def broken(fn):
        def run(*args):  # what torch.compile raises when it cannot compile (inductor's come wrapped)
            raise torch._dynamo.exc.InternalTorchDynamoError('no C++ compiler found\nlong traceback ...')
        return run
    monkeypatch.setattr(compile_module, '_compiled', broken)
    forward, records = _run_twice_beside_eager(tiny_xcit)
    assert forward.failed
    assert [r.getMessage() for r in records] == [
        'XCiT: torch.compile failed, running eagerly (InternalTorchDynamoError: no C++ compiler found)']
    assert records[0].levelno == logging.WARNING


def test_without_a_c_compiler_compile_runs_eagerly_with_one_warning(tiny_xcit, monkeypatch, tmp_path):
    """No compiler on PATH and none named by CC/CXX: the real torch.compile is not tried."""
    monkeypatch.setenv('PATH', str(tmp_path))
    for name in ('CC', 'CXX'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(compile_module, '_compiled', lambda fn: pytest.fail('torch.compile tried without a compiler'))
    _, records = _run_twice_beside_eager(tiny_xcit)
    assert [r.getMessage() for r in records] == [
        'XCiT: torch.compile needs a C compiler (inductor on CPUs, Triton on GPUs) and none was found '
        '(CXX, CC, g++, gcc, clang++, clang, c++, cc): running eagerly']


def test_an_error_of_the_compiled_run_is_not_a_compile_failure(tiny_xcit, monkeypatch):
    """An out-of-memory (or any error) while the compiled code runs is the run's: no eager re-run,
    which would issue the SyncBN collectives a second time on this rank alone."""
    def oom(fn):
        def run(*args):
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
        return run
    monkeypatch.setattr(compile_module, '_compiled', oom)
    _, compiled, forward = _pair(tiny_xcit, 16)
    with pytest.raises(torch.OutOfMemoryError), torch.no_grad():
        compiled.eval()(torch.randn(1, 3, 64, 64))
    assert not forward.failed


@pytest.mark.slow  # AOTAutograd traces the forward and backward (about 20 s on 2 idle cores)
@pytest.mark.skipif(not compile_module.EAGER_BACKWARD_LOWERING,
                    reason="this torch (2.6) compiles the backward lazily: the fallback cannot catch its failure")
def test_a_backward_that_fails_to_compile_falls_back_before_the_step(tiny_xcit, monkeypatch):
    """AOTAutograd with a backward compiler that raises: the backward is compiled with the forward
    (not lazily at loss.backward(), outside the fallback), so the training step finishes eagerly,
    with the fallback's line, and the gradients are the eager model's."""
    def backward_compiler(graph, example_inputs):
        raise RuntimeError('no backward compiler')
    _compiled_with(monkeypatch, backend=aot_autograd(fw_compiler=lambda graph, inputs: graph.forward,
                                                     bw_compiler=backward_compiler))
    plain, compiled, forward = _pair(tiny_xcit, 16, **SMALLEST)
    x = torch.randn(2, 3, 32, 32)
    with log_records() as records:
        sum(out.square().mean() for out in compiled.train()(x)).backward()
    sum(out.square().mean() for out in plain.train()(x)).backward()
    assert forward.failed and len(records) == 1
    assert records[0].getMessage().startswith('XCiT: torch.compile failed, running eagerly (BackendCompilerFailed: ')
    grads = dict(compiled.named_parameters())
    for name, param in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad, param.grad, rtol=0, atol=0, msg=name)


def test_the_run_takes_the_compile_key_from_the_backbone_config():
    cfg = dict(type='MaskRCNN', backbone=dict(type='XCiT', compile=True, channels_last=True))
    model_cfg, compile_backbone = take_compile_option(cfg)
    assert compile_backbone and model_cfg['backbone'] == dict(type='XCiT', channels_last=True)
    assert cfg['backbone']['compile'] is True  # the config (dumped into the work dir) keeps it
    assert take_compile_option(dict(type='X', backbone=dict(type='XCiT'))) == (
        dict(type='X', backbone=dict(type='XCiT')), False)
    check_backbone(dict(type='XCiT', compile=True))
    with pytest.raises(ValueError, match=r"model\.backbone\.compile='yes': expected bool"):
        check_backbone(dict(type='XCiT', compile='yes'))


def test_models_built_outside_a_run_leave_the_compile_key_out():
    """Planted: builder.build_model passing the key on (XCiT takes no ``compile`` argument)."""
    from xcit_dense.builder import build_model
    model = build_model('configs/demo/upernet_xcit_tiny_12_p16_demo.py', {'model.backbone.compile': True}, init=False)
    assert not isinstance(model.backbone.forward, compile_module.CompiledForward)
