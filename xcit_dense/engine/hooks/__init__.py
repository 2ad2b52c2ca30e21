"""Runner hooks of the toolkit, one per module; importing the package registers them with MMEngine.

The runtime base configs declare them as named ``default_hooks`` entries (see TOOLKIT_HOOKS).
"""
from .auto_fit_record import AUTO_FIT_KEY, AutoFitHook
from .batch_plan_hook import BatchPlanHook
from .data_position_hook import DataPositionHook
from .eval_progress import EvalProgressHook
from .model_ema import OptimizerStepEMAHook, WarmupEMA, ema_hook
from .nonfinite_loss import NonFiniteLossError, NonFiniteLossHook
from .preemption import PreemptionHook
from .rng_state import RNGStateHook
from .show_dir import ShowDirHook
from .step_bound import StepBoundHook
from .throughput import ThroughputHook

# the ``default_hooks`` name of each hook, as configs/_base_/toolkit_hooks.py declares them (for
# configs that do not inherit it: run_config.declare_hooks; tests/unit/test_hooks_config.py keeps them equal)
TOOLKIT_HOOKS = dict(throughput='ThroughputHook', preemption='PreemptionHook',
                     nonfinite_loss='NonFiniteLossHook', batch_plan='BatchPlanHook',
                     data_position='DataPositionHook',
                     eval_progress='EvalProgressHook', rng_state='RNGStateHook', step_bound='StepBoundHook')

__all__ = ['AUTO_FIT_KEY', 'AutoFitHook', 'BatchPlanHook', 'DataPositionHook', 'EvalProgressHook',
           'NonFiniteLossError', 'NonFiniteLossHook', 'OptimizerStepEMAHook', 'PreemptionHook', 'RNGStateHook',
           'ShowDirHook', 'StepBoundHook', 'TOOLKIT_HOOKS', 'ThroughputHook', 'WarmupEMA', 'ema_hook']
