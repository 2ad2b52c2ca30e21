"""Model EMA as timm trains it (``--model-ema --model-ema-decay 0.9999``), on MMEngine's ``EMAHook``: an
exponential moving average of the weights, updated once per optimizer step.

``WarmupEMA`` averages as mmdet's ``ExpMomentumEMA`` (RTMDet, YOLOX) does: the weight of the new
parameters starts near 1 and falls to ``1 - decay`` over about ``warmup`` steps, so the first
average is not dominated by the random initial weights; buffers (BN statistics) are averaged too.
``OptimizerStepEMAHook`` updates it only on the micro-batches where the optimizer stepped, so under
gradient accumulation (or a batch plan re-planned by ``--auto-fit``) the decay counts optimizer steps,
each over the run's effective batch.

MMEngine's hook keeps the checkpoint deployable: the checkpoint's ``state_dict`` holds the averaged
weights and ``ema_state_dict`` the trained ones (``module.``-prefixed); a resume swaps them back, the
model trains on from its own weights and the average continues where it was. Validation during
training runs on the averaged weights.
"""
import math
from typing import Optional

import torch
from mmengine.hooks import EMAHook
from mmengine.model import ExponentialMovingAverage
from mmengine.registry import HOOKS, MODELS

from .optim_wrappers import step_skipped


@MODELS.register_module()
class WarmupEMA(ExponentialMovingAverage):
    """``average <- average + m_t (weights - average)`` with ``m_t = (1 - m) exp(-(1 + t) / warmup) + m``,
    ``m = 1 - decay`` and ``t`` the number of updates so far (the first update copies the weights)."""

    def __init__(self, model: torch.nn.Module, momentum: float = 1e-4, warmup: float = 2000, interval: int = 1,
                 device: Optional[torch.device] = None, update_buffers: bool = True) -> None:
        super().__init__(model, momentum, interval, device, update_buffers)
        if warmup <= 0:
            raise ValueError(f'the EMA warm-up must be a positive number of steps, got {warmup}')
        self.warmup = warmup

    def update_weight(self, steps: int) -> float:
        """The weight of the current weights in the update after ``steps`` updates."""
        return (1 - self.momentum) * math.exp(-(1 + steps) / self.warmup) + self.momentum

    def avg_func(self, averaged_param: torch.Tensor, source_param: torch.Tensor, steps: int) -> None:
        averaged_param.lerp_(source_param, self.update_weight(int(steps)))


@HOOKS.register_module()
class OptimizerStepEMAHook(EMAHook):
    """MMEngine's ``EMAHook``, updated after the micro-batches whose optimizer step was taken (not after
    a step the non-finite guard skipped: the weights did not change)."""

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.optim_wrapper.should_update() and not step_skipped(runner.optim_wrapper):
            super().after_train_iter(runner, batch_idx, data_batch, outputs)


def ema_hook(decay: float, warmup: float = 2000) -> dict:
    """The hook config of ``--ema DECAY``."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f'the EMA decay must be between 0 and 1 (e.g. 0.9999), got {decay}')
    return dict(type='OptimizerStepEMAHook', ema_type='WarmupEMA', momentum=1.0 - decay, warmup=warmup,
                update_buffers=True)
