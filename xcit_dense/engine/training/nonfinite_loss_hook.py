"""What happens after a step whose loss was NaN/inf: stop the run, or count the skipped step."""
import math

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .optim_wrappers import NonFiniteGuard, step_skipped


class NonFiniteLossError(RuntimeError):
    """Training stopped because a loss was NaN or infinite."""


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop after a step with a NaN/inf loss, or go on counting it with ``skip=True``.

    The guard itself is the optimizer wrapper (``Guarded*OptimWrapper``, chosen by
    ``run_config.configure_optim_wrapper`` while this hook is on): it makes no update for such a step
    on any rank; this hook only acts on its verdict. By default the run
    then stops with the iteration and the loss names (the last checkpoint stays as it was); with
    ``skip=True`` the step is dropped and counted (``nonfinite_skipped`` in the log). With
    gradient accumulation a non-finite micro-batch drops its whole optimizer step.
    """

    priority = 'ABOVE_NORMAL'  # before the checkpoint hook sees the iteration

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip

    def before_train(self, runner) -> None:
        """Say so when the optimizer wrapper has no guard (a run not started by tools/train.py)."""
        self._skipped = 0
        if not isinstance(runner.optim_wrapper, NonFiniteGuard):
            runner.logger.warning(f'{type(runner.optim_wrapper).__name__} has no non-finite '
                              f'loss guard: set optim_wrapper.type to one of the Guarded*OptimWrapper types')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Stop with the offending loss names, or count the skipped step and go on."""
        if not step_skipped(runner.optim_wrapper):
            return
        values = {k: float(v.detach() if isinstance(v, torch.Tensor) else v) for k, v in (outputs or {}).items()
                  if isinstance(v, float) or (isinstance(v, torch.Tensor) and v.numel() == 1)}
        names = ', '.join(f'{k}={v}' for k, v in values.items()
                          if k != 'loss' and not math.isfinite(v)) or 'the loss on another rank'
        where = f'iteration {runner.iter + 1}'
        if not self.skip:
            raise NonFiniteLossError(
                f'non-finite loss at {where}: {names}. No update was made and the last checkpoint '
                f'is kept; lower the LR, check the data, or pass --skip-nonfinite to skip such batches')
        self._skipped += 1
        runner.message_hub.update_scalar('train/nonfinite_skipped', self._skipped)
        runner.logger.warning(f'non-finite loss at {where} ({names}): batch skipped '
                              f'({self._skipped} so far)')
