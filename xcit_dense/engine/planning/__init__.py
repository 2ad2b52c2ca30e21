"""Turning a config into a run: the batch plan, auto-fit and out-of-memory advice, the toolkit's
declared hooks, and assembling training (run_config); the hooks that record the plan and the fit."""
from .auto_fit_record_hook import AUTO_FIT_KEY, AutoFitHook
from .batch_plan import BatchPlan, apply_batch_plan, resolve_batch_plan
from .batch_plan_hook import BatchPlanHook
from .declared_hooks import toolkit_hooks

__all__ = ['AUTO_FIT_KEY', 'AutoFitHook', 'BatchPlan', 'BatchPlanHook', 'apply_batch_plan', 'resolve_batch_plan',
           'toolkit_hooks']
