"""Runner hooks of the toolkit, one per module; importing the package registers them with MMEngine.

configs/_base_/toolkit_hooks.py declares them as named ``default_hooks`` entries, the one list of
them (``declared.toolkit_hooks`` reads it for configs that do not inherit it).
"""
from .auto_fit_record import AUTO_FIT_KEY, AutoFitHook
from .batch_plan_hook import BatchPlanHook
from .data_position_hook import DataPositionHook
from .declared import toolkit_hooks
from .eval_progress import EvalProgressHook
from .model_ema import OptimizerStepEMAHook, WarmupEMA, ema_hook
from .nonfinite_loss import NonFiniteLossError, NonFiniteLossHook
from .optimizer_step_scheduler import OptimizerStepSchedulerHook
from .preemption import PreemptionHook
from .rank_figures import RankFiguresHook
from .rng_state import RNGStateHook
from .show_dir import ShowDirHook
from .step_bound import StepBoundHook
from .throughput import ThroughputHook

__all__ = ['AUTO_FIT_KEY', 'AutoFitHook', 'BatchPlanHook', 'DataPositionHook', 'EvalProgressHook',
           'NonFiniteLossError', 'NonFiniteLossHook', 'OptimizerStepEMAHook', 'OptimizerStepSchedulerHook',
           'PreemptionHook', 'RankFiguresHook', 'RNGStateHook', 'ShowDirHook', 'StepBoundHook', 'ThroughputHook',
           'WarmupEMA', 'ema_hook', 'toolkit_hooks']
