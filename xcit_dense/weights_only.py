"""What a checkpoint file may hold, checked before anything of it is unpickled.

Checkpoints are data from people the user may not trust. ``torch.load(weights_only=True)`` refuses
globals outside an allow-list; MMEngine's checkpoints need a few more (its ``HistoryBuffer``, numpy
arrays, scalars and dtypes, and ``getattr`` for the buffer's statistics methods). ``getattr`` itself
would reach any attribute of any object (``getattr(getattr, '__self__')`` is the builtins module),
so a restricted function takes its name; ``numpy.ndarray`` called directly could build an object
array of raw pointers, so the name resolves to a type only numpy's ``_reconstruct`` takes, and dtypes
are numeric. Before unpickling, :func:`inspect_checkpoint` reads the archive's records and the
opcodes of the pickle torch will read (chosen as torch chooses it), so that a small file cannot
declare gigabytes (a ``bytearray(2**36)``, many calls that add up, a storage, a zero-stride view or
a deflated record larger than the file) nor name a global outside the list.
"""
import io
import os
import pickletools
import re
import zipfile
from math import prod
from pickle import UnpicklingError
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from torch._weights_only_unpickler import _get_allowed_globals

# numpy dtype classes that appear in MMEngine's logged scalars and RNG states
_NUMPY_DTYPES = [type(np.dtype(code)) for code in ('f2', 'f4', 'f8', 'i1', 'i2', 'i4', 'i8',
                                                    'u1', 'u2', 'u4', 'u8', 'b1')]
# the statistics methods MMEngine pickles as ``getattr(HistoryBuffer, name)``
_HISTORY_METHODS = ('min', 'max', 'current', 'mean')
# a deflated record may expand to at most this many times the file's size (torch.save stores)
MAX_EXPANSION = 4
# torch's tensor rebuild functions check sizes against their storages themselves (views: see _check_view)
_TENSOR_REBUILDS = {f'torch._utils.{name}' for name in (
    '_rebuild_tensor', '_rebuild_tensor_v2', '_rebuild_tensor_v3', '_rebuild_parameter',
    '_rebuild_parameter_with_state', '_rebuild_qtensor', '_rebuild_device_tensor_from_cpu_tensor',
    '_rebuild_device_tensor_from_numpy', '_rebuild_sparse_tensor', '_rebuild_nested_tensor')}
# the rebuilds whose arguments are (storage, offset, size, stride, ...)
_TENSOR_VIEWS = {f'torch._utils.{name}' for name in (
    '_rebuild_tensor', '_rebuild_tensor_v2', '_rebuild_tensor_v3', '_rebuild_qtensor')}
_PY2_NAMES = {'__builtin__': 'builtins', 'copy_reg': 'copyreg'}


def history_buffer_method(obj: Any, name: str) -> Any:
    """``getattr`` as unpickling needs it: only ``HistoryBuffer``'s statistics methods resolve."""
    methods = set(_HISTORY_METHODS) | set(HistoryBuffer._statistics_methods)
    if obj is HistoryBuffer and isinstance(name, str) and name in methods \
            and callable(HistoryBuffer.__dict__.get(name)):
        return HistoryBuffer.__dict__[name]
    raise UnpicklingError(f'getattr({obj!r}, {name!r}) is refused: a checkpoint may only name '
                          f"the statistics methods of MMEngine's HistoryBuffer")


class ArrayTypeName:
    """What the name ``numpy.ndarray`` resolves to in a checkpoint: the array type as numpy's pickles
    hand it to ``_reconstruct``, never a constructor. Called directly, ``ndarray((1,), 'O',
    b'AAAAAAAA')`` is an object array whose element is the raw pointer 0x4141...: any use of it
    crashes the process (exit 139)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> 'ArrayTypeName':
        raise UnpicklingError('numpy.ndarray is called directly: a checkpoint may rebuild arrays only '
                              "through numpy's _reconstruct (an empty array, then its data)")


def rebuild_array(array_type: Any, shape: Any, code: Any) -> np.ndarray:
    """numpy's ``_reconstruct`` as numpy pickles arrays, ``(ndarray, (0,), b'b')``: an empty array
    that the pickle's BUILD then fills through ``ndarray.__setstate__``, which checks the data's
    length against shape and dtype (a numeric one: :func:`numeric_dtype`)."""
    if array_type is not ArrayTypeName or shape != (0,) or code not in (b'b', 'b'):
        raise UnpicklingError(f'_reconstruct({array_type!r}, {shape!r}, {code!r}) is refused: numpy '
                              f"pickles its arrays as _reconstruct(ndarray, (0,), b'b')")
    return np._core.multiarray._reconstruct(np.ndarray, (0,), b'b')


def numeric_dtype(code: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """``numpy.dtype`` of a numeric type code only (``'f8'``, ``'i4'``, ``'b1'``, ...): no object,
    string, structured or void dtype, whose arrays could hold pointers."""
    if not (isinstance(code, str) and re.fullmatch(r'[<>=|]?[biufc][0-9]{1,2}', code)):
        raise UnpicklingError(f'numpy.dtype({code!r}) is refused: a checkpoint may hold numeric numpy '
                              f'values only')
    return np.dtype(code, bool(align), bool(copy))


# name -> what it resolves to, for torch's weights-only unpickler and the scan; numpy 1.x wrote its
# arrays and scalars under numpy.core
_TOOLKIT_GLOBALS: Dict[str, Any] = {
    'mmengine.logging.history_buffer.HistoryBuffer': HistoryBuffer,
    'builtins.getattr': history_buffer_method,
    'numpy.ndarray': ArrayTypeName,
    'numpy.dtype': numeric_dtype,
    'numpy._core.multiarray._reconstruct': rebuild_array,
    'numpy.core.multiarray._reconstruct': rebuild_array,
    'numpy._core.multiarray.scalar': np._core.multiarray.scalar,
    'numpy.core.multiarray.scalar': np._core.multiarray.scalar,
    **{f'{cls.__module__}.{cls.__qualname__}': cls for cls in _NUMPY_DTYPES}}
# torch's unpickler runs BUILD (``__setstate__``) only on instances of listed types: the array type
# is listed under a name with a newline, which no pickle can spell (GLOBAL reads names by line)
_BUILD_ONLY = {'numpy.ndarray\n(BUILD only)': np.ndarray}


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read MMEngine's checkpoints, and nothing more.

    Process-wide (mmdet's and mmseg's own tools and inferencers read through torch's default), so
    nothing registered here reaches code or raw memory: ``builtins.getattr`` is
    :func:`history_buffer_method`, and arrays are rebuilt only as numpy pickles them, of numeric dtypes.
    """
    torch.serialization.add_safe_globals([(obj, name) for name, obj in {**_TOOLKIT_GLOBALS, **_BUILD_ONLY}.items()])


def allowed_globals() -> set:
    """The dotted names a checkpoint may name: torch's defaults and MMEngine's few."""
    return set(_get_allowed_globals()) | set(_TOOLKIT_GLOBALS)


class DamagedCheckpoint(UnpicklingError):
    """A file that is not a readable torch checkpoint (truncated, damaged, another format): no
    refusal on safety grounds, so its message says what is wrong with the file."""


class _Global(str):
    """A global's dotted name on the simulated pickle stack."""


class _Opaque:
    """Any value the scan does not need to know (a list, a dict, a call's result)."""


_OPAQUE = _Opaque()
_MARK = object()


def _sizes(value: Any) -> Iterator[int]:
    """Every integer of a call's arguments, and the product of every tuple of integers."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield abs(value)
    elif isinstance(value, tuple):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            yield abs(prod(value))
        for item in value:
            yield from _sizes(item)


class _Budget:
    """What one file's pickles may make the unpickler allocate, in all: the file's size. Each call,
    value and storage is charged its largest declared size (a storage once, however many tensors view
    it), each tensor view whose strides overlap (a zero stride) its materialised element count."""

    def __init__(self, limit: int) -> None:
        self.limit, self.spent, self.storages = limit, 0, set()

    def charge(self, size: int, what: str) -> None:
        if size > self.limit:
            raise UnpicklingError(f'{what} declares a size of {size} ({size / 2**30:.1f} GiB), more than the '
                                  f'file holds ({self.limit} bytes)')
        self.spent += size
        if self.spent > self.limit:
            raise UnpicklingError(f'{what}: the sizes declared so far total {self.spent} bytes '
                                  f'({self.spent / 2**30:.1f} GiB), more than the file holds ({self.limit} bytes)')


def _int_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _element_size(storage_type: Any) -> int:
    """The bytes per element of a storage class named in a persistent id (``torch.FloatStorage``)."""
    name = storage_type.rsplit('.', 1)[-1] if isinstance(storage_type, _Global) else ''
    if name == 'UntypedStorage':
        return 1
    try:
        return torch._utils._element_size(torch.serialization.StorageType(name).dtype)
    except (KeyError, RuntimeError) as exc:
        raise UnpicklingError(f'a storage of an unknown type {storage_type!r}') from exc


def _check_storage(pid: Any, budget: _Budget, what: str) -> None:
    """A persistent id, ``('storage', type, key, location, numel[, view])``: its bytes charged once per key."""
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ('storage', b'storage')):
        budget.charge(max(_sizes(pid), default=0), f'{what}: a persistent id')
        return
    numel = pid[4]
    if not isinstance(numel, int) or isinstance(numel, bool):
        raise UnpicklingError(f'{what}: a storage of a computed size')
    if pid[2] not in budget.storages:
        budget.storages.add(pid[2])
        budget.charge(abs(numel) * _element_size(pid[1]), f'{what}: storage {pid[2]!r}')


def _check_view(args: Any, budget: _Budget, what: str) -> None:
    """A tensor rebuilt as a view ``(storage, offset, size, stride, ...)``: literal sizes and strides,
    and an overlapping one (a zero stride) charged its materialised element count."""
    if not (isinstance(args, tuple) and len(args) >= 4 and _int_tuple(args[2]) and _int_tuple(args[3])):
        raise UnpicklingError(f'{what}: a tensor whose size or stride is computed, not written out')
    size, stride = args[2], args[3]
    numel = prod(size)
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(size, stride)) if numel else 0
    if numel > extent:
        budget.charge(numel, f'{what}: a tensor view of {size} with strides {stride}')


def _check_call(func: Any, args: Any, budget: _Budget, what: str, call: bool = True) -> None:
    """Refuse a call that would overdraw ``budget`` or call a hidden function."""
    if call and not isinstance(func, _Global):
        raise UnpicklingError(f'{what}: a call of a computed value, not of a named global')
    if func in _TENSOR_VIEWS:
        _check_view(args, budget, what)
    if func in _TENSOR_REBUILDS:
        return
    if func == 'torch._tensor._rebuild_from_type_v2':
        inner = args[0] if isinstance(args, tuple) and args else None
        if not (isinstance(inner, _Global) and inner in _TENSOR_REBUILDS):
            raise UnpicklingError(f'{what}: _rebuild_from_type_v2 may only call torch\'s tensor '
                                  f'rebuild functions, not {inner if isinstance(inner, _Global) else "a computed value"}')
    if func == 'builtins.bytearray' and not (isinstance(args, tuple) and all(
            isinstance(a, (bytes, str, int)) for a in args)):
        raise UnpicklingError(f'{what}: a bytearray of a computed value (a size hidden in a numpy scalar?)')
    if func == 'numpy.dtype' and not (isinstance(args, tuple) and args and isinstance(args[0], str)):
        raise UnpicklingError(f'{what}: only plain numpy dtypes (a type code) are allowed')
    if func.endswith('multiarray._reconstruct') and not (
            isinstance(args, tuple) and len(args) == 3 and isinstance(args[2], (str, bytes))):
        raise UnpicklingError(f'{what}: a numpy array may only be rebuilt from a type code')
    budget.charge(max(_sizes(args), default=0), f'{what}: {f"a call of {func}" if func else "a value"}')


def scan_pickle(data: bytes, limit: int, allowed: set) -> None:
    """Walk the opcodes of one or more pickles in ``data`` on a symbolic stack: every global must
    be in ``allowed``; the calls, values and storages may declare ``limit`` bytes in all."""
    stream = io.BytesIO(data)
    budget = _Budget(limit)
    while stream.tell() < len(data):
        _scan_one(stream, budget, allowed)


def _opcodes(stream: io.BytesIO) -> Iterator[tuple]:
    """The opcodes one at a time (a list of them cost about 100 bytes each); a malformed pickle is
    :class:`DamagedCheckpoint`."""
    try:
        yield from pickletools.genops(stream)
    except Exception as exc:
        raise DamagedCheckpoint(f'malformed pickle: {exc}') from exc


def _scan_one(stream: io.BytesIO, budget: _Budget, allowed: set) -> None:
    stack: List[Any] = []
    memo: Dict[int, Any] = {}

    def pop_mark() -> list:
        items = []
        while stack:
            item = stack.pop()
            if item is _MARK:
                return items[::-1]
            items.append(item)
        raise DamagedCheckpoint('malformed pickle (no mark)')

    def pop(n: int = 1) -> list:
        if len(stack) < n:
            raise DamagedCheckpoint('malformed pickle (stack underflow)')
        items = stack[-n:]
        del stack[-n:]
        return items

    for op, arg, pos in _opcodes(stream):
        name, where = op.name, f'pickle opcode {op.name} at byte {pos}'
        if name in ('GLOBAL', 'STACK_GLOBAL'):
            module, attr = arg.split(' ', 1) if name == 'GLOBAL' else pop(2)
            if not (isinstance(module, str) and isinstance(attr, str)):
                raise UnpicklingError(f'{where}: a computed global name')
            dotted = f'{_PY2_NAMES.get(module, module)}.{attr}'
            if dotted not in allowed:
                raise UnpicklingError(f'{where}: the global {dotted} is not allowed (only tensors, '
                                      f"containers and MMEngine's logging objects are)")
            stack.append(_Global(dotted))
        elif name == 'REDUCE':
            func, args = pop(2)
            _check_call(func, args, budget, where)
            # protocol 2 writes bytes as _codecs.encode(text, 'latin1'): keep them as bytes
            encoded = func == '_codecs.encode' and isinstance(args, tuple) and args and isinstance(args[0], str)
            stack.append(args[0].encode('utf-8') if encoded else _OPAQUE)
        elif name in ('NEWOBJ', 'NEWOBJ_EX'):
            items = pop(3 if name == 'NEWOBJ_EX' else 2)
            _check_call(items[0], tuple(items[1:]), budget, where)
            stack.append(_OPAQUE)
        elif name == 'BUILD':
            state, = pop()
            _check_call('', state, budget, where, call=False)
        elif name in ('BINPERSID', 'PERSID'):
            pid = pop()[0] if name == 'BINPERSID' else arg
            _check_storage(pid, budget, where)
            stack.append(_OPAQUE)
        elif name == 'MARK':
            stack.append(_MARK)
        elif name == 'TUPLE':
            stack.append(tuple(pop_mark()))
        elif name in ('TUPLE1', 'TUPLE2', 'TUPLE3'):
            stack.append(tuple(pop(int(name[-1]))))
        elif name == 'EMPTY_TUPLE':
            stack.append(())
        elif name in ('LIST', 'DICT', 'FROZENSET'):
            pop_mark()
            stack.append(_OPAQUE)
        elif name in ('APPENDS', 'SETITEMS', 'ADDITEMS', 'POP_MARK'):
            pop_mark()
        elif name in ('APPEND', 'POP'):
            pop()
        elif name == 'SETITEM':
            pop(2)
        elif name == 'DUP':
            stack.append(stack[-1] if stack else _OPAQUE)
        elif name in ('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'):
            if not stack:
                raise DamagedCheckpoint(f'{where}: malformed pickle (memo of an empty stack)')
            memo[len(memo) if name == 'MEMOIZE' else arg] = stack[-1]
        elif name in ('GET', 'BINGET', 'LONG_BINGET'):
            stack.append(memo.get(arg, _OPAQUE))
        elif name in ('PROTO', 'FRAME'):
            pass
        elif name == 'STOP':
            return
        elif name in ('INST', 'OBJ', 'EXT1', 'EXT2', 'EXT4'):
            raise UnpicklingError(f'{where}: this opcode is not allowed in a checkpoint')
        elif op.stack_before == [] and len(op.stack_after) == 1:  # pushes one value (numbers, strings)
            value = arg if isinstance(arg, (int, float, str, bytes, bool)) or arg is None else _OPAQUE
            stack.append(value if name not in ('EMPTY_LIST', 'EMPTY_DICT', 'EMPTY_SET') else _OPAQUE)
        else:
            raise UnpicklingError(f'{where}: unexpected opcode')


def inspect_checkpoint(path: str) -> None:
    """Check ``path`` before ``torch.load`` reads it; raises ``UnpicklingError`` naming the problem.

    Zip or legacy is decided as torch decides (the file's first bytes, not ``zipfile.is_zipfile``,
    which finds a zip appended to a legacy stream). A torch zip archive: every record's size
    (deflated ones after expansion) must fit the file, it must hold exactly one ``data.pkl``, the one
    torch reads, and that pickle passes :func:`scan_pickle`. A legacy file: its pickles pass it.
    """
    size = os.path.getsize(path)
    allowed = allowed_globals()
    with open(path, 'rb') as f:
        if not torch.serialization._is_zipfile(f):
            scan_pickle(_legacy_pickles(f.read(), size), size, allowed)
            return
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            expanded = sum(r.file_size for r in records)
            if expanded > MAX_EXPANSION * max(size, 1):
                biggest = max(records, key=lambda r: r.file_size)
                raise UnpicklingError(
                    f'its records declare {expanded} bytes ({expanded / 2**30:.1f} GiB) in a file of '
                    f'{size} bytes (largest: {biggest.filename}, {biggest.file_size} bytes)')
            bad = [r.filename for r in records if r.compress_type not in (zipfile.ZIP_STORED,
                                                                          zipfile.ZIP_DEFLATED)]
            if bad:
                raise UnpicklingError(f'records compressed in an unsupported way: {bad[:3]}')
            scan_pickle(_torch_pickle_record(path, records), size, allowed)
    except zipfile.BadZipFile as exc:
        raise DamagedCheckpoint(f'a damaged archive: {exc}') from exc


def _torch_pickle_record(path: str, records: List[zipfile.ZipInfo]) -> bytes:
    """The bytes of the one pickle torch unpickles: ``<folder>/data.pkl``, the folder being the first
    record's (torch's reader names the archive so), read by torch's own reader. Any other record
    called ``data.pkl`` is refused: a check that read it would check another pickle than torch loads."""
    folder = records[0].filename.split('/', 1)[0] if records and '/' in records[0].filename else None
    pickles = [r.filename for r in records if r.filename.rsplit('/', 1)[-1] == 'data.pkl']
    if folder is None or not pickles:
        raise DamagedCheckpoint('the archive has no data.pkl in a folder: not a torch checkpoint')
    if pickles != [f'{folder}/data.pkl']:
        raise UnpicklingError(f'the archive holds {len(pickles)} data.pkl records ({", ".join(pickles[:3])}), '
                              f'where torch reads exactly one, {folder}/data.pkl')
    with open(path, 'rb') as f:
        return torch._C.PyTorchFileReader(f).get_record('data.pkl')


def _legacy_pickles(data: bytes, size: int) -> bytes:
    """The pickles of a legacy torch file (magic, protocol, sys info, object, storage keys), without
    the raw storage bytes after them."""
    stream, end = io.BytesIO(data), 0
    for _ in range(5):
        try:
            for op, _arg, _pos in pickletools.genops(stream):
                if op.name == 'STOP':
                    break
        except Exception as exc:
            raise DamagedCheckpoint(f'truncated, or not a torch checkpoint (neither a whole zip archive nor a pickle): '
                                  f'{exc}') from exc
        end = stream.tell()
        if end >= size:
            break
    return data[:end]


def describe(exc: BaseException) -> Optional[str]:
    """The reason to show for a refused file, or None when ``exc`` is not a refusal."""
    text = str(exc)
    if isinstance(exc, DamagedCheckpoint):
        return None
    if isinstance(exc, UnpicklingError) or 'Weights only load failed' in text or 'Unsupported global' in text:
        # torch wraps its unpickler's reason in advice on how to load the file anyway, on the line of
        # 'WeightsUnpickler error:' or after it
        reason = text.split('WeightsUnpickler error:', 1)[-1]
        first = next((line.strip() for line in reason.splitlines() if line.strip()), type(exc).__name__)
        return (f'refused, since unpickling it could run code or exhaust memory ({first}); a '
                f'checkpoint may hold only tensors, plain containers and MMEngine\'s logging objects')
    return None
