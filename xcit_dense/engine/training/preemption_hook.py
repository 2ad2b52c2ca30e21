"""A checkpoint on preemption signals, at an iteration boundary, so that a requeued job neither
loses nor repeats a batch: the checkpoint holds the state after its last completed iteration and,
through ``DataPositionHook``, the samples of the epoch trained so far, where the resume continues
(in epoch loops as in iteration loops)."""
import os
import signal
import subprocess

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...errors import Preempted
from ...io.checkpoint import ATOMIC_WRITES
from ..distributed.collectives import barrier_within
from ..distributed.process_wide import PROCESS
from ..distributed.run_context import current_context
from .interruptible_fetch import SignalWhileFetching
from .optim_wrappers import step_agreement
from .resume import write_pointer
from .step_agreement import clear_signal, note_signal


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On SIGTERM or SIGUSR1, checkpoint at the next iteration boundary and stop. In a run of one
    process, a signal that arrives while the next batch is loaded (bad samples retried, slow
    storage) stops at once, with the checkpoint of the last completed iteration (the toolkit's
    training loops fetch their batches through ``InterruptibleFetch``, which calls ``after_signal_while_fetching``).

    The checkpoint is ``iter_<step>.pth`` (``step``: the iterations done), with the data position of
    ``DataPositionHook``; the hooks' ``before_preemption_checkpoint`` runs on every rank just before it
    is saved; ``last_checkpoint`` points at it. Under Slurm the hook then requeues the
    job (``scontrol requeue``: batch jobs only, as tools/slurm_train.sh submits them with
    REQUEUE=1); Slurm starts it again with ``SLURM_RESTART_COUNT`` set, and tools/train.py continues
    from the newest checkpoint without being asked (engine/training/resume.py). Elsewhere the run just stops;
    ``--resume`` continues it at the next sample. The hook then raises ``Preempted``: the tools exit
    with 128 + the signal number.
    All ranks stop at the same iteration, the end of an optimizer step (with gradient accumulation,
    the step under way is finished first); they learn of a signal in the step's one agreement
    (``step_agreement``).
    """

    priority = 'VERY_LOW'  # after the regular checkpoint hook
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def before_train(self, runner) -> None:
        """Catch the signals instead of dying mid-iteration (for the run: its context puts the handlers
        before back as it closes)."""
        clear_signal()
        context = current_context()
        for sig in self.SIGNALS:
            context.catch_signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        """Note the signal: the checkpoint is written between optimizer steps, or now while loading."""
        note_signal(signum)
        if PROCESS.loading:
            raise SignalWhileFetching(signum)

    def after_signal_while_fetching(self, runner, signum: int) -> None:
        """A signal noted before or received during a batch fetch (the training loops'
        ``InterruptibleFetch``, one process only): checkpoint the last completed iteration (``runner.iter``,
        the model's state now) and stop."""
        self._checkpoint_and_stop(runner, signum, step=runner.iter)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Checkpoint, requeue and exit once any rank has been signalled."""
        if not runner.optim_wrapper.should_update():  # inside an accumulation: stop at its step
            return
        signum = step_agreement(runner.optim_wrapper).signal
        if not signum:
            return
        self._checkpoint_and_stop(runner, signum, step=runner.iter + 1)

    def _checkpoint_and_stop(self, runner, signum: int, step: int) -> None:
        """Save ``iter_<step>.pth`` (the state after ``step`` iterations), requeue, raise Preempted."""
        # on every rank, at the same iteration: the hooks gather what rank 0 writes (RNGStateHook: each
        # rank's RNG states); MMEngine's call_hook runs the method of each hook that has it
        runner.call_hook('before_preemption_checkpoint')
        name = signal.Signals(signum).name
        filename = f'iter_{step}.pth'
        runner.logger.info(f'{name} received: saving a checkpoint at iteration {step}')
        runner.save_checkpoint(runner.work_dir, filename, by_epoch=False, meta=dict(iter=step),
                               backend_args=dict(ATOMIC_WRITES))
        if runner.rank == 0:
            path = os.path.join(runner.work_dir, filename)
            write_pointer(runner.work_dir, path)
            job = os.environ.get('SLURM_JOB_ID')
            # said before the requeue: Slurm may end the job's processes as soon as it is asked
            runner.logger.info(f'checkpoint saved: {path}; stopping '
                               + (f'for the requeue of Slurm job {job}' if job else '(--resume continues the run)'))
            if job:
                runner.logger.info(f'requeueing Slurm job {job}')
                subprocess.run(['scontrol', 'requeue', job], check=False)
        barrier_within(timeout_s=600)  # rank 0 has written the checkpoint and its pointer
        raise Preempted(signum)
