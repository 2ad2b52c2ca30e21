"""A checkpoint on preemption signals, so that a requeued job loses at most one iteration."""
import os
import signal
import subprocess
import sys

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...checkpoint import write_pointer
from ..collectives import meet
from ..optim_wrappers import step_agreement
from ..step_agreement import clear_signal, note_signal
from .rng_state import RNGStateHook


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On SIGTERM or SIGUSR1, checkpoint at the next iteration boundary and stop.

    Under Slurm the job then requeues itself (``scontrol requeue``) so that the requeued run,
    started with ``--resume``, continues from that checkpoint. The process exits with
    128 + the signal number. All ranks stop at the same iteration, the end of an optimizer step
    (with gradient accumulation, the step under way is finished first); they learn of a signal
    in the step's one agreement (``step_agreement``).
    """

    priority = 'VERY_LOW'  # after the regular checkpoint hook
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def before_train(self, runner) -> None:
        """Catch the signals instead of dying mid-iteration."""
        clear_signal()
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        """Only note the signal: the checkpoint is written between iterations."""
        note_signal(signum)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Checkpoint, requeue and exit once any rank has been signalled."""
        if not runner.optim_wrapper.should_update():  # inside an accumulation: stop at its step
            return
        signum = step_agreement(runner.optim_wrapper).signal
        if not signum:
            return
        for hook in runner.hooks:  # the RNG states of every rank, for this checkpoint
            if isinstance(hook, RNGStateHook):
                hook.gather(runner)
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
        meet(timeout_s=600)  # rank 0 has written the checkpoint and its pointer
        sys.exit(128 + signum)
