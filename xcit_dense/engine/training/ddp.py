"""MMEngine's DDP wrapper with gradients that carry their parameters' strides.

A weight with a dimension of size 1 (a 1x1 convolution, a depthwise one with one input channel per
group) has the same memory order in NCHW and channels_last, so its strides are ambiguous. Where such a
convolution sees a channels_last input (the backbone's token maps on a CPU, or with its
``channels_last`` option; the FPN's lateral and the RPN's 1x1 convolutions after them), oneDNN and
cuDNN write the weight's gradient with channels_last strides. Autograd accepts that gradient (its
layout contract ignores dimensions of size 1), but DDP's reducer compares all strides with its bucket
views (the parameter's) and warns "Grad strides do not match bucket view strides". The memory is the
same, so ``GradLayoutDDP`` gives each such gradient the parameter's strides (a view, no copy) as soon
as it is accumulated, before the reducer sees it.

The wrapper also times each rank's own step and its wait in gradient communication (``step_clock``:
DDP's all-reduce as its communication hook, registered once, which notes when the last gradient bucket
is ready and when the all-reduces complete) for the per-rank figures of the log (``hooks.rank_figures``).
"""
import inspect

import torch
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS
from torch import nn

from ..telemetry.step_clock import time_steps

# Buffers (BN's running statistics) stay per process: not synced at each forward. torch 2.13 renamed
# the option (``broadcast_buffers`` is deprecated there, and ``forward_sync_buffers`` unknown before).
_DDP_OPTIONS = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
_BUFFER_SYNC_OPTION = 'forward_sync_buffers' if 'forward_sync_buffers' in _DDP_OPTIONS else 'broadcast_buffers'
NO_FORWARD_BUFFER_SYNC = {_BUFFER_SYNC_OPTION: False}


def same_memory_order(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether ``grad`` and ``param`` differ in strides at most where a dimension has size 1."""
    return grad.shape == param.shape and all(
        g == p for g, p, size in zip(grad.stride(), param.stride(), param.shape) if size != 1)


def grad_with_param_strides(param: torch.Tensor) -> None:
    """Re-stride ``param.grad`` as ``param`` where only dimensions of size 1 differ (a view)."""
    grad = param.grad
    if grad is not None and not grad.is_sparse and grad.stride() != param.stride() \
            and same_memory_order(grad, param):
        param.grad = grad.as_strided(param.shape, param.stride())


def keep_grad_strides(module: nn.Module) -> None:
    """Hook every trained parameter of ``module`` so that its gradient takes its strides."""
    for param in module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(grad_with_param_strides)


@MODEL_WRAPPERS.register_module()
class GradLayoutDDP(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` whose gradients match its bucket views, with its rank's own step
    times and communication waits in ``step_clock`` (see the module's doc)."""

    def __init__(self, module: nn.Module, **kwargs) -> None:
        keep_grad_strides(module)
        super().__init__(module=module, **kwargs)
        self.step_clock = time_steps(self)
