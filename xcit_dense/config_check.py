"""Checks run when a config is loaded, so that a typo or a wrong type fails before any work.

The backbone's keys and value types are checked against the ``XCiT`` signature, the training loop's
length key against its kind, and the batch-related keys against what the batch plan needs; each error
names the key.
"""
import collections.abc
import inspect
import typing
from typing import Any, Optional

from mmengine.config import Config

from .compile_option import COMPILE_KEY
from .models.xcit import XCiT


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is inspect.Parameter.empty or hint is Any:
        return True
    if origin is typing.Union:
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:  # one of the values, of its type (True is not 1)
        return any(value == arg and type(value) is type(arg) for arg in args)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple, collections.abc.Sequence):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value)
    return isinstance(value, origin or hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return 'one of ' + ', '.join(map(repr, typing.get_args(hint)))
    return getattr(hint, '__name__', None) or str(hint).replace('typing.', '')


def check_backbone(backbone: dict, where: str = 'model.backbone') -> None:
    """Refuse unknown keys and values of the wrong type in an XCiT backbone config (``compile``, the
    run's option, included)."""
    if backbone.get('type') != 'XCiT':
        return
    params = inspect.signature(XCiT.__init__).parameters
    hints = typing.get_type_hints(XCiT.__init__)
    for key, value in backbone.items():
        if key in ('type', '_delete_'):
            continue
        if key == COMPILE_KEY:  # the run's option (compile_option.py), not the model's
            if not isinstance(value, bool):
                raise ValueError(f'{where}.{key}={value!r}: expected bool, got {type(value).__name__}')
            continue
        if key not in params:
            known = ', '.join(p for p in params if p != 'self')
            raise ValueError(f'{where}.{key}: XCiT has no such argument (it takes {known})')
        if not _matches(value, hints.get(key, inspect.Parameter.empty)):
            raise ValueError(f'{where}.{key}={value!r}: expected {_type_name(hints[key])}, '
                             f'got {type(value).__name__}')


# the length key each kind of training loop takes, and how to shorten a run with it
_LOOP_LENGTH = {
    'epoch': ('max_epochs', 'train_cfg.max_epochs=N (and, for fewer images per epoch, '
                            'train_dataloader.dataset.indices=N)'),
    'iteration': ('max_iters', 'train_cfg.max_iters=N'),
}


def _loop_kind(train_cfg: dict) -> Optional[str]:
    """'epoch' or 'iteration' for MMEngine's loops and the toolkit's (by ``type`` or ``by_epoch``), else None."""
    kind = train_cfg.get('type')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
    if kind is None and 'by_epoch' in train_cfg:
        return 'epoch' if train_cfg['by_epoch'] else 'iteration'
    if name.endswith('EpochBasedTrainLoop'):
        return 'epoch'
    if name.endswith('IterBasedTrainLoop'):
        return 'iteration'
    return None


def check_train_loop(train_cfg: dict) -> None:
    """Refuse the other kind's length key (``max_iters`` in an epoch-based loop, ``max_epochs`` in an
    iteration-based one), which MMEngine's loops reject with a TypeError once the run has started."""
    kind = _loop_kind(train_cfg)
    if kind is None:
        return
    own, how = _LOOP_LENGTH[kind]
    other = next(key for k, (key, _) in _LOOP_LENGTH.items() if k != kind)
    if other in train_cfg:
        raise ValueError(f'train_cfg.{other}: this config trains by {kind} ({own}={train_cfg.get(own)!r}); '
                         f'to shorten the run set {how}')


def check_config(cfg: Config) -> None:
    """Validate what can be validated without building anything; raises ValueError naming the key."""
    if 'model' not in cfg:
        raise ValueError('the config has no model')
    check_backbone(cfg.model.get('backbone') or {})
    check_train_loop(cfg.get('train_cfg') or {})
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        batch = (cfg.get(loader) or {}).get('batch_size')
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise ValueError(f'{loader}.batch_size={batch!r}: expected a positive int')
        if (cfg.get(loader) or {}).get('persistent_workers') and (cfg.get(loader) or {}).get('num_workers') == 0:
            raise ValueError(f'{loader}.num_workers=0 with {loader}.persistent_workers=True: no worker to keep; '
                             f'set {loader}.persistent_workers=False too')
