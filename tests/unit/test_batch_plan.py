"""LR scaling and gradient accumulation: the resolved plan for a table of cases, and the learning rate
of each optimizer step in short in-process runs of a one-layer model; no processes."""
import warnings

import pytest
import torch
from helpers import ROOT, config_copy, own_runner_instances, run_tool_in_process
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import DataLoader

from xcit_dense.engine import apply_batch_plan, resolve_batch_plan
from xcit_dense.engine.planning.batch_plan import replan_checkpoint
from xcit_dense.engine.planning.declared_hooks import toolkit_hooks
from xcit_dense.engine.planning.run_config import configure_optim_wrapper

DET = str(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py')
SEG = str(ROOT / 'configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py')


def plan_for(config, world, images, accumulation=None, keep=False, scale=None):
    cfg = config_copy(config)
    cfg.train_dataloader.batch_size = images
    plan = resolve_batch_plan(cfg, world, accumulation, keep, scale)
    apply_batch_plan(cfg, plan)
    configure_optim_wrapper(cfg, plan)  # the plan's share of the optimizer wrapper: LR, accumulation
    return plan, cfg


@pytest.mark.parametrize('world', [1, 4, 8, 16])
@pytest.mark.parametrize('images', [1, 2, 4])
@pytest.mark.parametrize('accumulation', [1, 2])
@pytest.mark.parametrize('scale', [True, False])
@pytest.mark.parametrize('config, base_lr', [(DET, 1e-4), (SEG, 6e-5)])
def test_lr_follows_the_effective_batch(config, base_lr, world, images, accumulation, scale):
    plan, cfg = plan_for(config, world, images, accumulation, scale=scale)
    effective = world * images * accumulation
    assert plan.effective_batch == effective
    expected_lr = base_lr * effective / 16 if scale else base_lr
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(expected_lr)
    assert cfg.optim_wrapper.accumulative_counts == accumulation
    # MMEngine's own scaling (which ignores accumulation) must not scale a second time
    assert cfg.auto_scale_lr.enable is False
    # the no-decay rule for norms is relative, so it follows the scaled LR
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys['norm'] == dict(decay_mult=0.)


@pytest.mark.parametrize('accumulation', [1, 2, 4])
def test_iteration_schedule_keeps_recipe_in_optimizer_steps(accumulation):
    _, cfg = plan_for(SEG, 4, 2, accumulation)
    a = accumulation
    assert cfg.train_cfg.max_iters == 160000 * a
    assert cfg.train_cfg.val_interval == 16000 * a
    assert cfg.default_hooks.checkpoint.interval == 16000 * a
    warmup, poly = cfg.param_scheduler
    # last active at micro-iteration (end - 1) x a, the start of the recipe's last step (end - 1)
    assert (warmup.begin, warmup.end) == (0, 1499 * a + 1)
    assert (poly.begin, poly.end) == (0, 159999 * a + 1)
    assert poly.eta_min == 0


@pytest.mark.parametrize('accumulation', [1, 2, 4])
def test_epoch_schedule_keeps_epochs_and_warmup_steps(accumulation):
    _, cfg = plan_for(DET, 4, 2, accumulation)
    assert cfg.train_cfg.max_epochs == 36 and cfg.train_cfg.val_interval == 1
    warmup, steps = cfg.param_scheduler
    assert warmup.end == 499 * accumulation + 1  # warmup is counted in (micro-)iterations
    assert steps.milestones == [27, 33] and steps.by_epoch


@pytest.mark.parametrize('world, images, expected', [(8, 2, 1), (4, 2, 2), (2, 2, 4), (1, 2, 8),
                                                     (1, 4, 4), (16, 1, 1)])
def test_keep_total_batch_picks_the_accumulation(world, images, expected):
    plan, cfg = plan_for(SEG, world, images, keep=True, scale=True)
    assert plan.accumulation == expected
    assert plan.effective_batch == 16
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(6e-5)
    assert cfg.train_cfg.max_iters == 160000 * expected


def test_keep_total_batch_that_does_not_divide_names_the_numbers():
    with pytest.raises(ValueError, match=r'16 is not a multiple of world size 3 x 2 images per GPU = 6'):
        plan_for(SEG, 3, 2, keep=True)


def test_keep_total_batch_excludes_an_explicit_accumulation():
    with pytest.raises(ValueError, match='give either --accumulation or --keep-total-batch, not both'):
        plan_for(SEG, 2, 2, accumulation=2, keep=True)


@pytest.mark.parametrize('value', [0, -1, 1.5, '2'])
def test_bad_accumulation_is_refused(value):
    """Named as the user gave it: the option with its dashes, or the config's key."""
    cfg = config_copy(SEG)
    with pytest.raises(ValueError, match=r'^--accumulation must be a positive integer'):
        resolve_batch_plan(cfg, 1, accumulation=value)
    cfg.optim_wrapper.accumulative_counts = value
    with pytest.raises(ValueError, match=r'^optim_wrapper\.accumulative_counts must be a positive integer'):
        resolve_batch_plan(cfg, 1)


@pytest.mark.parametrize('accumulation, keep, scale', [(None, True, True), (3, False, None), (2, False, False)])
def test_a_plan_at_another_batch_is_the_plan_resolved_at_that_batch(accumulation, keep, scale):
    """--auto-fit's fitted plan (``with_batch``: 1 image per GPU, the accumulation that keeps the effective
    batch) is what resolving the config at that batch gives: world size, reference, LR and scaling kept."""
    cfg = config_copy(SEG)
    requested = resolve_batch_plan(cfg, 2, accumulation, keep, scale)
    fitted = requested.with_batch(1, requested.images_per_gpu * requested.accumulation)
    cfg.train_dataloader.batch_size = 1
    assert fitted == resolve_batch_plan(cfg, 2, fitted.accumulation, False, scale)
    assert fitted.effective_batch == requested.effective_batch and fitted.lr == requested.lr
    with pytest.raises(ValueError, match='accumulation must be a positive integer, got 0'):
        requested.with_batch(1, 0)


def test_plan_line_says_everything():
    plan, _ = plan_for(SEG, 2, 2, keep=True, scale=True)
    line = plan.describe_batch_and_lr()
    for part in ('world size 2', '2 images per GPU', 'accumulation 4', 'effective batch 16',
                 'lr 6e-05', 'x1'):
        assert part in line, line


@pytest.mark.parametrize('options, message', [
    ({'model.backbone.archh': 'tiny_12'}, r'model\.backbone\.archh: XCiT has no such argument'),
    ({'model.backbone.drop_path_rate': '0.1'}, r"model\.backbone\.drop_path_rate='0\.1': expected float, got str"),
    ({'model.backbone.out_indices': [3, 5, 7.5, 11]}, r'model\.backbone\.out_indices=.*expected'),
    ({'model.backbone.with_cp': 'yes'}, r"model\.backbone\.with_cp='yes': expected one of False, True, 'selective'"),
    ({'train_dataloader.batch_size': '2'}, r"train_dataloader\.batch_size='2': expected a positive int"),
    ({'train_cfg.max_epochs': 2}, r'train_cfg\.max_epochs: this config trains by iteration .*train_cfg\.max_iters=N'),
    ({'train_dataloader.num_workers': 0},  # (the recipes keep their workers: DataLoader's raw ValueError)
     r'train_dataloader\.num_workers=0 with train_dataloader\.persistent_workers=True: .*persistent_workers=False'),
    ({'train_cfg.by_epoch': True, 'train_cfg.type': None},  # (MMEngine's other spelling of an epoch loop)
     r'train_cfg\.max_iters: this config trains by epoch'),
])
def test_wrong_key_or_type_fails_at_load_naming_it(options, message):
    from xcit_dense.builder import load_config
    with pytest.raises(ValueError, match=message):
        load_config(SEG, options)


def test_train_tool_reports_a_bad_config_without_a_traceback(tmp_path):
    # refused before a Runner is built: the tool runs in this process, from the repository
    proc = run_tool_in_process('tools/train.py', SEG, '--work-dir', tmp_path, '--cfg-options',
                               'model.backbone.patch_szie=16', cwd=ROOT)
    assert proc.returncode != 0
    assert 'model.backbone.patch_szie: XCiT has no such argument' in proc.stderr
    assert 'Traceback' not in proc.stderr
    # the first thing a user tries to shorten a detection run: one error line, no work-dir folder
    proc = run_tool_in_process('tools/train.py', DET, '--work-dir', tmp_path / 'short', '--cfg-options',
                               'train_cfg.max_iters=4', cwd=ROOT)
    assert proc.returncode != 0 and 'Traceback' not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f'error in {DET}: train_cfg.max_iters: this config trains by epoch '
                                  '(max_epochs=36); to shorten the run set train_cfg.max_epochs=N'), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / 'short').exists()
    proc = run_tool_in_process('tools/train.py', 'configs/xcit/nope.py', cwd=ROOT)
    assert proc.returncode != 0 and 'config file not found: configs/xcit/nope.py' in proc.stderr


@pytest.mark.parametrize('iteration_based', [True, False])
def test_a_checkpoint_under_more_accumulation_keeps_the_optimizer_steps(iteration_based):
    """5 micro-iterations at accumulation 1 (5 steps) become 10 at accumulation 2; the LR doubles."""
    old = dict(world_size=2, images_per_gpu=2, accumulation=1, effective_batch=4, lr=1e-4)
    new = dict(world_size=2, images_per_gpu=2, accumulation=2, effective_batch=8, lr=2e-4)
    checkpoint = dict(meta=dict(iter=5, batch_plan=old),
                      optimizer=dict(param_groups=[dict(lr=1e-4, initial_lr=1e-4)]),
                      param_schedulers=[dict(base_values=[1e-4], _last_value=[1e-4], last_step=5,
                                             _global_step=5)])
    replan_checkpoint(checkpoint, old, new, count_iterations=iteration_based)
    steps = 10 if iteration_based else 5
    assert checkpoint['meta']['iter'] == steps
    assert checkpoint['optimizer']['param_groups'] == [dict(lr=2e-4, initial_lr=2e-4)]
    assert checkpoint['param_schedulers'] == [dict(base_values=[2e-4], _last_value=[2e-4],
                                                   last_step=steps, _global_step=steps)]


class OneLayer(BaseModel):
    """The smallest model MMEngine trains: one linear layer, its squared output as the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='loss'):
        return dict(loss=self.linear(inputs).pow(2).mean())


class RecordStepLR(Hook):
    """The learning rate each optimizer step trains at (torch's step pre-hook)."""

    def __init__(self) -> None:
        self.lrs = []

    def before_train(self, runner) -> None:
        runner.optim_wrapper.optimizer.register_step_pre_hook(
            lambda optimizer, args, kwargs: self.lrs.append(optimizer.param_groups[0]['lr']))


# each a loop, a schedule in the recipe's optimizer steps (epochs of 4 steps) and how close the steps'
# LRs are: MMEngine chains the active schedulers, a factor each, except that a cosine's eta_min is
# added, so a cosine with eta_min beside a warmup moves by slightly other values when stepped by
# micro-iterations (here within 5e-4 of the LR)
SCHEDULES = {
    'iterations': (dict(by_epoch=False, max_iters=8), 1e-9, [
        dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
        dict(type='MultiStepLR', milestones=[4], gamma=0.5, by_epoch=False),
        dict(type='StepLR', step_size=3, gamma=0.8, by_epoch=False),
        dict(type='CosineAnnealingLR', by_epoch=False, begin=2, end=8),
        dict(type='PolyLR', power=1.0, by_epoch=False, begin=0, end=8)]),
    'epochs': (dict(by_epoch=True, max_epochs=2), 1e-3, [  # the detection recipes' and the demo's
        dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
        dict(type='MultiStepLR', milestones=[1], gamma=0.5, by_epoch=True),
        dict(type='CosineAnnealingLR', eta_min_ratio=0.01, by_epoch=True, begin=0, end=2,
             convert_to_iter_based=True)]),
}


def step_lrs(tmp_path, loop: dict, schedule: list, images: int, accumulation: int) -> list:
    """The LR of each optimizer step of a run planned as tools/train.py plans it (``images`` per batch,
    ``accumulation``; 16 samples), with the scheduler hook the toolkit declares."""
    cfg = Config(dict(train_dataloader=dict(batch_size=images), train_cfg=loop, param_scheduler=schedule,
                      optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
                      auto_scale_lr=dict(enable=False, base_batch_size=4)))
    plan = resolve_batch_plan(cfg, 1, accumulation)
    apply_batch_plan(cfg, plan)
    configure_optim_wrapper(cfg, plan)
    record = RecordStepLR()
    data = DataLoader([dict(inputs=torch.full((2,), float(i))) for i in range(16)], batch_size=images)
    with own_runner_instances():
        Runner(model=OneLayer(), work_dir=str(tmp_path / f'acc{accumulation}'), train_dataloader=data,
               train_cfg=cfg.train_cfg, optim_wrapper=cfg.optim_wrapper, param_scheduler=cfg.param_scheduler,
               default_hooks=dict(param_scheduler=dict(type=toolkit_hooks()['param_scheduler']), logger=None,
                                  checkpoint=None),
               custom_hooks=[record], default_scope='mmengine', cfg=cfg).train()
    return record.lrs


@pytest.mark.parametrize('accumulation', [2, 4])
@pytest.mark.parametrize('kind', sorted(SCHEDULES))
def test_each_optimizer_step_trains_at_the_recipes_lr(tmp_path, kind, accumulation):
    """Batch 4 at once, and 4 // accumulation images accumulated: every optimizer step at the same LR,
    with no warning that a scheduler stepped before the optimizer (MMEngine's scheduler hook steps
    after every micro-batch: step j trained at the value of micro-iteration (j + 1) x accumulation - 1)."""
    loop, tolerance, schedule = SCHEDULES[kind]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        recipe = step_lrs(tmp_path, loop, schedule, 4, 1)
        accumulated = step_lrs(tmp_path, loop, schedule, 4 // accumulation, accumulation)
    assert len(recipe) == 8 and len(set(recipe)) > 4  # 8 steps, the LR moving
    assert accumulated == pytest.approx(recipe, rel=tolerance, abs=1e-12)
    assert not [w for w in caught if 'scheduler.step()' in str(w.message)]
