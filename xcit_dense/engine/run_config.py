"""Turning a training config into a Runner config for this machine: norms, wrappers, precision."""
import logging
from typing import Any, Optional

from mmengine.config import Config
from mmengine.logging import print_log

from .dist import gpus_present


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


def adapt_to_machine(cfg: Config, world_size: int) -> None:
    """SyncBN -> BN with one process or no GPU; DDP without device ids on CPU."""
    on_gpu = gpus_present()
    if world_size == 1 or not on_gpu:
        if replace_sync_bn(cfg.model):
            reason = 'one process' if world_size == 1 else 'no GPU'
            print_log(f'SyncBN replaced by BN ({reason})', logger='current')
    if world_size > 1 and not on_gpu:
        wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                       find_unused_parameters=cfg.get('find_unused_parameters', False))
        wrapper.update(cfg.get('model_wrapper_cfg') or {})
        wrapper['device_ids'] = None  # a CPU module takes no device ids
        cfg.model_wrapper_cfg = wrapper


def configure_amp(cfg: Config, dtype: Optional[str]) -> None:
    """Mixed precision: fp16 with dynamic loss scaling or bf16; fp32 (with a message) on CPU."""
    if dtype is None:
        return
    if dtype not in ('fp16', 'bf16'):
        raise ValueError(f"--amp takes fp16 or bf16, got {dtype!r}")
    if not gpus_present():
        print_log(f'--amp {dtype} asked for, but there is no GPU: training in fp32', logger='current',
                  level=logging.WARNING)
        return
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    if dtype == 'fp16':
        cfg.optim_wrapper.loss_scale = 'dynamic'
        cfg.optim_wrapper.dtype = 'float16'
    else:
        cfg.optim_wrapper.dtype = 'bfloat16'


def add_hooks(cfg: Config, ours: list) -> None:
    """Append ``ours`` to the config's custom hooks, except types the config already has."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = {hook.get('type') for hook in hooks}
    cfg.custom_hooks = hooks + [hook for hook in ours if hook['type'] not in present]


def add_training_hooks(cfg: Config, plan: dict, skip_nonfinite: bool = False) -> None:
    """Throughput logging, checkpoint-on-signal, non-finite loss guard, batch plan in
    checkpoints, evaluation progress bars, and atomic checkpoint writes."""
    add_hooks(cfg, [dict(type='ThroughputHook'), dict(type='PreemptionHook'),
                    dict(type='NonFiniteLossHook', skip=skip_nonfinite),
                    dict(type='BatchPlanHook', plan=plan), dict(type='EvalProgressHook')])
    checkpoint = cfg.get('default_hooks', {}).get('checkpoint')
    if checkpoint is not None and not checkpoint.get('backend_args'):
        checkpoint['backend_args'] = dict(backend='atomic_local')


def skip_bad_training_samples(cfg: Config) -> None:
    """Wrap the training set in ``SkipBadSamples``: a bad sample is reported and replaced."""
    dataset = cfg.train_dataloader.dataset
    if dataset.get('type') != 'SkipBadSamples':
        cfg.train_dataloader.dataset = dict(type='SkipBadSamples', dataset=dataset)
