"""Whether a resume candidate fits the run that would restore it: the model, optimizer and parameter
schedulers its config builds.

io/checkpoint_schema.py types each value of a checkpoint; this judges the values against what they are
loaded into, so that a candidate which would fail during the restore (weights of another model, an
optimizer state of other groups or shapes, a scheduler of another kind) is skipped for the next one
before anything is restored (engine/training/resume.py), not chosen and then fatal. The three are built from the
config once, on the CPU of the rank that chooses, at the first candidate, without initialising weights
(only names and shapes are compared) and without the backbone's ``compile`` key.
"""
import copy
import logging
from contextlib import contextmanager
from numbers import Number
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.optim import build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS, DefaultScope
from torch import nn

from ...compile_option import take_compile_option
from ...io.checked_unpickler import brief
from ...io.checkpoint import CheckpointError
from ...io.weights import check_matches_model
from ...tasks import task_of_config

__all__ = ['ResumeFit', 'check_optimizer_fits', 'check_schedulers_fit']

EMA_PREFIX = 'module.'  # the keys of the averaged model in an ``ema_state_dict`` (beside its ``steps``)
# the optimizer wrapper settings that decide its parameter groups (the rest: how it steps)
GROUPING_KEYS = ('optimizer', 'paramwise_cfg', 'constructor')


def check_optimizer_fits(saved: dict, built: torch.optim.Optimizer) -> None:
    """The optimizer state ``saved`` (as ``OptimWrapper.state_dict`` writes it, checked by
    ``checkpoint_schema.check_optimizer``) loads into ``built``: the same parameter groups holding the
    same parameter indices, and each state tensor a scalar or of its parameter's shape (torch's
    ``load_state_dict`` checks the group sizes only; a tensor of another shape fails at the first step).
    Raises CheckpointError naming the group or the parameter."""
    if 'param_groups' not in saved:  # (the schema also allows a dict of several optimizers' states)
        raise CheckpointError('its optimizer holds the states of several optimizers, the config builds one')
    own = built.state_dict()['param_groups']
    groups = saved['param_groups']
    if len(groups) != len(own):
        raise CheckpointError(f'its optimizer has {len(groups)} parameter groups, the config builds {len(own)}')
    for i, (group, mine) in enumerate(zip(groups, own)):
        if list(group['params']) != mine['params']:
            raise CheckpointError(f'its optimizer param_groups[{i}] holds {len(group["params"])} parameters, '
                                  f'the config builds {len(mine["params"])}')
    shapes = [p.shape for group in built.param_groups for p in group['params']]
    for index, values in saved.get('state', {}).items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != shapes[index]:
                raise CheckpointError(f'its optimizer state {index} {brief(key)} is of shape {tuple(value.shape)}, '
                                      f'its parameter of {tuple(shapes[index])}')


def _same_kind(saved: Any, own: Any) -> bool:
    """Whether a scheduler's saved setting can stand where the built scheduler has ``own``: the same type,
    numbers for numbers (not flags), lists of the same length."""
    if isinstance(own, bool) or isinstance(saved, bool):
        return type(saved) is type(own) or saved is None or own is None
    if isinstance(own, Number):
        return isinstance(saved, Number)
    if isinstance(own, (list, tuple)):
        return isinstance(saved, (list, tuple)) and len(saved) == len(own)
    if isinstance(own, dict):
        return isinstance(saved, dict)
    return own is None or saved is None or type(saved) is type(own)


def check_schedulers_fit(saved: Any, built: List[Any]) -> None:
    """The schedulers' states ``saved`` (a list, typed by ``checkpoint_schema.check_schedulers``) load
    into ``built``, the config's schedulers: as many, each with the settings of its kind and no other
    (MMEngine's resume pairs them in order and copies a state's keys onto the scheduler's attributes,
    so an extra ``optimizer`` key would replace the scheduler's optimizer). Raises CheckpointError."""
    if isinstance(saved, dict):  # schedulers by optimizer: the toolkit builds one optimizer
        raise CheckpointError('its param_schedulers are by optimizer name, the config builds one optimizer')
    if len(saved) != len(built):
        raise CheckpointError(f'it holds {len(saved)} parameter schedulers, the config builds {len(built)}')
    for i, (state, scheduler) in enumerate(zip(saved, built)):
        own = scheduler.state_dict()
        kind = type(scheduler).__name__
        other = sorted(set(state) ^ set(own))
        if other:
            raise CheckpointError(f'its param_schedulers[{i}] differs from the config\'s {kind} in '
                                  f'{", ".join(brief(k) for k in other[:5])}')
        for key, value in state.items():
            if not _same_kind(value, own[key]):
                raise CheckpointError(f'its param_schedulers[{i}] {brief(key)} is {brief(value)}, where the '
                                      f'config\'s {kind} has {brief(own[key])}')


@contextmanager
def _quiet() -> Iterator[None]:
    """The current MMEngine logger at warnings only: the Runner logs the model's and the optimizer's
    building (one line per parameter group) when it builds its own."""
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class ResumeFit:
    """The model, optimizer and schedulers of a training config, built on first use, against which
    resume candidates are judged (:meth:`check`)."""

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg
        self._built: Optional[Tuple[nn.Module, Any, List[Any]]] = None

    def build(self) -> Tuple[nn.Module, Any, List[Any]]:
        """The config's model, optimizer wrapper and schedulers, built at the first call."""
        if self._built is None:
            task = task_of_config(self._cfg)
            model_cfg, _ = take_compile_option(self._cfg.model)
            with _quiet():
                model = task.build_model(copy.deepcopy(model_cfg))  # (no init_weights: names and shapes only)
            settings = self._cfg.get('optim_wrapper') or {}
            wrapper_cfg = dict(type='OptimWrapper', **{k: copy.deepcopy(settings[k]) for k in GROUPING_KEYS
                                                       if k in settings})
            schedulers = self._cfg.get('param_scheduler') or []
            schedulers = [schedulers] if isinstance(schedulers, dict) else list(schedulers)
            with DefaultScope.overwrite_default_scope(task.scope), _quiet():
                wrapper = build_optim_wrapper(model, wrapper_cfg)
                built = [PARAM_SCHEDULERS.build(copy.deepcopy(s), default_args=dict(optimizer=wrapper,
                                                                                     epoch_length=1))
                         for s in schedulers]
            self._built = model, wrapper, built
        return self._built

    def check(self, path: str, checkpoint: Dict[str, Any]) -> None:
        """Refuse the read checkpoint ``path`` (its values typed by ``check_resumable``) unless its weights
        (and an EMA run's trained ones) fit the config's model (``check_matches_model``: keys, shapes, finite
        values), its optimizer state
        the config's optimizer and its schedulers' states the config's schedulers. Raises
        CheckpointError naming the file."""
        model, wrapper, schedulers = self.build()
        check_matches_model(model, path, checkpoint)
        ema = checkpoint.get('ema_state_dict')
        if ema is not None:  # the trained weights of an EMA run (training/model_ema_hook.py), ``module.``-prefixed
            trained = {k[len(EMA_PREFIX):]: v for k, v in ema.items() if k.startswith(EMA_PREFIX)}
            check_matches_model(model, f'{path} (its ema_state_dict)', dict(state_dict=trained))
        try:
            if checkpoint.get('optimizer') is not None:
                check_optimizer_fits(checkpoint['optimizer'], wrapper.optimizer)
            if checkpoint.get('param_schedulers') is not None:
                check_schedulers_fit(checkpoint['param_schedulers'], schedulers)
        except CheckpointError as exc:
            raise CheckpointError(f'checkpoint {path}: {exc}') from None
