"""The types, ranges and shapes of the values read from a checkpoint, checked before any use.

The checked reader (checked_unpickler.py) bounds what a file may build, not what it means: a tensor
may stand where a name is expected, a string where a seed is. Each reader of a checkpoint's values
(the toolkit's, and what MMEngine's ``Runner.resume`` restores) takes them through this module, which
refuses a value in one line naming its key: names are strings, counts plain integers in range, learning
rates plain finite numbers, lists bounded in length and never tensors (nothing is broadcast or iterated
from an unchecked tensor). :func:`check_resumable` checks a whole training checkpoint before a resume
restores anything from it; the other functions give one typed value each.
"""
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from .checked_unpickler import LARGEST_INT, brief
from .checkpoint import CheckpointError

__all__ = ['SchemaError', 'count', 'seed_of', 'class_names', 'palette', 'dataset_meta_of', 'batch_plan_of',
           'position_of', 'auto_fit_of', 'rng_states_of', 'check_meta', 'check_message_hub', 'check_optimizer',
           'check_schedulers', 'check_state_dict', 'block_index', 'check_resumable']

MAX_ITEMS = 1 << 16  # classes, parameter groups, values per scheduler or group
MAX_NAME = 1000  # characters of a name (a class, a state dict's key)
SEED_LIMIT = 1 << 32  # the seeds NumPy takes (MMEngine seeds Python, NumPy and torch with one)
MAX_INDEX_DIGITS = 6  # a block's index in a state dict's key
PLAIN_NUMBERS = (int, float, np.integer, np.floating)  # (bool is an int: refused apart)


class SchemaError(CheckpointError, ValueError):
    """A value read from a checkpoint that is not of the type, range or shape its reader needs."""


def _refuse(where: str, value: Any, expected: str) -> SchemaError:
    return SchemaError(f'{where} is {brief(value)}, not {expected}')


def _is_int(value: Any) -> bool:
    return (type(value) is int or isinstance(value, np.integer)) and not isinstance(value, bool)


def _integer(value: Any, where: str, low: int, high: int) -> int:
    """``value`` as an int, refused unless a plain integer from ``low`` to ``high`` - 1."""
    if not _is_int(value) or not low <= value < high:
        bound = '2**48' if high == LARGEST_INT else '2**32 - 1' if high == SEED_LIMIT else str(high - 1)
        raise _refuse(where, value, f'an integer from {low} to {bound}')
    return int(value)


def _number(value: Any, where: str, positive: bool = False) -> float:
    """``value`` as a float, refused unless a plain finite number (above 0 with ``positive``)."""
    plain = isinstance(value, PLAIN_NUMBERS) and not isinstance(value, (bool, np.bool_))
    if not plain or (_is_int(value) and abs(value) >= LARGEST_INT) or not math.isfinite(value) \
            or (positive and not value > 0):  # (a large int is refused before float() could overflow)
        raise _refuse(where, value, 'a positive finite number' if positive else 'a finite number')
    return float(value)


def _dict(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _refuse(where, value, 'a dict')
    return value


def _sequence(value: Any, where: str, limit: int = MAX_ITEMS) -> list:
    """A list or tuple of at most ``limit`` items (never a tensor or an array, which would broadcast)."""
    if not isinstance(value, (list, tuple)) or len(value) > limit:
        raise _refuse(where, value, f'a list of at most {limit} items')
    return list(value)


def _name(value: Any, where: str) -> str:
    if type(value) is not str or len(value) > MAX_NAME:
        raise _refuse(where, value, f'a string of at most {MAX_NAME} characters')
    return value


def count(record: dict, key: str, where: str) -> int:
    """``record[key]``, an integer from 0 to 2**48 (0 when missing); SchemaError otherwise."""
    return _integer(record.get(key, 0), where, 0, LARGEST_INT)


def seed_of(meta: dict) -> Optional[int]:
    """The run's seed a checkpoint's ``meta`` records (None: none), an integer from 0 to 2**32 - 1."""
    seed = meta.get('seed')
    return None if seed is None else _integer(seed, "its meta's seed", 0, SEED_LIMIT)


def class_names(value: Any, where: str) -> Tuple[str, ...]:
    """Class names: a list or tuple of strings (a released file's ``CLASSES``, ``dataset_meta['classes']``)."""
    return tuple(_name(name, f'{where}[{i}]') for i, name in enumerate(_sequence(value, where)))


def palette(value: Any, where: str) -> List[Tuple[int, ...]]:
    """Colours: a list of (r, g, b), each an integer from 0 to 255."""
    colours = []
    for i, colour in enumerate(_sequence(value, where)):
        rgb = _sequence(colour, f'{where}[{i}]', 3)
        if len(rgb) != 3:
            raise _refuse(f'{where}[{i}]', colour, 'an (r, g, b) colour')
        colours.append(tuple(_integer(c, f'{where}[{i}]', 0, 256) for c in rgb))
    return colours


def dataset_meta_of(meta: dict) -> Optional[dict]:
    """``meta['dataset_meta']`` (None: none), its classes and palette checked."""
    found = meta.get('dataset_meta')
    if found is None:
        return None
    found = _dict(found, "its meta's dataset_meta")
    if 'classes' in found:
        class_names(found['classes'], "its meta's dataset_meta classes")
    if found.get('palette') is not None:
        palette(found['palette'], "its meta's dataset_meta palette")
    return found


PLAN_COUNTS = ('world_size', 'images_per_gpu', 'accumulation', 'effective_batch')


def batch_plan_of(meta: dict) -> Optional[dict]:
    """The batch plan a checkpoint's ``meta`` records (``BatchPlanHook``; None: none): its counts
    positive integers, its ``lr`` a positive finite number."""
    plan = meta.get('batch_plan')
    if plan is None:
        return None
    plan = _dict(plan, "its meta's batch_plan")
    out = {key: _integer(plan.get(key), f"its meta's batch_plan {key}", 1, LARGEST_INT) for key in PLAN_COUNTS}
    out['lr'] = _number(plan.get('lr'), "its meta's batch_plan lr", positive=True)
    return out


def position_of(meta: dict, key: str) -> Optional[Tuple[int, int]]:
    """The data position ``meta[key]`` records, (epoch, samples) (None: none), both from 0 to 2**48."""
    position = meta.get(key)
    if position is None:
        return None
    if not isinstance(position, dict) or set(position) != {'epoch', 'samples'}:
        raise _refuse(f"its meta's {key}", position, 'a dict of epoch and samples')
    return count(position, 'epoch', f"its meta's {key} epoch"), count(position, 'samples', f"its meta's {key} samples")


def auto_fit_of(meta: dict, key: str) -> Optional[dict]:
    """The auto-fit record ``meta[key]`` holds (``AutoFitHook``; None: none): (images, accumulation)
    pairs of positive integers, the world size, the device's name and its memory."""
    record = meta.get(key)
    if record is None:
        return None
    record = _dict(record, f"its meta's {key}")
    where = f"its meta's {key}"
    out = {}
    for field in ('requested', 'fitted'):
        pair = _sequence(record.get(field), f'{where} {field}', 2)
        if len(pair) != 2:
            raise _refuse(f'{where} {field}', pair, '(images per GPU, accumulation)')
        out[field] = tuple(_integer(v, f'{where} {field}', 1, LARGEST_INT) for v in pair)
    out['world_size'] = _integer(record.get('world_size'), f'{where} world_size', 1, LARGEST_INT)
    out['device'] = _name(record.get('device'), f'{where} device')
    out['total_memory'] = _integer(record.get('total_memory'), f'{where} total_memory', 0, 1 << 62)
    return out


# the generator states RNGStateHook saves per rank (rng_state.get_rng_state) and what their setters take
MT_WORDS = 624  # Python's and NumPy's Mersenne Twister: 624 32-bit words and a position
CPU_STATE_BYTES = torch.get_rng_state().numel()  # torch.set_rng_state takes exactly this many bytes
CUDA_STATE_BYTES = (8, 16)  # a CUDA generator's seed, and its offset (torch.cuda.set_rng_state)
RNG_KEYS = ('python', 'numpy', 'torch', 'cuda')


def _array(value: Any, where: str, dtype: type, sizes: Tuple[int, ...]) -> None:
    """A one-dimensional NumPy array of ``dtype`` and one of ``sizes`` elements; for bytes, a torch
    ByteTensor too (files written before the states were arrays: ``check_meta`` refuses any tensor in
    a resume's candidates, MMEngine's own ``Runner.resume`` restores them)."""
    if isinstance(value, np.ndarray) and value.dtype == dtype and value.ndim == 1 and value.size in sizes:
        return
    if dtype is np.uint8 and isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1 \
            and value.numel() in sizes:
        return
    found = f'a {value.dtype} array of shape {tuple(value.shape)}' if isinstance(value, (np.ndarray, torch.Tensor)) \
        else brief(value)
    raise SchemaError(f'{where} is {found}, not a NumPy {np.dtype(dtype)} array of {" or ".join(map(str, sizes))} '
                      'elements')


def _python_rng(value: Any, where: str) -> None:
    """``random.getstate()``: (3, a tuple of 624 32-bit words and a position from 0 to 624, None or
    a float), as ``random.setstate`` takes it."""
    state = _sequence(value, where, 3)
    if len(state) != 3 or not _is_int(state[0]) or state[0] != 3 or type(state[1]) is not tuple \
            or len(state[1]) != MT_WORDS + 1:
        raise _refuse(where, value, "Python's state (3, 625 integers, None or a number)")
    for word in state[1][:MT_WORDS]:
        _integer(word, f'{where} words', 0, 1 << 32)
    _integer(state[1][MT_WORDS], f'{where} position', 0, MT_WORDS + 1)
    if state[2] is not None:
        _number(state[2], f'{where} gauss_next')


def _numpy_rng(value: Any, where: str) -> None:
    """``np.random.get_state()``: ('MT19937', 624 uint32 words, a position from 0 to 624, a flag, a float)."""
    state = _sequence(value, where, 5)
    if len(state) != 5 or type(state[0]) is not str or state[0] != 'MT19937':
        raise _refuse(where, value, "NumPy's state ('MT19937', words, position, has_gauss, cached_gaussian)")
    _array(state[1], f'{where} words', np.uint32, (MT_WORDS,))
    _integer(state[2], f'{where} position', 0, MT_WORDS + 1)
    _integer(state[3], f'{where} has_gauss', 0, 2)
    _number(state[4], f'{where} cached_gaussian')


def rng_states_of(meta: dict) -> List[dict]:
    """Each rank's generator states ``meta['rng_states']`` records (``RNGStateHook``; []: none): a
    list of at most ``MAX_ITEMS`` dicts of Python's, NumPy's and torch's state (a byte array of the
    size ``torch.set_rng_state`` takes) and optionally CUDA's (a byte array of 8 or 16, or a list of
    them, one per device: files written before the per-device rule), so that a restore cannot fail."""
    states = meta.get('rng_states')
    if states is None:
        return []
    where = "its meta's rng_states"
    for rank, state in enumerate(_sequence(states, where)):
        at = f'{where}[{rank}]'
        for key in _dict(state, at):
            if key not in RNG_KEYS:
                raise _refuse(f'a key of {at}', key, f'one of {", ".join(RNG_KEYS)}')
        missing = [key for key in RNG_KEYS[:3] if key not in state]
        if missing:
            raise SchemaError(f'{at} has no {" and no ".join(missing)}')
        _python_rng(state['python'], f'{at} python')
        _numpy_rng(state['numpy'], f'{at} numpy')
        _array(state['torch'], f'{at} torch', np.uint8, (CPU_STATE_BYTES,))
        cuda = state.get('cuda')
        if cuda is not None:
            for device in _sequence(cuda, f'{at} cuda') if isinstance(cuda, (list, tuple)) else [cuda]:
                _array(device, f'{at} cuda', np.uint8, CUDA_STATE_BYTES)
    return list(states)


def _no_tensor(value: Any, where: str) -> None:
    """Refuse a tensor anywhere inside ``value`` (the reader bounds the walk: at most 64 deep, its items
    counted)."""
    if isinstance(value, torch.Tensor):
        raise SchemaError(f'{where} holds a tensor, where a checkpoint holds plain values')
    if isinstance(value, dict):
        for key, item in value.items():
            _no_tensor(item, f'{where} {key if type(key) is str and len(key) <= 40 else brief(key)}')
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _no_tensor(item, where)


def check_meta(meta: Any) -> dict:
    """A training checkpoint's ``meta``: no tensor in it, ``epoch`` and ``iter`` (which MMEngine's resume
    reads by key) counts, and each value the toolkit or MMEngine reads typed."""
    meta = _dict(meta, 'its meta')
    _no_tensor(meta, "its meta's")
    for key in ('iter', 'epoch'):
        count(meta, key, f"its meta's {key}")
    seed_of(meta)
    dataset_meta_of(meta)
    batch_plan_of(meta)
    position_of(meta, 'data_position')
    auto_fit_of(meta, 'auto_fit')
    rng_states_of(meta)
    missing = [key for key in ('epoch', 'iter') if key not in meta]
    if missing:
        raise SchemaError(f'its meta has no {" and no ".join(missing)}, which a resume reads')
    return meta


def check_message_hub(hub: Any) -> None:
    """MMEngine's message hub as it saves it: its log scalars ``HistoryBuffer`` objects, its runtime
    info plain values (no tensor), its resumed keys flags, all under string keys."""
    hub = _dict(hub, 'its message_hub')
    for part in ('log_scalars', 'runtime_info', 'resumed_keys'):
        values = _dict(hub.get(part), f'its message_hub {part}')
        for key, value in values.items():
            _name(key, f'a key of its message_hub {part}')
            if part == 'log_scalars' and not isinstance(value, HistoryBuffer):
                raise _refuse(f'its message_hub log_scalars {brief(key)}', value, 'a HistoryBuffer')
            if part == 'resumed_keys' and type(value) is not bool:
                raise _refuse(f'its message_hub resumed_keys {brief(key)}', value, 'a bool')
        if part == 'runtime_info':
            _no_tensor(values, 'its message_hub runtime_info')


def _group_value(value: Any, where: str) -> None:
    """A parameter group's setting: None, a flag, a string, a finite number, or a short list of numbers
    (betas)."""
    if value is None or isinstance(value, (bool, np.bool_)) or type(value) is str and len(value) <= MAX_NAME:
        return
    if isinstance(value, (list, tuple)):
        for item in _sequence(value, where, 8):
            _number(item, where)
        return
    _number(value, where)


def check_optimizer(state: Any, where: str = 'its optimizer') -> int:
    """An optimizer wrapper's state as MMEngine saves it (torch's optimizer state, with
    ``base_param_settings`` and an AMP ``loss_scaler``): at least one parameter group, each a dict
    of settings with ``params``, distinct parameter indices, a learning rate, and a ``state`` keyed by
    those indices. A dict of such states (several optimizers) is checked state by state. Returns the
    number of groups the schedulers see (MMEngine's wrapper counts ``base_param_settings`` as one)."""
    state = _dict(state, where)
    if 'param_groups' not in state and state and all(isinstance(v, dict) and 'param_groups' in v
                                                     for v in state.values()):
        return sum(check_optimizer(v, f'{where} {brief(k)}') for k, v in state.items())
    groups = _sequence(state.get('param_groups'), f'{where} param_groups')
    if not groups:
        raise SchemaError(f'{where} has no parameter groups')
    seen = set()
    for i, group in enumerate(groups):
        group = _dict(group, f'{where} param_groups[{i}]')
        params = _sequence(group.get('params'), f'{where} param_groups[{i}] params', LARGEST_INT)
        for index in params:
            if _integer(index, f'{where} param_groups[{i}] params', 0, LARGEST_INT) in seen:
                raise SchemaError(f'{where} names parameter {index} in two groups')
            seen.add(int(index))
        _number(group.get('lr'), f'{where} param_groups[{i}] lr')
        for key, value in group.items():
            if key != 'params':
                _group_value(value, f'{where} param_groups[{i}] {_name(key, f"a key of {where} param_groups[{i}]")}')
    for index, values in _dict(state.get('state', {}), f'{where} state').items():
        if not _is_int(index) or index not in seen:
            raise _refuse(f'a key of {where} state', index, 'the index of a parameter of its groups')
        for key, value in _dict(values, f'{where} state {index}').items():
            if value is not None and not isinstance(value, torch.Tensor):
                _number(value, f'{where} state {index} {_name(key, f"a key of {where} state {index}")}')
    base = state.get('base_param_settings')
    if base is not None:
        _dict(base, f'{where} base_param_settings')
    if state.get('loss_scaler') is not None:
        for key, value in _dict(state['loss_scaler'], f'{where} loss_scaler').items():
            _number(value, f'{where} loss_scaler {_name(key, f"a key of {where} loss_scaler")}')
    return len(groups) + (base is not None)


def check_schedulers(schedulers: Any, groups: Optional[int]) -> None:
    """The parameter schedulers' states (a list, or a dict of lists by optimizer): dicts of plain
    settings; their per-group lists (``base_values``, ``_last_value``) plain numbers, one per
    parameter group of the optimizer (``groups``; None: no optimizer saved)."""
    lists = schedulers.items() if isinstance(schedulers, dict) else [('', schedulers)]
    for name, states in lists:
        where = f'its param_schedulers {brief(name)}' if name else 'its param_schedulers'
        for i, state in enumerate(_sequence(states, where)):
            for key, value in _dict(state, f'{where}[{i}]').items():
                at = f'{where}[{i}] {_name(key, f"a key of {where}[{i}]")}'
                if isinstance(value, (list, tuple)):
                    values = [_number(v, at) for v in _sequence(value, at)]
                    if key in ('base_values', '_last_value') and groups is not None and len(values) != groups:
                        raise SchemaError(f'{at} holds {len(values)} values, for {groups} parameter groups')
                elif isinstance(value, dict):  # MultiStepLR's milestones (a Counter)
                    for step, times in value.items():
                        _integer(step, at, 0, LARGEST_INT), _integer(times, at, 0, LARGEST_INT)
                else:
                    _group_value(value, at)


# the parts of the toolkit's state dict keys it reads as numbers (io/weights.backbone_signature)
INDEXED = ('blocks.', 'patch_embed.proj.')


def block_index(key: str, start: int) -> int:
    """The index at ``key[start:]`` (``blocks.<n>``, ``patch_embed.proj.<n>``): a few digits."""
    part = key[start:].split('.', 1)[0]
    if not (part.isdigit() and part.isascii() and len(part) <= MAX_INDEX_DIGITS):
        raise SchemaError(f'its state dict key {brief(key)} has {brief(part)} where an index is expected')
    return int(part)


def check_state_dict(state: Any, prefix: str = 'backbone.', where: str = 'its state_dict') -> Dict[str, torch.Tensor]:
    """A state dict (``where`` names it): string keys of at most 1,000 characters, each a tensor, the
    indices of the XCiT backbone's blocks and patch embedding (under ``prefix``) numbers."""
    state = _dict(state, where)
    for key, value in state.items():
        _name(key, f'a key of {where}')
        if not isinstance(value, torch.Tensor):
            raise _refuse(f'{where} {brief(key)}', value, 'a tensor')
        for part in INDEXED:
            if key.startswith(prefix + part):
                block_index(key, len(prefix + part))
    return state


def check_resumable(checkpoint: Any, source: str) -> dict:
    """A training checkpoint a resume may restore (``source`` names it in errors): its meta, state dict,
    message hub, optimizer and schedulers typed (the functions above), before anything is restored.
    Returns ``checkpoint``; raises SchemaError naming ``source`` and the key."""
    try:
        checkpoint = _dict(checkpoint, 'its content')
        check_meta(checkpoint.get('meta'))
        check_state_dict(checkpoint.get('state_dict'))
        if checkpoint.get('ema_state_dict') is not None:  # (an EMA run's trained weights: module.-prefixed)
            check_state_dict(checkpoint['ema_state_dict'], 'module.backbone.', 'its ema_state_dict')
        check_message_hub(checkpoint.get('message_hub'))
        groups = check_optimizer(checkpoint['optimizer']) if checkpoint.get('optimizer') is not None else None
        if checkpoint.get('param_schedulers') is not None:
            check_schedulers(checkpoint['param_schedulers'], groups)
    except SchemaError as exc:
        raise SchemaError(f'checkpoint {source}: {exc}') from None
    return checkpoint
