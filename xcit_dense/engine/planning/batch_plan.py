"""Linear LR scaling and gradient accumulation that keep a recipe's meaning on any hardware.

The effective total batch is world size x images per GPU x accumulation steps. MMEngine's own
``auto_scale_lr`` ignores accumulation, and its iteration-based loops and schedulers count
micro-iterations; this module resolves the plan once (``--auto-fit`` re-plans it for the images that
fit: ``BatchPlan.with_batch``) and rewrites the schedule so that the number of optimizer steps, warmup,
decay and the intervals keep their recipe values (the optimizer wrapper takes the plan's LR and
accumulation in ``run_config.configure_optim_wrapper``), and carries a checkpoint over when a resume
changes the plan (``BatchPlanHook``).
"""
from dataclasses import dataclass, replace
from typing import Optional

from mmengine.config import Config


@dataclass(frozen=True)
class BatchPlan:
    """How one run batches its images and scales its learning rate."""

    world_size: int
    images_per_gpu: int
    accumulation: int
    reference_batch: int
    base_lr: float
    scale_lr: bool

    @property
    def effective_batch(self) -> int:
        return self.world_size * self.images_per_gpu * self.accumulation

    @property
    def lr_scale(self) -> float:
        return self.effective_batch / self.reference_batch if self.scale_lr else 1.0

    @property
    def lr(self) -> float:
        return self.base_lr * self.lr_scale

    def with_batch(self, images_per_gpu: int, accumulation: int) -> 'BatchPlan':
        """This plan at another (images per GPU, accumulation), world size, reference batch, LR and its
        scaling kept: ``--auto-fit``'s choice among the pairs of the same product (engine/planning/auto_fit.py)."""
        return replace(self, images_per_gpu=_positive_int(images_per_gpu, 'images per GPU'),
                       accumulation=_positive_int(accumulation, 'accumulation'))

    def as_dict(self) -> dict:
        """What a checkpoint records of the plan (see ``BatchPlanHook``)."""
        return dict(world_size=self.world_size, images_per_gpu=self.images_per_gpu,
                    accumulation=self.accumulation, effective_batch=self.effective_batch,
                    lr=self.lr)

    def describe_batch_and_lr(self) -> str:
        """The run plan line's part: the batch per GPU and in all, the accumulation, the LR and its scale."""
        return (f'world size {self.world_size}, {self.images_per_gpu} images per GPU, '
                f'accumulation {self.accumulation}, effective batch {self.effective_batch} '
                f'(reference {self.reference_batch}), lr {self.lr:.3g} '
                f'(scale x{self.lr_scale:.3g}{"" if self.scale_lr else ", scaling off"})')


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{what} must be a positive integer, got {value!r}')
    return value


def resolve_batch_plan(cfg: Config, world_size: int, accumulation: Optional[int] = None,
                       keep_total_batch: bool = False, scale_lr: Optional[bool] = None) -> BatchPlan:
    """Work out the plan from the config and the command line.

    ``accumulation`` overrides ``optim_wrapper.accumulative_counts``; ``keep_total_batch``
    picks the accumulation that reaches the reference batch (``auto_scale_lr.base_batch_size``)
    on this hardware; ``scale_lr`` overrides ``auto_scale_lr.enable``.
    """
    world_size = _positive_int(world_size, 'world size')
    images = _positive_int(cfg.train_dataloader.get('batch_size'), 'train_dataloader.batch_size')
    auto = cfg.get('auto_scale_lr') or {}
    if 'base_batch_size' not in auto:
        raise ValueError('the config records no reference total batch: set '
                         'auto_scale_lr = dict(enable=False, base_batch_size=16)')
    reference = _positive_int(auto['base_batch_size'], 'auto_scale_lr.base_batch_size')
    if keep_total_batch:
        if accumulation is not None:
            raise ValueError('give either --accumulation or --keep-total-batch, not both')
        per_step = world_size * images
        if reference % per_step:
            raise ValueError(
                f'the reference total batch {reference} is not a multiple of world size {world_size} '
                f'x {images} images per GPU = {per_step}: change the number of GPUs or '
                f'train_dataloader.batch_size so that it divides {reference}, or drop --keep-total-batch')
        accumulation = reference // per_step
    if accumulation is None:
        accumulation = _positive_int(cfg.optim_wrapper.get('accumulative_counts', 1),
                                     'optim_wrapper.accumulative_counts')
    else:  # the command line's (or what --keep-total-batch or --auto-fit worked out: positive)
        accumulation = _positive_int(accumulation, '--accumulation')
    return BatchPlan(world_size, images, accumulation, reference,
                     base_lr=float(cfg.optim_wrapper.optimizer.lr),
                     scale_lr=bool(auto.get('enable', False)) if scale_lr is None else scale_lr)


def recount(counter: int, old_accumulation: int, new_accumulation: int) -> int:
    """A micro-iteration counter under another accumulation: whole optimizer steps x new accumulation.

    Iteration counters count micro-iterations (optimizer steps x accumulation); a recipe counts
    optimizer steps, which is accumulation 1.
    """
    return counter // old_accumulation * new_accumulation


def recount_scheduler(sched: dict, accumulation: int) -> None:
    """Rewrite an iteration-counted scheduler's config in place from optimizer steps to micro-iterations.

    ``hooks.OptimizerStepSchedulerHook`` steps the schedulers at the end of each optimizer step, so
    step j trains at their value after j x accumulation micro-iterations: every count is multiplied,
    except ``end``. MMEngine's warmup and decay schedules reach their last value at ``end - 1``
    (``total_iters = end - begin - 1``), so ``end`` becomes one past (end - 1) x accumulation; the
    cosine schedules' default ``T_max`` (``end - begin``) is written out, multiplied, before that.
    Other per-iteration factors (ExponentialLR's ``gamma``) are not rewritten.
    """
    begin, end = sched.get('begin', 0), sched.get('end')
    if 'CosineAnnealing' in str(sched.get('type')) and sched.get('T_max') is None and isinstance(end, int):
        sched['T_max'] = end - begin
    for key in ('begin', 'T_max', 'step_size'):
        if isinstance(sched.get(key), int):
            sched[key] = recount(sched[key], 1, accumulation)
    if isinstance(sched.get('milestones'), (list, tuple)):
        sched['milestones'] = [recount(step, 1, accumulation) for step in sched['milestones']]
    if isinstance(end, int):
        sched['end'] = recount(end - 1, 1, accumulation) + 1


def apply_batch_plan(cfg: Config, plan: BatchPlan) -> None:
    """Rewrite the schedule of ``cfg`` in place for ``plan``; MMEngine's own LR scaling is switched off.

    The optimizer wrapper's share (its accumulation and LR) is set by ``run_config.configure_optim_wrapper``.
    """
    acc = plan.accumulation
    cfg.auto_scale_lr = dict(enable=False, base_batch_size=plan.reference_batch)
    schedulers = cfg.get('param_scheduler') or []
    for sched in schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]:
        if sched.get('eta_min'):
            sched['eta_min'] = sched['eta_min'] * plan.lr_scale
        if not sched.get('by_epoch', True):  # iteration-counted: count micro-iterations
            recount_scheduler(sched, acc)
    loop = cfg.train_cfg
    if not loop.get('by_epoch', loop.get('type') == 'EpochBasedTrainLoop'):
        for key in ('max_iters', 'val_interval', 'val_begin'):
            if isinstance(loop.get(key), int):
                loop[key] = recount(loop[key], 1, acc)
    ckpt = cfg.get('default_hooks', {}).get('checkpoint')
    if ckpt is not None and not ckpt.get('by_epoch', True) and isinstance(ckpt.get('interval'), int):
        ckpt['interval'] = recount(ckpt['interval'], 1, acc)


def replan_checkpoint(checkpoint: dict, old: dict, new: dict, count_iterations: bool) -> None:
    """Carry a checkpoint written under plan ``old`` over to plan ``new`` (both ``as_dict()``).

    The LR of the optimizer and schedulers is rescaled to the new plan; with
    ``count_iterations`` (an iteration-based loop) the iteration counters are recounted so
    that the number of optimizer steps done is kept.
    """
    lr_factor = new['lr'] / old['lr']
    for group in checkpoint.get('optimizer', {}).get('param_groups', []):
        for key in ('lr', 'initial_lr'):
            if key in group:
                group[key] *= lr_factor
    schedulers = checkpoint.get('param_schedulers', []) or []
    for state in schedulers:
        for key in ('base_values', '_last_value'):
            if isinstance(state.get(key), list):
                state[key] = [v * lr_factor for v in state[key]]
    acc_old, acc_new = old['accumulation'], new['accumulation']
    if acc_old == acc_new or not count_iterations:
        return
    meta = checkpoint['meta']
    meta['iter'] = recount(meta['iter'], acc_old, acc_new)
    for state in schedulers:
        for key in ('last_step', '_global_step'):
            if isinstance(state.get(key), int):
                state[key] = recount(state[key], acc_old, acc_new)
