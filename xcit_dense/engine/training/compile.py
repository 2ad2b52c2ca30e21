"""``torch.compile`` of a model's backbone, applied by the run where the config says
``model.backbone.compile=True`` (``ToolkitRunner.build_model``; benchmarks call ``compile_forward``),
with a fallback that keeps the run going where compiling fails: one warning, then eager.

A compile cannot stop a run:

- no C compiler (inductor builds C++ on CPUs, Triton its launchers on GPUs): eager at once;
- the backward is compiled with the forward (torch's ``force_non_lazy_backward_lowering``), not
  lazily at the first ``loss.backward()``, so a backward that fails to compile raises inside the
  compiled call, where the fallback catches it, instead of from ``backward()`` outside it;
- sizes are not marked dynamic: inductor (torch 2.14) cannot lower XCiT with symbolic height and
  width on CPUs ("cannot determine truth value of Relational"), so every graph is compiled for one
  input size, and a new size of multi-scale training compiles again (dynamo's own automatic dynamic
  shapes then try symbolic sizes, and where inductor refuses them the run goes on eagerly).

Only dynamo's errors count as a failure to compile (inductor's come wrapped in
BackendCompilerFailed). Anything else, such as an out-of-memory while the compiled code runs, is the
run's error: running the backbone again eagerly on one rank would issue its SyncBN collectives
twice there, and the ranks would fall out of step.
"""
import functools
import logging
from typing import Any

import torch
import torch._functorch.config as functorch_config
from mmengine.logging import print_log
from torch import nn

from ...models.c_compiler import COMPILER_NAMES, COMPILER_VARIABLES, find_c_compiler
from ..distributed.run_context import current_context

COMPILE_FAILURES = (torch._dynamo.exc.TorchDynamoException,)
# the backward compiled with the forward, where torch has the option (not torch 2.6: there a backward
# that fails to compile raises from ``loss.backward()``, outside the fallback)
EAGER_BACKWARD_LOWERING = ({'force_non_lazy_backward_lowering': True}
                           if hasattr(functorch_config, 'force_non_lazy_backward_lowering') else {})


def is_compile_failure(exc: BaseException) -> bool:
    return isinstance(exc, COMPILE_FAILURES) and not isinstance(exc.__cause__, torch.OutOfMemoryError)


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    # compiled once per function; the module goes in as an argument, so copies of a model
    # (deepcopy for EMA, ...) never call back into the original
    return torch.compile(fn)


class CompiledForward:
    """A module's ``forward``, compiled, or eager once compiling failed (``failed``).

    Eager, without compiling, while ``torch.jit`` traces it: torch refuses to trace a dynamo-optimised
    function, and the FLOP counters (``analysis.flops``, a run's MFU) trace the model. The trace is
    no failure to compile: the next call outside it compiles.
    """

    def __init__(self, module: nn.Module):
        self.module, self.failed = module, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, eager = self.module, type(self.module).forward
        if self.failed or torch.jit.is_tracing():
            return eager(module, *args, **kwargs)
        if find_c_compiler() is None:
            self._run_eagerly('torch.compile needs a C compiler (inductor on CPUs, Triton on GPUs) and none was '
                              f"found ({', '.join(COMPILER_VARIABLES + COMPILER_NAMES)}): running eagerly")
            return eager(module, *args, **kwargs)
        try:
            with functorch_config.patch(EAGER_BACKWARD_LOWERING):
                return _compiled(eager)(module, *args, **kwargs)
        except COMPILE_FAILURES as exc:  # a failure to compile: say why once, then run eagerly
            if not is_compile_failure(exc):
                raise
            reason = (str(exc).strip().splitlines() or [''])[0][:200]
            self._run_eagerly(f'torch.compile failed, running eagerly ({type(exc).__name__}: {reason})')
        return eager(module, *args, **kwargs)

    def _run_eagerly(self, why: str) -> None:
        """Stop compiling this module, with one warning saying why."""
        self.failed = True
        print_log(f'{type(self.module).__name__}: {why}', logger='current', level=logging.WARNING)


def compile_forward(module: nn.Module) -> CompiledForward:
    """Compile ``module``'s forward from its next call on (its instance's ``forward`` replaced); a
    compile inside a training step then extends that step's bound on every rank (the run context's
    ``compile_bound.CompileBound``)."""
    current_context().compiles.enable()
    module.forward = CompiledForward(module)
    return module.forward

