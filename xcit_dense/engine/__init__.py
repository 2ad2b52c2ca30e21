"""Run-time pieces around MMEngine's Runner, by concern: ``distributed`` (the process group and its
bounds), ``telemetry`` (what a run reports of itself), ``training`` (the runner, loops, resuming) and
``planning`` (a config turned into a run). Importing it registers the toolkit's hooks, loops, DDP
wrapper and optimizer constructor with MMEngine."""
from . import distributed, planning, telemetry, training  # noqa: F401  (registers the hooks and the rest)
from .distributed.cuda_ops import check_cuda_ops
from .distributed.process_group import gpus_present, init_distributed, process_group, world_size
from .planning.batch_plan import BatchPlan, apply_batch_plan, resolve_batch_plan
from .training.runner import ToolkitRunner

__all__ = ['BatchPlan', 'apply_batch_plan', 'check_cuda_ops', 'gpus_present', 'init_distributed',
           'process_group', 'resolve_batch_plan', 'ToolkitRunner', 'world_size']
