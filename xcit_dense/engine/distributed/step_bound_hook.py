"""The short wait bound around each training step, the long one around everything else.

Inside a step every rank does the same work, so a lost peer is named within ``XCIT_STEP_TIMEOUT``
(see ``engine.distributed.wait_bounds``). What happens between steps may keep one rank much longer than the
others: rank 0 writing a checkpoint (the others would wait for it inside the next step's first
collective), a validation, the start of an epoch (its data workers). After such a gap the ranks
first meet under the long bound, so that no rank starts a step while another is still busy; only
then is the step bound set. The first step of a run keeps the long bound (data workers starting,
a first compilation); a compile in a later step extends that step's bound (``engine.distributed.compile_bound``).
"""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .checkpoint_schedule import checkpoint_due
from .collectives import barrier_within
from .process_group import begin_step_bound, end_step_bound, wait_bound_s, world_size


@HOOKS.register_module()
class StepBoundHook(Hook):
    """Switches the process groups to the step bound as each step begins (after the first) and
    back to the long bound as it ends; a meeting of the ranks after a long gap."""

    priority = 'VERY_HIGH'  # first at a step's start and end: the bound covers the step, no more

    def __init__(self) -> None:
        self._first = True
        self._gap = True  # something since the last step may have kept one rank longer than the others

    def before_train(self, runner) -> None:
        self._first = self._gap = True

    def before_train_epoch(self, runner) -> None:
        self._gap = True

    def after_val(self, runner) -> None:
        self._gap = True

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if world_size() == 1:
            return
        if self._first:
            self._first = False
            return
        if self._gap:
            barrier_within(wait_bound_s())
            self._gap = False
        begin_step_bound()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if world_size() == 1:
            return
        end_step_bound()
        self._gap = self._gap or checkpoint_due(runner, batch_idx)
