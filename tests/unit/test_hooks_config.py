"""The toolkit's hooks are config data: a user config keeps them, and each is switched off by name."""
import pytest
from helpers import ROOT, tiny_seg_config
from mmengine.config import Config
from mmengine.registry import HOOKS
from mmengine.runner import Runner

import xcit_dense.engine  # noqa: F401  (registers the toolkit's hooks)
from xcit_dense.builder import load_config
from xcit_dense.engine.planning.declared_hooks import declaration_path, toolkit_hooks
from xcit_dense.engine.planning.run_config import configure_training_hooks, declare_hooks
from xcit_dense.io.checkpoint import ATOMIC_WRITES

PLAN = dict(world_size=1, images_per_gpu=2, accumulation=1, effective_batch=2, lr=6e-5)


def user_config(tmp_path, **overrides) -> str:
    """A user's config on top of a toolkit config, with its own ``custom_hooks`` list."""
    base = tiny_seg_config(tmp_path, tmp_path / 'no_data')
    path = tmp_path / 'user.py'
    lines = [f'_base_ = [{str(base)!r}]', "custom_hooks = [dict(type='EmptyCacheHook')]"]
    lines += [f'{key} = {value!r}' for key, value in overrides.items()]
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def hook_names(cfg: Config, tmp_path) -> list:
    """The hook classes of the Runner built from ``cfg``, in calling order."""
    cfg.work_dir = str(tmp_path / 'work')
    return [type(hook).__name__ for hook in Runner.from_cfg(cfg).hooks]


def test_own_custom_hooks_keep_the_toolkit_hooks(tmp_path):
    """Built as OpenMMLab's own train tools build it: no help from tools/train.py."""
    cfg = Config.fromfile(user_config(tmp_path))
    names = hook_names(cfg, tmp_path)
    assert 'EmptyCacheHook' in names
    for hook_type in toolkit_hooks().values():
        assert names.count(hook_type) == 1, hook_type
    # the loss guard runs before the checkpoint hook, the preemption checkpoint after it
    assert names.index('NonFiniteLossHook') < names.index('CheckpointHook') < names.index('PreemptionHook')
    assert cfg.default_hooks.checkpoint.backend_args == dict(backend='atomic_local')


@pytest.mark.parametrize('name', sorted(toolkit_hooks()))
def test_a_hook_switched_off_by_name(tmp_path, name):
    cfg = load_config(user_config(tmp_path), {f'default_hooks.{name}': None})
    configure_training_hooks(cfg, PLAN)
    names = hook_names(cfg, tmp_path)
    for other, hook_type in toolkit_hooks().items():
        assert names.count(hook_type) == (other != name), hook_type
    assert 'EmptyCacheHook' in names and 'CheckpointHook' in names


def test_run_time_arguments_go_into_the_entries(tmp_path):
    cfg = load_config(user_config(tmp_path))
    configure_training_hooks(cfg, PLAN, skip_nonfinite=True)
    cfg.work_dir = str(tmp_path / 'work')
    hooks = {type(hook).__name__: hook for hook in Runner.from_cfg(cfg).hooks}
    assert hooks['BatchPlanHook'].plan == PLAN
    assert hooks['NonFiniteLossHook'].skip is True


def test_a_type_in_custom_hooks_is_not_added_twice(tmp_path):
    custom = [dict(type='NonFiniteLossHook', skip=True), dict(type='EvalProgressHook')]
    cfg = load_config(user_config(tmp_path, custom_hooks=custom))
    configure_training_hooks(cfg, PLAN)
    names = hook_names(cfg, tmp_path)
    assert names.count('NonFiniteLossHook') == names.count('EvalProgressHook') == 1


def test_configs_without_the_toolkit_bases_get_the_hooks():
    cfg = Config(dict(default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1))))
    configure_training_hooks(cfg, PLAN)
    assert {name: cfg.default_hooks[name]['type'] for name in toolkit_hooks()} == toolkit_hooks()
    assert cfg.default_hooks.batch_plan.plan == PLAN
    assert cfg.default_hooks.checkpoint.backend_args == dict(backend='atomic_local')
    test_cfg = Config(dict())
    declare_hooks(test_cfg, names=['eval_progress'])
    assert dict(test_cfg.default_hooks) == dict(eval_progress=dict(type='EvalProgressHook'))


def test_the_declaration_reaches_both_tasks_runtimes():
    """configs/_base_/toolkit_hooks.py, the one list of the toolkit's hooks (the package reads it), names
    every hook the package registers for training and testing, and both tasks' runtimes inherit it."""
    assert declaration_path() == ROOT / 'configs/_base_/toolkit_hooks.py'
    declared = toolkit_hooks()
    # added by the tools on request (--show-dir, --auto-fit, --ema)
    on_request = {'ShowDirHook', 'AutoFitHook', 'OptimizerStepEMAHook'}
    registered = {name for name, hook in HOOKS.module_dict.items() if hook.__module__.startswith('xcit_dense.')}
    assert set(declared.values()) == registered - on_request
    for runtime in ('default_runtime_det.py', 'schedules/schedule_80k_seg.py', 'schedules/schedule_160k_seg.py'):
        hooks = Config.fromfile(str(ROOT / 'configs/_base_' / runtime)).default_hooks
        assert {name: hooks[name]['type'] for name in declared} == declared, runtime
        assert hooks.checkpoint.backend_args == ATOMIC_WRITES, runtime
