"""Runner hooks of the toolkit, one per module; importing the package registers them with MMEngine.

configs/_base_/toolkit_hooks.py declares them as named ``default_hooks`` entries, the one list of
them (``declared.toolkit_hooks`` reads it for configs that do not inherit it).
"""
from .batch_plan_hook import BatchPlanHook
from .data_position_hook import DataPositionHook
from .declared import toolkit_hooks
from .eval_progress import EvalProgressHook
from .nonfinite_loss import NonFiniteLossError, NonFiniteLossHook
from .preemption import PreemptionHook
from .rng_state import RNGStateHook
from .show_dir import ShowDirHook
from .step_bound import StepBoundHook
from .throughput import ThroughputHook

__all__ = ['BatchPlanHook', 'DataPositionHook', 'EvalProgressHook', 'NonFiniteLossError', 'NonFiniteLossHook',
           'PreemptionHook', 'RNGStateHook', 'ShowDirHook', 'StepBoundHook', 'ThroughputHook', 'toolkit_hooks']
