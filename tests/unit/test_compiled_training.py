"""What ``compile=True`` runs on a CPU: torch.compile with its default backend, inductor (the other CPU
tests use dynamo's eager backend to skip the C++ code generation). Slow: a minute or more of compiling."""
import pytest
import torch
from helpers import require_capability
from torch._dynamo.utils import counters

from xcit_dense.engine.training.compile import compile_forward
from xcit_dense.models.c_compiler import find_c_compiler


@pytest.mark.slow
def test_an_inductor_compiled_training_step_matches_eager(tiny_xcit):
    """One SGD step of a 4-block, 32-channel XCiT compiled by inductor (C++ code for the forward and
    backward kernels: minutes on 2 cores, so the model is small): the loss, every gradient and the
    updated weights equal its eager twin's (1e-4), and inductor compiled the graph (no eager fallback)."""
    require_capability('cc', find_c_compiler() is not None, 'no C compiler for inductor (CC, CXX or PATH)')
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    small = dict(embed_dims=32, num_heads=2)
    compiled = tiny_xcit(**small).train()
    forward = compile_forward(compiled)  # as the run applies model.backbone.compile=True
    eager = tiny_xcit(**small).train()
    eager.load_state_dict(compiled.state_dict())
    x = torch.randn(1, 3, 32, 48)
    losses = []
    for model in (eager, compiled):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = sum(m.float().square().mean() for m in model(x))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    assert not forward.failed
    assert counters['inductor']['fxgraph_cache_miss'] + counters['inductor']['fxgraph_cache_hit'] >= 1, \
        dict(counters['inductor'])  # inductor, not dynamo's eager backend, made the code
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
