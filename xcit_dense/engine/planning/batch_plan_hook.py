"""The batch plan in checkpoints, so that a resume under another plan keeps the run's meaning."""
from typing import Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop

from ...io.checkpoint_schema import batch_plan_of, check_optimizer, check_schedulers
from .batch_plan import replan_checkpoint


@HOOKS.register_module()
class BatchPlanHook(Hook):
    """Record the batch plan in checkpoints; on resume under another plan, carry the run over.

    ``plan`` is ``BatchPlan.as_dict()``, set by ``run_config.configure_training_hooks``; without one (a Runner built by
    other tools, which do not rewrite the schedule for accumulation) the hook does nothing.
    """

    def __init__(self, plan: Optional[dict] = None) -> None:
        self.plan = plan

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Write the plan into the checkpoint's meta."""
        if self.plan:
            checkpoint.setdefault('meta', {})['batch_plan'] = dict(self.plan)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Convert a checkpoint written under another plan to this one; the plan, the optimizer's groups
        and the schedulers' values typed first (io/checkpoint_schema.py: SchemaError), as they are
        compared and scaled."""
        if not self.plan:
            return
        old = batch_plan_of(checkpoint.get('meta', {}))
        if not old or old == self.plan:
            return
        groups = check_optimizer(checkpoint['optimizer']) if checkpoint.get('optimizer') is not None else None
        check_schedulers(checkpoint.get('param_schedulers') or [], groups)
        replan_checkpoint(checkpoint, old, self.plan,
                          count_iterations=not isinstance(runner.train_loop, EpochBasedTrainLoop))
        runner.logger.info(
            f'Resuming under a new batch plan: world size {old["world_size"]} -> '
            f'{self.plan["world_size"]}, accumulation {old["accumulation"]} -> '
            f'{self.plan["accumulation"]}, lr {old["lr"]:.3g} -> {self.plan["lr"]:.3g}')
