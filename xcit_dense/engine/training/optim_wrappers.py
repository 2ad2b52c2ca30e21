"""The toolkit's optimizer wrappers: the non-finite loss guard, and bf16 autocast without a loss scaler.

The guard is a registered wrapper type (``optim_wrapper.type`` in the config and in the log), set by
``run_config.configure_optim_wrapper`` when the ``nonfinite_loss`` hook is on.
"""
from contextlib import contextmanager
from typing import Optional

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn

from .step_agreement import StepAgreement, agree_on_step


class NonFiniteGuard:
    """Mixin for an optimizer wrapper: no update for a step whose loss was NaN/inf on any rank.

    The loss of each micro-batch is checked on its device (no host synchronisation); at the end of
    the step the ranks agree, in one collective, on that flag and on a stop signal (see
    ``step_agreement``). With gradient accumulation, a non-finite micro-batch drops the whole step:
    its gradients are already summed with the others'.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._nonfinite: Optional[torch.Tensor] = None
        self.agreement: Optional[StepAgreement] = None
        self.agreed_at = -1  # the inner count the agreement belongs to

    def update_params(self, loss: torch.Tensor, step_kwargs: Optional[dict] = None,
                      zero_kwargs: Optional[dict] = None) -> None:
        bad = ~torch.isfinite(loss.detach()).all()
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        self.backward(self.scale_loss(loss))
        if self.should_update():
            self.agreement, self.agreed_at = agree_on_step(self._nonfinite), self.inner_count
            self._nonfinite = None
            if not self.agreement.nonfinite:
                self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))


def step_skipped(wrapper: OptimWrapper) -> bool:
    """Whether the guard made no update in the optimizer step that just ended (a NaN/inf loss on a rank)."""
    return (isinstance(wrapper, NonFiniteGuard) and wrapper.should_update()
            and wrapper.agreed_at == wrapper.inner_count and wrapper.agreement.nonfinite)


def step_agreement(wrapper: OptimWrapper) -> StepAgreement:
    """The agreement of the optimizer step just made: the guard's, or (without the guard) one
    exchange now. Call it only where ``wrapper.should_update()`` (at the end of a step)."""
    if isinstance(wrapper, NonFiniteGuard) and wrapper.agreed_at == wrapper.inner_count:
        return wrapper.agreement
    return agree_on_step(False)


@OPTIM_WRAPPERS.register_module()
class BF16OptimWrapper(OptimWrapper):
    """Training under ``torch.autocast(dtype=torch.bfloat16)`` on the model's device, without a loss
    scaler: bf16 has float32's exponent range, so gradients do not underflow as in fp16.

    GPU only in practice (``--amp`` falls back to fp32 on a CPU)."""

    def __init__(self, dtype: str = 'bfloat16', **kwargs) -> None:
        super().__init__(**kwargs)
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(f'BF16OptimWrapper trains in bfloat16 only, got dtype={dtype!r}')
        self.cast_dtype = torch.bfloat16

    @contextmanager
    def optim_context(self, model: nn.Module):
        device = next(model.parameters()).device.type
        with super().optim_context(model), torch.autocast(device, dtype=self.cast_dtype):
            yield


@OPTIM_WRAPPERS.register_module()
class GuardedOptimWrapper(NonFiniteGuard, OptimWrapper):
    """MMEngine's OptimWrapper with the non-finite loss guard."""


@OPTIM_WRAPPERS.register_module()
class GuardedAmpOptimWrapper(NonFiniteGuard, AmpOptimWrapper):
    """MMEngine's AmpOptimWrapper (fp16 with its loss scaler) with the non-finite loss guard."""


@OPTIM_WRAPPERS.register_module()
class GuardedBF16OptimWrapper(NonFiniteGuard, BF16OptimWrapper):
    """BF16OptimWrapper with the non-finite loss guard."""


# the guarded type of each wrapper type the toolkit sets
GUARDED = {'OptimWrapper': 'GuardedOptimWrapper', 'AmpOptimWrapper': 'GuardedAmpOptimWrapper',
           'BF16OptimWrapper': 'GuardedBF16OptimWrapper'}
