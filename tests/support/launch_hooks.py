"""Hooks and a transform used only by the launcher and fault tests (imported through a config's custom_imports)."""
import os
import signal
import time
from typing import Optional

import torch
from mmcv.transforms import BaseTransform
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, TRANSFORMS


@HOOKS.register_module()
class DumpRankWeightsHook(Hook):
    """After training, every rank saves its own copy of the weights (rank{r}.pth)."""

    def after_run(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        torch.save(model.state_dict(), os.path.join(runner.work_dir, f'rank{runner.rank}.pth'))


@HOOKS.register_module()
class SlowIterHook(Hook):
    """Stretch each iteration so that a test can signal or kill a run in the middle."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        time.sleep(self.seconds)


@HOOKS.register_module()
class StallFsyncHook(Hook):
    """Once ``from_iter`` iterations are done, every fsync (the last step of writing a checkpoint before
    its rename) writes ``fsync_stalled`` in the work dir and never returns: a test waits for that file
    and kills the run while it saves, with no timing to guess."""

    def __init__(self, from_iter: int = 0) -> None:
        self.from_iter = from_iter

    def before_train(self, runner) -> None:
        fsync = os.fsync

        def stalled_fsync(fd):
            if runner.iter >= self.from_iter:
                open(os.path.join(runner.work_dir, 'fsync_stalled'), 'w').close()
                while True:
                    signal.pause()
            fsync(fd)
        os.fsync = stalled_fsync


@HOOKS.register_module()
class PauseAfterIterHook(Hook):
    """After iteration ``after_iter`` and its other hooks (its checkpoint written), create the file
    ``ready`` and wait until the file ``go`` exists: the test acts on the paused run (a signal, a
    read-only work dir) with no sleep to order the two. Paths outside the work dir, which may be
    read-only by then."""

    priority = 'LOWEST'

    def __init__(self, after_iter: int, ready: str, go: str) -> None:
        self.after_iter, self.ready, self.go = after_iter, ready, go

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 != self.after_iter:
            return
        open(self.ready, 'w').close()
        while not os.path.exists(self.go):
            time.sleep(0.05)  # polling for the test's file: the order comes from the file, not the interval


@HOOKS.register_module()
class InjectNaNHook(Hook):
    """Make the loss NaN at the given iterations (1-based), through the model's loss."""

    def __init__(self, iterations=(3,)) -> None:
        self.iterations = set(iterations)

    def before_train(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        parse_losses = model.parse_losses

        def poisoned(losses):
            if runner.iter + 1 in self.iterations:
                name = next(iter(losses))
                losses[name] = losses[name] * float('nan')
            return parse_losses(losses)
        model.parse_losses = poisoned


@HOOKS.register_module()
class WritePidHook(Hook):
    """Each rank writes its process id (pid_rank{r}) so a test can kill one rank."""

    def before_train(self, runner) -> None:
        with open(os.path.join(runner.work_dir, f'pid_rank{runner.rank}'), 'w') as f:
            f.write(str(os.getpid()))


@HOOKS.register_module()
class SigkillAfterCheckpointHook(Hook):
    """SIGKILL this process right after the checkpoint of iteration ``after_iter`` (default:
    $XCIT_TEST_SIGKILL_AT; none: no kill) is written, on rank ``rank`` (default: every rank),
    first writing ``killed_rank{r}`` (pid and time): the kill comes from the run itself."""

    priority = 'LOWEST'  # after the checkpoint hook has written the file

    def __init__(self, rank: Optional[int] = None, after_iter: Optional[int] = None) -> None:
        self.rank = rank
        self.after_iter = after_iter or int(os.environ.get('XCIT_TEST_SIGKILL_AT', 0))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.after_iter and self.rank in (None, runner.rank):
            if runner.rank == 0:  # the writer (other ranks may get here before the file is in place)
                assert os.path.isfile(os.path.join(runner.work_dir, f'iter_{self.after_iter}.pth'))
            with open(os.path.join(runner.work_dir, f'killed_rank{runner.rank}'), 'w') as f:
                f.write(f'{os.getpid()} {time.time()}')
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class StopOnFirstAttemptHook(Hook):
    """SIGSTOP this process (a hang, as a peer lost on NCCL shows) as iteration ``at_iter`` begins,
    on rank ``rank``, once per work dir: first writing ``stopped_rank{r}`` (pid and time), which
    marks it. The step bound is in force by then (StepBoundHook runs first)."""

    priority = 'LOWEST'

    def __init__(self, rank: int, at_iter: int) -> None:
        self.rank, self.at_iter = rank, at_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        marker = os.path.join(runner.work_dir, f'stopped_rank{runner.rank}')
        if runner.iter + 1 == self.at_iter and runner.rank == self.rank and not os.path.exists(marker):
            with open(marker, 'w') as f:
                f.write(f'{os.getpid()} {time.time()}')
            os.kill(os.getpid(), signal.SIGSTOP)


@HOOKS.register_module()
class SigtermAfterIterHook(Hook):
    """Send this process SIGTERM right after iteration ``after_iter`` (default:
    $XCIT_TEST_SIGTERM_AT; none: no signal), once per work dir (``sigterm_sent`` marks it): the
    preemption hook, later in the same iteration's hooks, then stops the run at that iteration."""

    priority = 'NORMAL'  # before the preemption hook (VERY_LOW)

    def __init__(self, after_iter: Optional[int] = None) -> None:
        self.after_iter = after_iter or int(os.environ.get('XCIT_TEST_SIGTERM_AT', 0))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = os.path.join(runner.work_dir, 'sigterm_sent')
        if runner.iter + 1 == self.after_iter and not os.path.exists(marker):
            open(marker, 'w').close()
            os.kill(os.getpid(), signal.SIGTERM)


@HOOKS.register_module()
class RecordSamplesHook(Hook):
    """Append the image files of each training batch, one line per iteration, to ``samples.txt``."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        names = [os.path.basename(sample.img_path) for sample in data_batch['data_samples']]
        with open(os.path.join(runner.work_dir, 'samples.txt'), 'a') as f:
            f.write(' '.join(names) + '\n')


@HOOKS.register_module()
class KillOnFirstAttemptHook(Hook):
    """Rank ``rank`` SIGKILLs itself after iteration ``after_iter`` (and its checkpoint), on the
    group's first attempt only: a group that torchrun restarted (--max-restarts) runs on. Before
    the kill it writes ``killed_rank{rank}`` (its pid and the time)."""

    priority = 'LOWEST'  # after the checkpoint hook

    def __init__(self, rank: int = 1, after_iter: int = 3) -> None:
        self.rank, self.after_iter = rank, after_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        from xcit_dense.engine.distributed.restart import restart
        if runner.rank == self.rank and runner.iter + 1 == self.after_iter and restart()[0] == 0:
            with open(os.path.join(runner.work_dir, f'killed_rank{self.rank}'), 'w') as f:
                f.write(f'{os.getpid()} {time.time()}')
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class HangOnFirstAttemptHook(Hook):
    """Rank ``rank`` stops making progress after iteration ``after_iter`` (and its checkpoint), on
    the job's first attempt only, first writing ``hung_rank{rank}`` (its pid): its node can then be
    taken down while the other ranks wait in a collective, as they do when a host vanishes. That
    file marks later attempts (not the code under test, which may fail to see a restart)."""

    priority = 'LOWEST'  # after the checkpoint hook

    def __init__(self, rank: int = 1, after_iter: int = 1) -> None:
        self.rank, self.after_iter = rank, after_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = os.path.join(runner.work_dir, f'hung_rank{self.rank}')
        if runner.rank == self.rank and runner.iter + 1 == self.after_iter and not os.path.exists(marker):
            with open(marker, 'w') as f:
                f.write(str(os.getpid()))
            while True:
                signal.pause()


@HOOKS.register_module()
class MarkIterDoneHook(Hook):
    """After each iteration's other hooks (the preemption check included), write ``iter_N.done``."""

    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        open(os.path.join(runner.work_dir, f'iter_{runner.iter + 1}.done'), 'w').close()


@TRANSFORMS.register_module()
class SignalFromRetries(BaseTransform):
    """Pass the first ``good`` samples, fail every later one; at the ``signal_at``-th failure, that is
    inside SkipBadSamples' retry loop, send SIGTERM to the training process (this one, or the parent
    of a DataLoader worker, once ``wait_for`` exists: the main process then waits for this batch) and
    create ``signal_sent``; every later failure of this process appends a line to it (the tries made
    after the signal)."""

    def __init__(self, good: int, signal_at: int, signal_sent: str, wait_for: Optional[str] = None) -> None:
        self.good, self.signal_at, self.signal_sent, self.wait_for = good, signal_at, signal_sent, wait_for
        self.calls = 0

    def transform(self, results: dict) -> dict:
        self.calls += 1
        if self.calls <= self.good:
            return results
        if self.calls - self.good == self.signal_at:
            in_worker = torch.utils.data.get_worker_info() is not None
            while self.wait_for and not os.path.exists(self.wait_for):
                time.sleep(0.05)  # a condition, not a duration: the main process finished the iteration
            open(self.signal_sent, 'w').close()
            os.kill(os.getppid() if in_worker else os.getpid(), signal.SIGTERM)
        elif self.calls - self.good > self.signal_at:
            with open(self.signal_sent, 'a') as f:
                f.write('try after the signal\n')
        raise ValueError('a bad sample')


@TRANSFORMS.register_module()
class CountLoads(BaseTransform):
    """Append the image file of each sample the pipeline loads, one line each, to $XCIT_TEST_LOADS
    (unset: nothing), from whichever process or data worker loads it."""

    def transform(self, results: dict) -> dict:
        path = os.environ.get('XCIT_TEST_LOADS')
        if path:
            with open(path, 'a') as f:
                f.write(os.path.basename(results['img_path']) + '\n')
        return results

