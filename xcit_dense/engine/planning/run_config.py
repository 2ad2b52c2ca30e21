"""Turning a config and the command line into the Runner config of this run on this machine:
the tools' shared start, norms, the optimizer wrapper, hooks, trackers, sample checks, resuming.

``open_training`` and ``assemble_training`` are tools/train.py's steps from config to Runner config (before
the process group forms, and in it), ``open_testing`` and ``assemble_testing`` tools/test.py's;
``configure_optim_wrapper`` is the one place that changes ``optim_wrapper``.
"""
import argparse
import logging
import os
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log

from xcit_launch.preflight import check_data_files

from ...builder import load_config
from ...compile_option import take_compile_option
from ...datasets.loaded_size import loader_color_type
from ...errors import ConfigNotFoundError, ToolkitError
from ...io.checkpoint import ATOMIC_WRITES
from ...io.hub import is_hub_name
from ...pixel_limit import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, MAX_BYTES_KEY, MAX_PIXELS_KEY
from ...published import is_published_model, open_published
from ...tasks import task_of_config
from ..distributed.process_group import describe_topology, gpus_present
from ..training.ddp import NO_FORWARD_BUFFER_SYNC
from ..training.model_ema_hook import ema_hook
from ..training.optim_wrappers import GUARDED
from ..training.resume import Resume
from ..training.resume_fit import ResumeFit
from .auto_fit import FitRecord, device_record, fit, record_from
from .batch_plan import BatchPlan, apply_batch_plan, resolve_batch_plan
from .declared_hooks import toolkit_hooks
from .evaluated_checkpoint import EvaluatedCheckpoint


def open_tool_config(path: str, cfg_options: Optional[dict]) -> Config:
    """The start tools/train.py and tools/test.py share: the config at ``path`` with ``cfg_options``,
    its task's models imported (before the Runner does: a segmentation run keeps mmdet out).

    A missing file raises ConfigNotFoundError; a config that does not load raises ValueError.
    (The GPU and its ops are checked once the rank's device is set: ``init_distributed``.)"""
    if not os.path.isfile(path):
        raise ConfigNotFoundError(f'config file not found: {path}')
    cfg = load_config(path, cfg_options)
    task_of_config(cfg).import_models()
    return cfg


def replace_sync_bn(node: Any) -> int:
    """Replace every ``dict(type='SyncBN')`` in a config tree by BN; returns how many."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += replace_sync_bn(value)
    return count


def adapt_to_machine(cfg: Config) -> None:
    """SyncBN -> BN without a process group or without a GPU; DDP on the device set for this rank.

    A launched run of one process on a GPU keeps SyncBN (NCCL serves a group of one). MMEngine
    gives DDP ``device_ids=[LOCAL_RANK]``, which is not the device set when Slurm binds GPUs to
    tasks (engine/distributed/process_group.py's ``slurm_device``): the wrapper gets the current device."""
    on_gpu, grouped = gpus_present(), dist.is_initialized()
    if not grouped or not on_gpu:
        if replace_sync_bn(cfg.model):
            reason = 'one process' if not grouped else 'no GPU'
            print_log(f'SyncBN replaced by BN ({reason})', logger='current')
    if grouped:
        wrapper = dict(type='GradLayoutDDP', **NO_FORWARD_BUFFER_SYNC,
                       find_unused_parameters=cfg.get('find_unused_parameters', False))
        wrapper.update(cfg.get('model_wrapper_cfg') or {})
        # a CPU module takes no device ids
        wrapper['device_ids'] = [torch.cuda.current_device()] if on_gpu else None
        cfg.model_wrapper_cfg = wrapper


# MMEngine's visualization backends by their --vis-backend name; tensorboard is in the default
# install, mlflow and wandb need their packages (pip install mlflow / wandb)
VIS_BACKENDS = dict(tensorboard='TensorboardVisBackend', mlflow='MLflowVisBackend',
                    wandb='WandbVisBackend')


def add_vis_backends(cfg: Config, names: Iterable[str]) -> None:
    """Log scalars (loss, lr, img_per_s, metrics) to these trackers too, besides the local files."""
    backends = cfg.visualizer.setdefault('vis_backends', [])
    present = {backend.get('type') for backend in backends}
    for name in names:
        if VIS_BACKENDS[name] not in present:
            backends.append(dict(type=VIS_BACKENDS[name]))


def configure_optim_wrapper(cfg: Config, plan: Optional[BatchPlan] = None, amp: Optional[str] = None) -> None:
    """Every run-time change to ``optim_wrapper``: the batch plan's accumulation and LR, the ``--amp``
    type, and the non-finite loss guard while the ``nonfinite_loss`` hook is on (a ``Guarded*OptimWrapper``
    type, so the dumped config and the log show it). Call it once the hooks are declared.

    ``--amp fp16`` trains with dynamic loss scaling, ``bf16`` without a loss scaler (bf16 keeps
    float32's exponent range); on a CPU, fp32 with a message."""
    wrapper = cfg.optim_wrapper
    if plan is not None:
        wrapper.accumulative_counts = plan.accumulation
        wrapper.optimizer.lr = plan.lr
    if amp not in (None, 'fp16', 'bf16'):
        raise ValueError(f"--amp takes fp16 or bf16, got {amp!r}")
    if amp and not gpus_present():
        print_log(f'--amp {amp} asked for, but there is no GPU: training in fp32', logger='current',
                  level=logging.WARNING)
    elif amp == 'fp16':
        wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic', dtype='float16')
    elif amp == 'bf16':
        wrapper.pop('loss_scale', None)
        wrapper.update(type='BF16OptimWrapper', dtype='bfloat16')
    custom = {hook.get('type') for hook in cfg.get('custom_hooks') or []}
    if (cfg.get('default_hooks') or {}).get('nonfinite_loss') is not None or 'NonFiniteLossHook' in custom:
        kind = wrapper.get('type', 'OptimWrapper')
        wrapper.type = GUARDED.get(kind, kind)


def declare_hooks(cfg: Config, names: Optional[Iterable[str]] = None) -> None:
    """Settle the toolkit's ``default_hooks`` entries before the Runner is built.

    Configs that do not inherit configs/_base_/toolkit_hooks.py get the entries in ``names`` (None:
    every one it declares); a type the config already has in ``custom_hooks`` is not added twice;
    an entry switched off with None is dropped, since MMEngine only accepts None for its own
    default hooks.
    """
    if cfg.get('default_hooks') is None:
        cfg.default_hooks = {}
    default_hooks = cfg.default_hooks
    custom = {hook.get('type') for hook in cfg.get('custom_hooks') or []}
    declared = toolkit_hooks()
    names = set(declared if names is None else names)
    for name, hook_type in declared.items():
        if hook_type in custom:
            default_hooks.pop(name, None)
        elif name not in default_hooks:
            if name in names:
                default_hooks[name] = dict(type=hook_type)
        elif default_hooks[name] is None:
            del default_hooks[name]


def configure_training_hooks(cfg: Config, plan: dict, skip_nonfinite: bool = False) -> None:
    """The toolkit's training hooks with this run's arguments: the batch plan in checkpoints,
    ``--skip-nonfinite`` for the loss guard, and atomic checkpoint writes."""
    declare_hooks(cfg)
    default_hooks = cfg.default_hooks
    if 'batch_plan' in default_hooks:
        default_hooks['batch_plan']['plan'] = plan
    if skip_nonfinite and 'nonfinite_loss' in default_hooks:
        default_hooks['nonfinite_loss']['skip'] = True
    checkpoint = default_hooks.get('checkpoint')
    if checkpoint is not None and not checkpoint.get('backend_args'):
        checkpoint['backend_args'] = dict(ATOMIC_WRITES)


def check_samples(cfg: Config, loaders: Iterable[str]) -> None:
    """Wrap the datasets of ``loaders``: a bad training sample is reported, counted and replaced
    (``SkipBadSamples``), a bad validation or test sample stops the run naming the file
    (``StopOnBadSamples``). Both check files against the config's ``max_image_bytes`` and image
    headers against its ``max_image_pixels``."""
    limits = dict(max_image_pixels=cfg.get(MAX_PIXELS_KEY, DEFAULT_MAX_PIXELS),
                  max_image_bytes=cfg.get(MAX_BYTES_KEY, DEFAULT_MAX_BYTES))
    for loader in loaders:
        dataloader = cfg.get(loader)
        if not dataloader:
            continue
        wrapper = 'SkipBadSamples' if loader == 'train_dataloader' else 'StopOnBadSamples'
        dataset = dataloader.dataset
        if dataset.get('type') == wrapper:
            for key, value in limits.items():
                dataset.setdefault(key, value)
        else:
            dataloader.dataset = dict(type=wrapper, dataset=dataset, **limits)


@dataclass
class TrainingRun:
    """What ``assemble_training`` decided besides the config: the batch plan, where the run starts, and
    what the log says after the plan (``--auto-fit``'s tries, the weights' average)."""

    plan: BatchPlan
    resume: Resume
    notes: List[str] = field(default_factory=list)

    def plan_lines(self, backend: Optional[str], work_dir: str) -> List[str]:
        """What the log says before the first step: the run plan (processes, batch, LR), the notes and
        where the run starts."""
        return [f'Run plan: {describe_topology(backend)}; {self.plan.describe_batch_and_lr()}', *self.notes,
                *self.resume.describe_starting_point(work_dir)]


def fit_batch_to_memory(cfg: Config, args: argparse.Namespace, requested: BatchPlan,
                        checkpoint: Optional[dict]) -> Tuple[BatchPlan, List[str]]:
    """``--auto-fit`` (or ``auto_fit.enable``): the ``requested`` plan at the (images per GPU, accumulation)
    this run trains with, probed (engine/planning/auto_fit.py) or, on a resume with the same request, world
    size and device, as the checkpoint recorded; written back to ``train_dataloader.batch_size`` and recorded
    in checkpoints (``AutoFitHook``); and the log lines. (``requested``, []) when auto-fit is off."""
    settings = cfg.get('auto_fit') or {}
    if not (getattr(args, 'auto_fit', False) or settings.get('enable')):
        return requested, []
    device, total_memory = device_record()
    request = FitRecord((requested.images_per_gpu, requested.accumulation), None, requested.world_size, device,
                        total_memory)
    previous = record_from((checkpoint or {}).get('meta'))
    why = previous.differs_from(request) if previous is not None else None
    if previous is not None and why is None:
        fitted = requested.with_batch(*previous.fitted)
        lines = [f'auto-fit: {fitted.images_per_gpu} images per GPU x accumulation {fitted.accumulation}, as the '
                 f'checkpoint recorded for the same request, world size and device (not probed)']
    else:
        probe_model, compiled = take_compile_option(cfg.model)  # the model as the runner builds it
        probe_model = deepcopy(probe_model)
        replace_sync_bn(probe_model)
        fitted, lines = fit(cfg, probe_model, requested, amp=args.amp, ema=ema_requested(cfg, args.ema))
        if compiled:
            lines.insert(1, 'auto-fit: the probe measures the eager backbone (model.backbone.compile=True: '
                            "the compiled one's memory may differ)")
        if previous is not None:
            lines.insert(0, f'auto-fit: probing again, not reusing the checkpoint\'s fit: {why}')
    cfg.train_dataloader.batch_size = fitted.images_per_gpu
    record = request.with_fit((fitted.images_per_gpu, fitted.accumulation))
    cfg.custom_hooks = [*(cfg.get('custom_hooks') or []), dict(type='AutoFitHook', record=record.as_meta())]
    return fitted, lines


def ema_requested(cfg: Config, decay: Optional[float]) -> bool:
    """Whether the run keeps an EMA of its weights (``--ema DECAY`` or ``model_ema.enable``)."""
    return decay is not None or bool((cfg.get('model_ema') or {}).get('enable'))


def configure_ema(cfg: Config, decay: Optional[float], plan: BatchPlan) -> List[str]:
    """``--ema DECAY`` (or ``model_ema.enable`` in the config): an average of the weights trained beside
    the model (training/model_ema_hook.py), updated once per optimizer step; the log line that says so."""
    if not ema_requested(cfg, decay):
        return []
    settings = dict(cfg.get('model_ema') or {})
    decay = settings.get('decay', 0.9999) if decay is None else decay
    warmup = settings.get('warmup', 2000)
    cfg.custom_hooks = [*(cfg.get('custom_hooks') or []), ema_hook(decay, warmup)]
    return [f'EMA of the weights: decay {decay} per optimizer step (effective batch {plan.effective_batch}, '
            f'accumulation {plan.accumulation}), warm-up {warmup} steps; validation and the checkpoints\' '
            f'state_dict use the average (ema_state_dict: the trained weights)']


def open_training(args: argparse.Namespace) -> Config:
    """tools/train.py's start, before the process group forms: the config of CONFIG with ``--cfg-options``
    for ``--launcher``, its data files checked (``check_data_files``: a missing annotation file or image
    folder). Raises ConfigNotFoundError, or ValueError for a config that does not load or data not found."""
    cfg = open_tool_config(args.config, args.cfg_options)
    check_data_files(cfg)
    cfg.launcher = args.launcher
    return cfg


def choose_work_dir(cfg: Config, args: argparse.Namespace) -> None:
    """Training's and testing's rule: ``--work-dir``, else the config's ``work_dir``, else
    work_dirs/<the config file's stem>."""
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or str(Path('work_dirs') / Path(args.config).stem)


def assemble_training(cfg: Config, args: argparse.Namespace, world_size: int) -> TrainingRun:
    """Turn a training config and tools/train.py's arguments into this run's Runner config, in place:
    the checkpoint to resume from (read once, first: ``--auto-fit`` reuses what it recorded;
    ``Resume.hand_to`` gives it to the Runner), the batch plan (resolved once, auto-fitted on request, and
    passed on to the schedule, the hooks, the optimizer wrapper and the EMA), norms and DDP for this
    machine, trackers, the toolkit's hooks, the optimizer wrapper, the sample checks and the work dir.

    Raises ValueError for a batch plan that cannot be met, CheckpointError or FileNotFoundError for a
    checkpoint that cannot be resumed from."""
    choose_work_dir(cfg, args)
    resume = Resume.choose(cfg.work_dir, args.resume, ResumeFit(cfg))
    requested = resolve_batch_plan(cfg, world_size, args.accumulation, args.keep_total_batch, args.scale_lr)
    plan, fit_lines = fit_batch_to_memory(cfg, args, requested, resume.checkpoint)
    apply_batch_plan(cfg, plan)
    adapt_to_machine(cfg)
    add_vis_backends(cfg, args.vis_backend)
    configure_training_hooks(cfg, plan.as_dict(), args.skip_nonfinite)
    configure_optim_wrapper(cfg, plan, args.amp)
    check_samples(cfg, ['train_dataloader', 'val_dataloader'])
    resume.configure(cfg)
    if resume.path or cfg.get('load_from'):
        # the checkpoint holds every backbone weight (checked once built): no pretrained file is read
        # or downloaded only to be overwritten
        cfg.model.backbone.init_cfg = None
    return TrainingRun(plan, resume, fit_lines + configure_ema(cfg, args.ema, plan))


@dataclass
class EvaluationRun:
    """What ``open_testing`` opened: the Runner config (``assemble_testing`` completes it in place) and
    the checkpoint read once."""

    cfg: Config
    checkpoint: EvaluatedCheckpoint


def open_testing(args: argparse.Namespace) -> EvaluationRun:
    """tools/test.py's start, before the process group forms: the config of CONFIG with ``--cfg-options``,
    or of a published model given alone (xcit_dense/published.py), with ``--tta``'s test-time augmentation;
    the checkpoint located and read once.

    Raises ToolkitError for arguments that do not go together or a checkpoint file not found, ValueError
    for a config that does not load, CheckpointError for a checkpoint that cannot be read."""
    if is_published_model(args.config):
        if args.checkpoint is not None:
            raise ValueError(f'{args.config} is a published model, which holds its weights: give no CHECKPOINT')
        published = open_published(args.config, args.trust_config, args.cfg_options)
        task_of_config(published.config).import_models()
        cfg, checkpoint = published.config, published.weights
    elif args.checkpoint is None:
        raise ToolkitError('give CONFIG CHECKPOINT, or a published model (folder or hf-hub: name) alone')
    elif args.trust_config:
        raise ToolkitError('--trust-config is for a published model folder')
    else:
        cfg, checkpoint = open_tool_config(args.config, args.cfg_options), args.checkpoint
    named = '://' in checkpoint or is_hub_name(checkpoint)  # a URL or hub name, not a path
    if not named and not os.path.isfile(checkpoint):
        raise ToolkitError(f'checkpoint file not found: {checkpoint}')
    if args.tta:
        use_tta(cfg)
    run = EvaluationRun(cfg, EvaluatedCheckpoint.read(checkpoint, args.raw_weights))
    if args.out and not args.out.endswith(('.pkl', '.pickle')):
        raise ToolkitError(f'--out must be a .pkl file, got {args.out}')
    return run


def use_tta(cfg: Config) -> None:
    """Test through the config's ``tta_model`` around its model, on its ``tta_pipeline``."""
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise ValueError('--tta needs tta_model and tta_pipeline in the config (the ADE20K base '
                         'configs/_base_/datasets/ade20k_xcit.py has them)')
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.tta_model.module = cfg.model
    cfg.model = cfg.tta_model


def configure_test_outputs(cfg: Config, out: Optional[str], show_dir: Optional[str]) -> None:
    """Prediction dumping to ``out`` and drawing into ``show_dir``, in the way of the config's task (mmdet
    or mmseg)."""
    task = task_of_config(cfg)
    if out:
        dump = dict(type=task.dump_results, out_file_path=os.path.abspath(out))
        evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [cfg.test_evaluator]
        cfg.test_evaluator = [*evaluators, dump]
    if show_dir:  # the toolkit's hook: pictures named and drawn as tools/infer.py does, for both tasks
        score_thr = cfg.default_hooks.visualization.get('score_thr', 0.3) if task.draws_scores else None
        cfg.custom_hooks = [*(cfg.get('custom_hooks') or []), dict(
            type='ShowDirHook', out_dir=os.path.abspath(show_dir), score_thr=score_thr,
            color_type=loader_color_type(cfg.test_dataloader.dataset.pipeline))]


def assemble_testing(run: EvaluationRun, args: argparse.Namespace, out: Optional[str]) -> None:
    """Turn the opened test run and tools/test.py's arguments into this run's Runner config, in place: the
    launcher, norms and DDP for this machine, the predictions dumped to ``out`` (``--out``'s file is
    written through a private folder: tools/test.py) and drawn into ``--show-dir``, the evaluation progress
    hook, the test set's sample checks, the work dir (training's rule) and the checkpoint as every
    weight (no pretrained backbone file read)."""
    cfg = run.cfg
    cfg.launcher = args.launcher
    adapt_to_machine(cfg)
    configure_test_outputs(cfg, out, args.show_dir)
    declare_hooks(cfg, names=['eval_progress'])
    check_samples(cfg, ['test_dataloader'])
    choose_work_dir(cfg, args)
    cfg.load_from = run.checkpoint.path
    cfg.model.get('module', cfg.model).backbone.init_cfg = None  # (--tta: the model inside)
