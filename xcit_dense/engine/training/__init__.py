"""The training run itself: the runner, its resumable loops, resuming, the data position, compiling,
the optimizer constructor and wrappers, step agreement, DDP; and the hooks that keep a run whole
(preemption, RNG states, data position, non-finite losses, EMA, pictures, scheduler steps)."""
from . import ddp, loops, optim  # noqa: F401  (registers the DDP wrapper, the loops, the optimizer constructor)
from .data_position_hook import DataPositionHook
from .model_ema_hook import OptimizerStepEMAHook, WarmupEMA, ema_hook
from .nonfinite_loss_hook import NonFiniteLossError, NonFiniteLossHook
from .optimizer_step_scheduler_hook import OptimizerStepSchedulerHook
from .preemption_hook import PreemptionHook
from .rng_state_hook import RNGStateHook
from .runner import ToolkitRunner
from .show_dir_hook import ShowDirHook

__all__ = ['DataPositionHook', 'NonFiniteLossError', 'NonFiniteLossHook', 'OptimizerStepEMAHook',
           'OptimizerStepSchedulerHook', 'PreemptionHook', 'RNGStateHook', 'ShowDirHook', 'ToolkitRunner',
           'WarmupEMA', 'ema_hook']
