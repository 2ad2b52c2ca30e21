"""Run-time pieces around MMEngine's Runner: batch plans, process groups, checkpoints, hooks."""
from . import hooks  # noqa: F401  (registers the hooks with MMEngine)
from .batch_plan import BatchPlan, apply_batch_plan, resolve_batch_plan
from .dist import gpus_present, init_distributed, process_group, world_size

__all__ = ['BatchPlan', 'apply_batch_plan', 'gpus_present', 'init_distributed', 'process_group',
           'resolve_batch_plan', 'world_size']
