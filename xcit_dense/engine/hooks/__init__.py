"""Runner hooks of the toolkit, one per module; importing the package registers them with MMEngine.

The runtime base configs declare them as named ``default_hooks`` entries (see TOOLKIT_HOOKS).
"""
from .batch_plan_hook import BatchPlanHook
from .data_position_hook import DataPositionHook
from .eval_progress import EvalProgressHook
from .nonfinite_loss import NonFiniteLossError, NonFiniteLossHook
from .preemption import PreemptionHook
from .rank_figures import RankFiguresHook
from .rng_state import RNGStateHook
from .show_dir import ShowDirHook
from .step_bound import StepBoundHook
from .throughput import ThroughputHook

# the ``default_hooks`` name of each hook, as configs/_base_/toolkit_hooks.py declares them (for
# configs that do not inherit it: run_config.declare_hooks; tests/unit/test_hooks_config.py keeps them equal)
TOOLKIT_HOOKS = dict(throughput='ThroughputHook', preemption='PreemptionHook',
                     nonfinite_loss='NonFiniteLossHook', batch_plan='BatchPlanHook',
                     data_position='DataPositionHook', rank_figures='RankFiguresHook',
                     eval_progress='EvalProgressHook', rng_state='RNGStateHook', step_bound='StepBoundHook')

__all__ = ['BatchPlanHook', 'DataPositionHook', 'EvalProgressHook', 'NonFiniteLossError', 'NonFiniteLossHook',
           'PreemptionHook', 'RankFiguresHook', 'RNGStateHook', 'ShowDirHook', 'StepBoundHook', 'TOOLKIT_HOOKS',
           'ThroughputHook']
