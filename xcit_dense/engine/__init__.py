"""Run-time pieces around MMEngine's Runner: batch plans, process groups, resuming, hooks, mmcv's CUDA ops."""
from . import ddp, hooks, loops, optim  # noqa: F401  (registers the DDP wrapper, hooks, loop, optimizer constructor)
from .batch_plan import BatchPlan, apply_batch_plan, resolve_batch_plan
from .cuda_ops import check_cuda_ops
from .dist import gpus_present, init_distributed, process_group, world_size
from .runner import ToolkitRunner

__all__ = ['BatchPlan', 'apply_batch_plan', 'check_cuda_ops', 'gpus_present', 'init_distributed',
           'process_group', 'resolve_batch_plan', 'ToolkitRunner', 'world_size']
