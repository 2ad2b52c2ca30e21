"""Whether a run's checkpoint hooks write a checkpoint after the training iteration now ending: the
ranks meet under the long wait bound after it (``step_bound_hook``), and gather their RNG states for
it (``engine.training.rng_state_hook``). The answer follows from the iteration, the epoch and the
batch's index alone, so every rank reaches the same one."""
from mmengine.hooks import CheckpointHook, Hook


def _saves_after(hook: Hook, runner, batch_idx: int) -> bool:
    """Whether ``hook`` is a checkpoint hook that writes after this iteration, by its own rule
    (MMEngine's ``after_train_iter`` for an iteration schedule, ``after_train_epoch`` for an epoch
    one, at the epoch's last batch)."""
    if not isinstance(hook, CheckpointHook):
        return False
    if not hook.by_epoch:
        return bool(hook.every_n_train_iters(runner, hook.interval, hook.save_begin)
                    or (hook.save_last and hook.is_last_train_iter(runner)))
    return hook.end_of_epoch(runner.train_dataloader, batch_idx) and bool(
        hook.every_n_epochs(runner, hook.interval, hook.save_begin)
        or (hook.save_last and hook.is_last_train_epoch(runner)))


def checkpoint_due(runner, batch_idx: int) -> bool:
    """Whether a checkpoint hook of ``runner`` saves after the iteration of ``batch_idx`` (its index in
    the epoch, as the hooks' ``after_train_iter`` receives it), now ending."""
    return any(_saves_after(hook, runner, batch_idx) for hook in runner.hooks)
