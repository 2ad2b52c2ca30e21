"""Iteration-counted schedulers stepped at the end of each optimizer step, so that gradient
accumulation trains every optimizer step at the recipe's value for that step."""
from mmengine.hooks import ParamSchedulerHook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class OptimizerStepSchedulerHook(ParamSchedulerHook):
    """MMEngine's ``ParamSchedulerHook``, with the iteration-counted schedulers stepped when an
    optimizer step ends, once for each micro-iteration it spanned.

    Under accumulation A the schedules count micro-iterations (``batch_plan.apply_batch_plan``
    multiplies their iteration counts by A), so optimizer step j must train at the schedulers' value
    after j x A micro-iterations, the recipe's value at step j. MMEngine's hook steps them after every
    micro-iteration: step j then trained at the value after (j + 1) x A - 1, nearly one step ahead,
    and the schedulers stepped before the first optimizer step (PyTorch's "Detected call of
    `scheduler.step()` before `optimizer.step()`" warning). Without accumulation it steps as MMEngine's
    hook; epoch-counted schedulers step at the end of each epoch, as there.
    """

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """At the end of an optimizer step, step the schedulers over the micro-iterations it spanned.

        Steps end at every multiple of the accumulation (MMEngine counts it over the whole run) and at
        the last iteration. The count is taken from the iteration, not from this hook's memory: after a
        resume from a checkpoint written inside a step (whose gradients MMEngine drops), the schedulers
        stand at that step's start."""
        if not runner.optim_wrapper.should_update():
            return
        accumulation = (runner.cfg.get('optim_wrapper') or {}).get('accumulative_counts', 1)
        for _ in range((runner.iter + 1) % accumulation or accumulation):
            super().after_train_iter(runner, batch_idx, data_batch, outputs)
