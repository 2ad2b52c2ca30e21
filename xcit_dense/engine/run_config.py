"""Turning a training config into a Runner config for this machine: norms, wrappers, precision."""
import logging
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log

from ..checkpoint import read_checkpoint
from ..datasets.files import DEFAULT_MAX_PIXELS, MAX_PIXELS_KEY
from .dist import gpus_present
from .hooks import TOOLKIT_HOOKS
from .optim_wrappers import GUARDED


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
    gives DDP ``device_ids=[LOCAL_RANK]``, which is not the device set when Slurm binds one GPU
    per task (engine/dist.py's ``cuda_device_index``): the wrapper gets the current device."""
    on_gpu, grouped = gpus_present(), dist.is_initialized()
    if not grouped or not on_gpu:
        if replace_sync_bn(cfg.model):
            reason = 'one process' if not grouped else 'no GPU'
            print_log(f'SyncBN replaced by BN ({reason})', logger='current')
    if grouped:
        wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
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


def configure_amp(cfg: Config, dtype: Optional[str]) -> None:
    """Mixed precision: fp16 with dynamic loss scaling, or bf16 without a loss scaler (bf16 keeps
    float32's exponent range); fp32 (with a message) on CPU."""
    if dtype is None:
        return
    if dtype not in ('fp16', 'bf16'):
        raise ValueError(f"--amp takes fp16 or bf16, got {dtype!r}")
    if not gpus_present():
        print_log(f'--amp {dtype} asked for, but there is no GPU: training in fp32', logger='current',
                  level=logging.WARNING)
        return
    if dtype == 'fp16':
        cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic', dtype='float16')
    else:
        cfg.optim_wrapper.pop('loss_scale', None)
        cfg.optim_wrapper.update(type='BF16OptimWrapper', dtype='bfloat16')


def declare_hooks(cfg: Config, names: Iterable[str] = tuple(TOOLKIT_HOOKS)) -> None:
    """Settle the toolkit's ``default_hooks`` entries before the Runner is built.

    Configs that do not inherit configs/_base_/toolkit_hooks.py get the entries in ``names``;
    a type the config already has in ``custom_hooks`` is not added twice; an entry switched
    off with None is dropped, since MMEngine only accepts None for its own default hooks.
    """
    if cfg.get('default_hooks') is None:
        cfg.default_hooks = {}
    default_hooks = cfg.default_hooks
    custom = {hook.get('type') for hook in cfg.get('custom_hooks') or []}
    for name, hook_type in TOOLKIT_HOOKS.items():
        if hook_type in custom:
            default_hooks.pop(name, None)
        elif name not in default_hooks:
            if name in names:
                default_hooks[name] = dict(type=hook_type)
        elif default_hooks[name] is None:
            del default_hooks[name]


def configure_training_hooks(cfg: Config, plan: dict, skip_nonfinite: bool = False) -> None:
    """The toolkit's training hooks with this run's arguments: the batch plan in checkpoints,
    ``--skip-nonfinite`` for the loss guard, and atomic checkpoint writes; with the loss guard's
    hook on, the optimizer wrapper is its guarded type (``Guarded*OptimWrapper``)."""
    declare_hooks(cfg)
    default_hooks = cfg.default_hooks
    custom = {hook.get('type') for hook in cfg.get('custom_hooks') or []}
    if cfg.get('optim_wrapper') and ('nonfinite_loss' in default_hooks or 'NonFiniteLossHook' in custom):
        kind = cfg.optim_wrapper.get('type', 'OptimWrapper')
        cfg.optim_wrapper.type = GUARDED.get(kind, kind)
    if 'batch_plan' in default_hooks:
        default_hooks['batch_plan']['plan'] = plan
    if skip_nonfinite and 'nonfinite_loss' in default_hooks:
        default_hooks['nonfinite_loss']['skip'] = True
    checkpoint = default_hooks.get('checkpoint')
    if checkpoint is not None and not checkpoint.get('backend_args'):
        checkpoint['backend_args'] = dict(backend='atomic_local')


def seed_from_checkpoint(cfg: Config, checkpoint: str) -> None:
    """A config without a seed resumes under the checkpoint's seed, set before the Runner exists.

    MMEngine re-seeds from the checkpoint only after it has built the training dataloader,
    whose sampler order and worker seeds would then come from a new random seed.
    """
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') is not None:
        return
    seed = read_checkpoint(checkpoint).get('meta', {}).get('seed')
    if seed is not None:
        cfg.randomness = dict(randomness, seed=seed)


def check_samples(cfg: Config, loaders: Iterable[str]) -> None:
    """Wrap the datasets of ``loaders``: a bad training sample is reported, counted and replaced
    (``SkipBadSamples``), a bad validation or test sample stops the run naming the file
    (``StopOnBadSamples``). Both check image headers against the config's ``max_image_pixels``."""
    max_pixels = cfg.get(MAX_PIXELS_KEY, DEFAULT_MAX_PIXELS)
    for loader in loaders:
        dataloader = cfg.get(loader)
        if not dataloader:
            continue
        wrapper = 'SkipBadSamples' if loader == 'train_dataloader' else 'StopOnBadSamples'
        dataset = dataloader.dataset
        if dataset.get('type') == wrapper:
            dataset.setdefault('max_image_pixels', max_pixels)
        else:
            dataloader.dataset = dict(type=wrapper, dataset=dataset, max_image_pixels=max_pixels)
