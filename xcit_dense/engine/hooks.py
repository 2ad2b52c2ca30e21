"""Runner hooks: throughput over all ranks, a checkpoint on preemption signals, a non-finite
loss guard, the batch plan in checkpoints, and progress bars for evaluation."""
import math
import os
import signal
import subprocess
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop
from tqdm import tqdm

from .checkpoints import write_pointer
from .dist import world_size


@HOOKS.register_module()
class ThroughputHook(Hook):
    """Log images per second summed over all ranks (``img_per_s``), data loading included."""

    priority = 'NORMAL'

    def before_train(self, runner) -> None:
        self._last = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs=None) -> None:
        now = time.perf_counter()
        images = len(data_batch['inputs']) * world_size() if data_batch else 0
        runner.message_hub.update_scalar('train/img_per_s', images / max(now - self._last, 1e-9))
        self._last = now


@HOOKS.register_module()
class EvalProgressHook(Hook):
    """A progress bar over the batches of each validation and test run (rank 0, on stderr):
    MMEngine only logs every ``logger.interval`` batches."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self._bar: Optional[tqdm] = None

    def _open(self, runner, loop, desc: str) -> None:
        if runner.rank == 0:
            self._bar = tqdm(total=len(loop.dataloader), desc=desc, unit='batch', file=sys.stderr)

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def before_val_epoch(self, runner) -> None:
        self._open(runner, runner.val_loop, 'validation')

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._advance()

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._close()

    def before_test_epoch(self, runner) -> None:
        self._open(runner, runner.test_loop, 'test')

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._advance()

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._close()


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On SIGTERM or SIGUSR1, checkpoint at the next iteration boundary and stop.

    Under Slurm the job then requeues itself (``scontrol requeue``) so that the requeued run,
    started with ``--resume``, continues from that checkpoint. The process exits with
    128 + the signal number. All ranks stop at the same iteration.
    """

    priority = 'VERY_LOW'  # after the regular checkpoint hook
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def before_train(self, runner) -> None:
        self._received = 0
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._received = signum

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        received = torch.tensor([self._received])
        if world_size() > 1:  # every rank stops when any rank was signalled
            dist.all_reduce(received, op=dist.ReduceOp.MAX)
        signum = int(received.item())
        if not signum:
            return
        name = signal.Signals(signum).name
        step = runner.iter + 1
        filename = f'iter_{step}.pth'
        runner.logger.info(f'{name} received: saving a checkpoint at iteration {step}')
        runner.save_checkpoint(runner.work_dir, filename, by_epoch=False,
                               backend_args=dict(backend='atomic_local'))
        if runner.rank == 0:
            write_pointer(runner.work_dir, os.path.join(runner.work_dir, filename))
            job = os.environ.get('SLURM_JOB_ID')
            if job:
                runner.logger.info(f'requeueing Slurm job {job}')
                subprocess.run(['scontrol', 'requeue', job], check=False)
        if world_size() > 1:
            dist.barrier()
        sys.exit(128 + signum)


class NonFiniteLossError(RuntimeError):
    """Training stopped because a loss was NaN or infinite."""


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Keep NaN/inf losses away from the weights: no backward and no step for such a batch.

    By default the run then stops with the iteration and the loss names (the last checkpoint
    stays as it was); with ``skip=True`` the batch is dropped and counted
    (``nonfinite_skipped`` in the log). Ranks agree, so a NaN on one rank stops all of them.
    With gradient accumulation a skipped micro-batch is simply left out of the sum.
    """

    priority = 'ABOVE_NORMAL'  # before the checkpoint hook sees the iteration

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip

    def before_train(self, runner) -> None:
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


@HOOKS.register_module()
class BatchPlanHook(Hook):
    """Record the batch plan in checkpoints; on resume under another plan, carry the run over.

    Resuming with another world size, batch or accumulation re-resolves the plan: the LR of the
    optimizer and schedulers is rescaled to the new plan, and the iteration counters (which
    count micro-iterations) are converted so that the number of optimizer steps is kept.
    """

    def __init__(self, plan: dict) -> None:
        self.plan = plan

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['batch_plan'] = dict(self.plan)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        old = checkpoint.get('meta', {}).get('batch_plan')
        if not old or old == self.plan:
            return
        lr_factor = self.plan['lr'] / old['lr']
        for group in checkpoint.get('optimizer', {}).get('param_groups', []):
            for key in ('lr', 'initial_lr'):
                if key in group:
                    group[key] *= lr_factor
        for state in checkpoint.get('param_schedulers', []) or []:
            for key in ('base_values', '_last_value'):
                if isinstance(state.get(key), list):
                    state[key] = [v * lr_factor for v in state[key]]
        meta = checkpoint['meta']
        acc_old, acc_new = old['accumulation'], self.plan['accumulation']
        if acc_old != acc_new and not isinstance(runner.train_loop, EpochBasedTrainLoop):
            steps = meta['iter'] // acc_old
            meta['iter'] = steps * acc_new
            for state in checkpoint.get('param_schedulers', []) or []:
                for key in ('last_step', '_global_step'):
                    if isinstance(state.get(key), int):
                        state[key] = state[key] // acc_old * acc_new
        runner.logger.info(
            f'Resuming under a new batch plan: world size {old["world_size"]} -> '
            f'{self.plan["world_size"]}, accumulation {acc_old} -> {acc_new}, '
            f'lr {old["lr"]:.3g} -> {self.plan["lr"]:.3g}')
