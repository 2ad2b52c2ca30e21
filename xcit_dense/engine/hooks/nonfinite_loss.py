"""A guard that keeps NaN/inf losses away from the weights."""
import math

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..dist import world_size


class NonFiniteLossError(RuntimeError):
    """Training stopped because a loss was NaN or infinite."""


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """No backward and no step for a batch with a NaN/inf loss; stop, or skip it with ``skip=True``.

    By default the run then stops with the iteration and the loss names (the last checkpoint
    stays as it was); with ``skip=True`` the batch is dropped and counted
    (``nonfinite_skipped`` in the log). Ranks agree, so a NaN on one rank stops all of them.
    With gradient accumulation a skipped micro-batch is simply left out of the sum.
    """

    priority = 'ABOVE_NORMAL'  # before the checkpoint hook sees the iteration

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip

    def before_train(self, runner) -> None:
        """Wrap the optimizer wrapper's update so that a non-finite loss never reaches it."""
        self._skipped = 0
        self._bad = False
        wrapper = runner.optim_wrapper
        update_params = wrapper.update_params

        def guarded_update(loss: torch.Tensor, *args, **kwargs):
            bad = torch.tensor([0. if bool(torch.isfinite(loss.detach()).all()) else 1.])
            if world_size() > 1:
                dist.all_reduce(bad, op=dist.ReduceOp.MAX)
            self._bad = bool(bad.item())
            if self._bad:
                wrapper.zero_grad()
                return None
            return update_params(loss, *args, **kwargs)

        wrapper.update_params = guarded_update

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Stop with the offending loss names, or count the skipped batch and go on."""
        if not self._bad:
            return
        values = {k: float(v) for k, v in (outputs or {}).items()
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
