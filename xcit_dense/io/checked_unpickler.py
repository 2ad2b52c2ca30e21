"""Reading a checkpoint file with every object checked at the moment it is built.

Checkpoints are data from people the user may not trust. :func:`load_checked` hands torch's own
archive readers (``torch.serialization._load`` for zip archives, ``_legacy_load`` for the older
stream) a pickle module whose ``Unpickler`` builds nothing but what a checkpoint holds: tensors,
plain containers, numbers and strings, numpy arrays and scalars of numeric dtypes, and MMEngine's
``HistoryBuffer``. ``find_class`` hands out only the constructors listed in :data:`CONSTRUCTORS`,
each of which checks its real arguments before it builds; only those may be called (``REDUCE``),
and only the listed types get their state (``BUILD``).

What is built is bounded in shape too: every container charges its depth and its unrolled size (a
value referred to twice counts twice, as anything that walks the result would visit it) as items are
put into it, and a container already inside another takes no more items (no cycles). Dict keys and
set members are strings or integers below 2**48 (nothing else is hashed), and sizes, strides and
offsets are integers below 2**48, refused before any arithmetic. Messages describe a refused value
by its type, length and a few characters (:func:`brief`), never by its ``repr``.

What a file may make the process allocate is charged, when it is about to happen, against a
:class:`Budget` relative to the file's size: every storage (once per key, before torch allocates
it: legacy files allocate the declared size before reading), every tensor at its materialised size
(a zero-stride view of one stored double counts as what a cast of it would allocate), numpy arrays,
``bytes`` and ``bytearray`` calls, in total. The unpickler is Python's own (``pickle._Unpickler``:
its memo is a dict, where the C one resizes an array to any index a 6-byte ``LONG_BINPUT`` names),
and each opcode it runs is charged what it can add to its own memory, so that this is bounded by the
file's size too.

Before unpickling, the archive is checked as torch will read it (zip or legacy by the first bytes,
as torch decides). A zip archive is parsed once, strictly, before torch opens it (``torch_archive.py``:
the layout ``torch.save`` writes, stored records only, so nothing is ever inflated), must hold exactly
one ``data.pkl``, and torch's reader must then list the same records at the same offsets and sizes. A
legacy file whose first block is a tar header is refused before ``tarfile``, in torch's legacy reader,
parses anything.
``torch.load`` itself is not called: its ``weights_only`` switch concerns torch's own unpickler, which
this one replaces, and under a user's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` it would refuse any pickle
module. The variable keeps its effect on every other ``torch.load``; checkpoints the toolkit reads
are read by this (stricter) unpickler, which says so once in the log.
"""
import functools
import os
import pickle
import re
import struct
from collections import Counter, OrderedDict
from typing import IO, Any, Callable, Dict, Iterable, List, Optional

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log

# imported by name: numpy 1.26's numpy._core (the home of numpy 2's internals) does not import its
# multiarray on `import numpy`, so the attribute path np._core.multiarray fails there
from numpy._core.multiarray import _reconstruct as numpy_reconstruct, scalar as numpy_scalar

from .torch_archive import ArchiveDamaged, ArchiveRefused, Record, read_layout

# the budgets, as multiples of the file's size (a real checkpoint spends about twice its size on
# data: its storages and its tensors), plus a little for tiny files
DATA_PER_FILE_BYTE = 4
OBJECTS_PER_FILE_BYTE = 64
SLACK = 1 << 20
# what one opcode can add to the unpickler's memory (a number, an empty list or dict, a tuple of
# three, a memo entry, a stack slot); a set costs more. Data an opcode carries is the file's own.
OPCODE_COST = 128
SET_COST = 256
# the statistics methods MMEngine pickles as ``getattr(HistoryBuffer, name)``
# the shape of what is built: containers nest at most this deep; keys, sizes, strides and offsets
# stay below LARGEST_INT (arithmetic on them is then cheap and their hashes do not collide)
MAX_DEPTH = 64
LARGEST_INT = 1 << 48
# a description in a message shows at most this many characters of a string
SHOWN_CHARS = 40
TAR_BLOCK = 512
MAX_REASON = 400  # characters of a reason a message repeats
HISTORY_METHODS = ('min', 'max', 'current', 'mean')
HISTORY_STATE = {'max_length', '_log_history', '_count_history', 'statistics_methods'}
_NUMERIC_CODE = re.compile(r'[<>=|]?[biufc][0-9]{1,2}')


class Refused(pickle.UnpicklingError):
    """A file that could run code or exhaust memory if it were read."""


class DamagedCheckpoint(pickle.UnpicklingError):
    """A file that is not a readable torch checkpoint (truncated, damaged, another format)."""


def brief(value: Any) -> str:
    """``value`` described at a bounded cost and length (its type, its length, a few characters), for
    messages: an attacker's object's ``repr`` could take any time and memory to build."""
    kind = type(value)
    if value is None or kind in (bool, float, complex):
        return repr(value)
    if kind is int:
        return str(value) if value.bit_length() <= 64 else f'an int of {value.bit_length()} bits'
    if kind in (str, bytes, bytearray):
        shown = repr(value[:SHOWN_CHARS])
        return shown if len(value) <= SHOWN_CHARS else f'{shown}... ({len(value)} long)'
    if kind is tuple and len(value) <= 8 and all(type(v) is int and v.bit_length() <= 64 for v in value):
        return repr(value)  # a size or strides
    if isinstance(value, _Call):
        return value.name
    if isinstance(value, (np.generic, torch.dtype)) or kind is np.dtype or kind is torch.device:
        return repr(value)[:2 * SHOWN_CHARS]  # numeric scalars, dtypes: short by construction
    if isinstance(value, np.dtype):
        return 'a numpy dtype' if value.names is None and value.subdtype is None else 'a structured numpy dtype'
    if isinstance(value, type):
        return brief(value.__qualname__)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f'a {kind.__name__[:SHOWN_CHARS]} of {len(value)} items'
    return f'a {kind.__name__[:SHOWN_CHARS]}'


def _number(value: int) -> str:
    return str(value) if value.bit_length() <= 64 else f'about 2**{value.bit_length()}'


class Budget:
    """What one file may make the process allocate: ``data`` (storages, tensors, arrays, bytes) and
    ``objects`` (the unpickler's own), each a multiple of the file's size."""

    def __init__(self, file_size: int) -> None:
        self.file_size = file_size
        self.limits = {'data': DATA_PER_FILE_BYTE * file_size + SLACK,
                       'objects': OBJECTS_PER_FILE_BYTE * file_size + SLACK}
        self.spent = {'data': 0, 'objects': 0}
        self.storages: set = set()

    def charge(self, nbytes: int, what: str, kind: str = 'data') -> None:
        self.spent[kind] += nbytes
        if self.spent[kind] > self.limits[kind]:
            spent = self.spent[kind]
            raise Refused(f'{what} ({_number(nbytes)} bytes) brings what it would allocate ({kind}) to '
                          f'{_number(spent)} bytes ({spent / 2**30 if spent.bit_length() < 1000 else float("inf"):.1f} '
                          f'GiB), more than a file of {self.file_size} bytes may ({self.limits[kind]})')

    def max_nodes(self) -> int:
        """How many values what is built may hold, unrolled: one per opcode the object budget allows."""
        return self.limits['objects'] // OPCODE_COST


def plain_int(value: Any, what: str, minimum: int = 0) -> int:
    """An ``int`` written out as one (not a numpy scalar or other object that converts to one), below
    2**48: sizes, strides and offsets, checked before any arithmetic on them."""
    if type(value) is not int or not minimum <= value < LARGEST_INT:
        raise Refused(f'{what} is {brief(value)}: a checkpoint writes it as a plain integer of at least '
                      f'{minimum} and below 2**48')
    return value


def product_past(values: tuple, limit: int) -> int:
    """The product of ``values`` (integers below 2**48), or a partial product above ``limit``, which is
    enough to refuse: the whole product of many large sizes would take long to compute."""
    if 0 in values:
        return 0
    total = 1
    for value in values:
        total *= value
        if total > limit:
            break
    return total


def hashable_key(key: Any) -> Any:
    """A dict key or set member: a string, or an integer below 2**48 in size. Anything else is refused
    before it is hashed (a deep tuple's hash recurses past the stack; big integers can share a hash)."""
    kind = type(key)
    if kind is str or (kind is int or kind is bool) and -LARGEST_INT < key < LARGEST_INT:
        return key
    raise Refused(f'a dict key or set member that is {brief(key)}: a checkpoint\'s keys are strings or integers '
                  f'below 2**48')


def plain_ints(value: Any, what: str) -> tuple:
    if type(value) is not tuple:
        raise Refused(f'{what} is {brief(value)}, not a tuple of integers')
    return tuple(plain_int(v, what) for v in value)


def numeric_dtype(code: Any, align: Any = False, copy: Any = True) -> np.dtype:
    """``numpy.dtype`` of a numeric type code only (``'f8'``, ``'i4'``, ``'b1'``, ...): no object,
    string, structured or void dtype, whose arrays could hold pointers. Always a fresh copy (its
    BUILD then sets its byte order, never numpy's shared instance)."""
    if not (isinstance(code, str) and _NUMERIC_CODE.fullmatch(code)):
        raise Refused(f'numpy.dtype({brief(code)}) is refused: a checkpoint may hold numeric numpy values only')
    return np.dtype(code, bool(align), True)


def check_numeric(dtype: Any, what: str) -> np.dtype:
    if not (isinstance(dtype, np.dtype) and dtype.kind in 'biufc' and not dtype.hasobject
            and dtype.names is None and dtype.subdtype is None):
        raise Refused(f'{what} of dtype {brief(dtype)}: only numeric numpy dtypes are allowed')
    return dtype


def numeric_scalar(dtype: Any, data: Any = None) -> Any:
    """numpy's ``scalar(dtype, bytes)`` for a numeric dtype and exactly its item's bytes."""
    check_numeric(dtype, 'a numpy scalar')
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise Refused(f'a numpy scalar of {dtype} from {brief(data)}: {dtype.itemsize} bytes expected')
    return numpy_scalar(dtype, data)


def check_array_state(state: Any, budget: Budget) -> None:
    """The state numpy's ``ndarray.__setstate__`` takes, ``(1, shape, dtype, is_fortran, data)``:
    a numeric dtype, integer sizes, exactly the array's bytes (charged to ``budget``)."""
    if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1 and type(state[3]) is bool):
        raise Refused('a numpy array whose state is not (1, shape, dtype, is_fortran, data)')
    shape, dtype, data = plain_ints(state[1], 'a numpy array\'s shape'), state[2], state[4]
    itemsize = check_numeric(dtype, 'a numpy array').itemsize
    nbytes = product_past(shape, budget.limits['data']) * itemsize
    budget.charge(nbytes, f'a numpy array of {brief(shape)} {dtype}')
    if type(data) not in (bytes, bytearray) or len(data) != nbytes:
        found = f'{len(data)} bytes' if isinstance(data, (bytes, bytearray)) else brief(data)
        raise Refused(f'a numpy array of {brief(shape)} {dtype} ({nbytes} bytes) from {found}')


def history_buffer_method(obj: Any, name: Any) -> Any:
    """``getattr`` as unpickling needs it: only ``HistoryBuffer``'s statistics methods resolve."""
    methods = set(HISTORY_METHODS) | set(HistoryBuffer._statistics_methods)
    if obj is HistoryBuffer and isinstance(name, str) and name in methods \
            and callable(HistoryBuffer.__dict__.get(name)):
        return HistoryBuffer.__dict__[name]
    raise Refused(f'getattr({brief(obj)}, {brief(name)}) is refused: a checkpoint may only name '
                  f"the statistics methods of MMEngine's HistoryBuffer")


def _empty_hooks(hooks: Any) -> None:
    if type(hooks) is not OrderedDict or hooks:
        raise Refused('a tensor with backward hooks (torch.save writes an empty OrderedDict)')


def _attribute_state(state: Any) -> None:
    """State ``_set_obj_state`` sets on a tensor or parameter: the user's own attributes only."""
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
    for part in parts:
        if part is None:
            continue
        if not isinstance(part, dict) or any(not isinstance(k, str) or not k.isidentifier() or k.startswith('_')
                                             or hasattr(torch.Tensor, k) for k in part):
            shown = ', '.join(brief(k) for k, _ in zip(part, range(5))) if isinstance(part, dict) else brief(part)
            raise Refused(f'a tensor whose saved attributes are not plain names of its own: {shown}')


class _Call:
    """A constructor a checkpoint may call, by name, with its arguments checked by ``check``."""

    def __init__(self, name: str, check: Callable) -> None:
        self.name, self.check = name, check

    def __call__(self, *args: Any) -> Any:
        return self.check(*args)

    def __repr__(self) -> str:
        return self.name


_TENSOR_REBUILDS = ('torch._utils._rebuild_tensor', 'torch._utils._rebuild_tensor_v2',
                    'torch._utils._rebuild_tensor_v3', 'torch._utils._rebuild_parameter',
                    'torch._utils._rebuild_parameter_with_state')
# the names a checkpoint may call, and the method of CheckedUnpickler that checks and builds each
CONSTRUCTORS = {
    'torch._utils._rebuild_tensor': '_tensor_v1', 'torch._utils._rebuild_tensor_v2': '_tensor_v2',
    'torch._utils._rebuild_tensor_v3': '_tensor_v3', 'torch._utils._rebuild_parameter': '_parameter',
    'torch._utils._rebuild_parameter_with_state': '_parameter',
    'torch._tensor._rebuild_from_type_v2': '_from_type', 'collections.OrderedDict': '_ordered_dict',
    'collections.Counter': '_counter', 'torch.Size': '_size', 'torch.device': '_device',
    '_codecs.encode': '_encode', 'builtins.bytes': '_bytes', 'builtins.bytearray': '_bytearray',
    'builtins.set': '_set', 'builtins.frozenset': '_frozenset', 'builtins.getattr': '_getattr',
    'numpy.core.multiarray._reconstruct': '_reconstruct', 'numpy._core.multiarray._reconstruct': '_reconstruct',
    'numpy.core.multiarray.scalar': '_scalar', 'numpy._core.multiarray.scalar': '_scalar',
    'numpy.dtype': '_dtype', 'builtins.complex': '_complex'}
# names that resolve to a value, never called: types handed to the constructors above, dtypes
VALUES = {'torch.Tensor': torch.Tensor, 'torch.nn.parameter.Parameter': torch.nn.Parameter,
          'torch.UntypedStorage': torch.UntypedStorage, 'torch.storage.UntypedStorage': torch.UntypedStorage,
          'numpy.ndarray': np.ndarray,
          'mmengine.logging.history_buffer.HistoryBuffer': HistoryBuffer,
          **{str(t): t for t in vars(torch).values() if isinstance(t, torch.dtype)}}
_DICTS = (dict, OrderedDict, Counter)
_PY2_MODULES = {'__builtin__': 'builtins', 'copy_reg': 'copyreg'}
_SET_OPCODES = {pickle.EMPTY_SET[0], pickle.FROZENSET[0], pickle.ADDITEMS[0]}
_REFUSED_OPCODES = {op[0]: name for name, op in (
    ('INST', pickle.INST), ('OBJ', pickle.OBJ), ('EXT1', pickle.EXT1), ('EXT2', pickle.EXT2),
    ('EXT4', pickle.EXT4), ('PERSID', pickle.PERSID), ('NEXT_BUFFER', pickle.NEXT_BUFFER),
    ('READONLY_BUFFER', pickle.READONLY_BUFFER))}


class CheckedUnpickler(pickle._Unpickler):
    """Python's unpickler with the checks above; ``budget`` is set per file (:class:`_PickleModule`).
    torch subclasses it (its ``find_class`` turns storage names into storage types first) and sets
    ``persistent_load`` on the instance, which :meth:`_binpersid` calls once the id is checked."""

    budget: Budget
    dispatch: Dict[int, Callable] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arrays_to_build: set = set()  # ids of arrays _reconstruct made, whose BUILD is pending
        # the values that hold others, by id: [value (kept alive, so that its id stays its own), depth,
        # unrolled size, whether it is inside another value]; anything else counts as one value of depth 0
        self._nodes: Dict[int, List[Any]] = {}
        self._max_nodes = self.budget.max_nodes()

    def _contain(self, container: Any, items: Iterable[Any]) -> None:
        """Charge ``container`` for ``items`` about to be put into it: its depth and unrolled size (a
        value held twice counts twice, as whatever walks the result visits it twice). A container that
        is already inside another takes no more (a cycle, or a value changed after it was used)."""
        nodes = self._nodes
        node = nodes.get(id(container))
        if node is None:
            node = nodes[id(container)] = [container, 1, 1, False]
        depth, size = node[1], node[2]
        for item in items:
            inner = nodes.get(id(item))
            if inner is None:
                size += 1
            else:
                inner[3] = True
                size += inner[2]
                if inner[1] >= depth:
                    depth = inner[1] + 1
        if node[3]:
            raise Refused(f'items put into {brief(container)} that is already inside another value (a cycle, '
                          f'or a value changed after it was used): torch.save never writes that')
        if depth > MAX_DEPTH:
            raise Refused(f'values nested more than {MAX_DEPTH} deep ({brief(container)})')
        if size > self._max_nodes:
            raise Refused(f'{brief(container)} that holds {_number(size)} values once unrolled (a value referred '
                          f'to twice counts twice), more than a file of {self.budget.file_size} bytes may '
                          f'({self._max_nodes})')
        node[1], node[2] = depth, size

    def _made_of(self, value: Any, parts: Any) -> Any:
        """``value``, built from the tuple ``parts`` (a call's arguments), charged as holding them."""
        node = self._nodes.get(id(parts))
        if node is not None and id(value) not in self._nodes:
            self._contain(value, (parts,))
        return value

    def find_class(self, module: str, name: str) -> Any:
        dotted = f'{_PY2_MODULES.get(module, module)}.{name}'
        if dotted in CONSTRUCTORS:
            return _Call(dotted, getattr(self, CONSTRUCTORS[dotted]))
        if dotted in VALUES:
            return VALUES[dotted]
        history = 'mmengine.logging.history_buffer.HistoryBuffer.'
        if dotted.startswith(history):  # protocol 4 names the statistics methods by their qualified name
            return history_buffer_method(HistoryBuffer, dotted[len(history):])
        raise Refused(f'the global {brief(dotted)} is not allowed (a checkpoint may hold only tensors, containers, '
                      f"numbers, numeric numpy values and MMEngine's logging objects)")

    # --- opcodes -----------------------------------------------------------------------------------
    def _reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if not isinstance(func, _Call) or not isinstance(args, tuple):
            raise Refused(f'a call of {type(func).__name__} {brief(func)}: only the listed constructors may be called')
        self.stack[-1] = self._made_of(func(*args), args)

    def _newobj(self) -> None:
        """``cls.__new__(cls, *args)``: protocol 2 makes MMEngine's HistoryBuffer (then sets its state)
        and complex numbers so."""
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls is HistoryBuffer and args == ():
            self.append(HistoryBuffer.__new__(HistoryBuffer))
        elif isinstance(cls, _Call) and cls.name == 'builtins.complex' and isinstance(args, tuple):
            self.append(cls(*args))
        else:
            raise Refused(f'{brief(cls)}.__new__ of {brief(args)} is refused')

    def _newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        if type(kwargs) is not dict or kwargs:
            raise Refused('NEWOBJ_EX with keyword arguments is refused')
        self._newobj()

    def _build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is np.ndarray and id(inst) in self._arrays_to_build:
            self._arrays_to_build.discard(id(inst))
            check_array_state(state, self.budget)
            inst.__setstate__(state)
        elif isinstance(inst, np.dtype) and isinstance(state, tuple) and len(state) == 8 and state[0] == 3 \
                and state[1] in ('<', '>', '=', '|') and state[2:] == (None, None, None, -1, -1, 0):
            inst.__setstate__(state)  # its byte order
        elif type(inst) is OrderedDict and type(state) is dict and all(
                type(k) is str and k.isidentifier() and not k.startswith('__') for k in state):
            _check_module_metadata(state.get('_metadata'))
            self._contain(inst, state.values())
            inst.__dict__.update(state)  # a state dict's _metadata
        elif type(inst) is HistoryBuffer and type(state) is dict and set(state) <= HISTORY_STATE:
            self._check_history_state(state)
            self._contain(inst, state.values())
            inst.__setstate__(dict(state))
        else:
            raise Refused(f'setting the state of a {type(inst).__name__} is refused')

    @staticmethod
    def _check_history_state(state: dict) -> None:
        plain_int(state.get('max_length', 0), "a HistoryBuffer's max_length")
        for key in ('_log_history', '_count_history'):
            if type(state.get(key, np.empty(0))) is not np.ndarray:
                raise Refused(f"a HistoryBuffer's {key} that is not a numpy array")
        methods = state.get('statistics_methods', {})
        if not isinstance(methods, dict) or any(HistoryBuffer.__dict__.get(k) is not v for k, v in methods.items()):
            raise Refused("a HistoryBuffer's statistics methods that are not its own")

    def _binpersid(self) -> None:
        pid = self.stack.pop()
        self._check_storage(pid)
        self.append(self.persistent_load(pid))

    def _check_storage(self, pid: Any) -> None:
        """``('storage', type, key, location, numel[, view])``: its bytes charged once per key,
        before torch's ``persistent_load`` allocates them."""
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] in ('storage', b'storage')):
            raise Refused(f'a persistent id ({brief(pid)}) that is not a storage')
        storage_type, key, location, numel = pid[1:5]
        if storage_type is torch.UntypedStorage:
            element = 1
        elif isinstance(storage_type, torch.serialization.StorageType):
            element = torch._utils._element_size(storage_type.dtype)
        else:
            raise Refused(f'a storage of type {brief(storage_type)}')
        if type(key) is not str or type(location) not in (str, bytes):
            raise Refused(f'a storage whose key or location is not a string: {brief(key)}, {brief(location)}')
        numel = plain_int(numel, f'the size of storage {brief(key)}')
        if len(pid) == 6 and pid[5] is not None:  # a legacy view (key, offset, numel) into the storage
            view = pid[5]
            if not (type(view) is tuple and len(view) == 3 and type(view[0]) is str):
                raise Refused(f'a storage view ({brief(view)})')
            plain_int(view[1], 'a storage view\'s offset'), plain_int(view[2], 'a storage view\'s size')
        if key not in self.budget.storages:
            self.budget.storages.add(key)
            self.budget.charge(numel * element, f'storage {brief(key)} of {numel} elements')

    def _bytearray8(self) -> None:
        size, = struct.unpack('<Q', self.read(8))
        self.budget.charge(size, 'a BYTEARRAY8 record')
        data = bytearray(size)
        if self.readinto(data) != size:
            raise DamagedCheckpoint('truncated pickle (BYTEARRAY8)')
        self.append(data)

    def _into(self, types: tuple, what: str, items: list) -> Any:
        """The container below the values an opcode adds to it (only the types listed), charged for them."""
        if not self.stack or type(self.stack[-1]) not in types:
            raise Refused(f'{what} into a {type(self.stack[-1]).__name__ if self.stack else "nothing"} is refused')
        self._contain(self.stack[-1], items)
        return self.stack[-1]

    def _append(self) -> None:
        value = self.stack.pop()
        self._into((list,), 'APPEND', [value]).append(value)

    def _appends(self) -> None:
        items = self.pop_mark()
        self._into((list,), 'APPENDS', items).extend(items)

    def _setitem(self) -> None:
        value = self.stack.pop()
        key = hashable_key(self.stack.pop())
        self._into(_DICTS, 'SETITEM', [value])[key] = value

    def _setitems(self) -> None:
        items = self.pop_mark()
        keys = [hashable_key(key) for key in items[0:len(items) - 1:2]]
        values = items[1::2]
        target = self._into(_DICTS, 'SETITEMS', values)
        for key, value in zip(keys, values):
            target[key] = value

    def _additems(self) -> None:
        items = [hashable_key(item) for item in self.pop_mark()]
        self._into((set,), 'ADDITEMS', items).update(items)

    def _dict(self) -> None:
        items = self.pop_mark()
        keys = [hashable_key(key) for key in items[0:len(items) - 1:2]]
        values = items[1::2]
        built: dict = {}
        self._contain(built, values)
        built.update(zip(keys, values))
        self.append(built)

    def _list(self) -> None:
        items = self.pop_mark()
        built: list = []
        self._contain(built, items)
        built.extend(items)
        self.append(built)

    def _frozenset_op(self) -> None:
        items = [hashable_key(item) for item in self.pop_mark()]
        self.append(self._tuple_of(frozenset(items), items))

    def _tuple_of(self, built: Any, items: Any) -> Any:
        if items:  # the empty tuple and frozenset are shared instances: never charged as containers
            self._contain(built, items)
        return built

    def _tuple(self) -> None:
        items = self.pop_mark()
        self.append(self._tuple_of(tuple(items), items))

    def _tuple1(self) -> None:
        self.stack[-1] = self._tuple_of((self.stack[-1],), self.stack[-1:])

    def _tuple2(self) -> None:
        self.stack[-2:] = [self._tuple_of((self.stack[-2], self.stack[-1]), self.stack[-2:])]

    def _tuple3(self) -> None:
        self.stack[-3:] = [self._tuple_of((self.stack[-3], self.stack[-2], self.stack[-1]), self.stack[-3:])]

    # --- the constructors ---------------------------------------------------------------------------
    def _view(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: Any) -> None:
        """A tensor as a view ``(offset, size, stride)`` of a storage from the file: integer sizes and
        strides, charged at its materialised size (a view of one element with zero strides counts as
        the whole tensor, what a cast of it would allocate)."""
        if not isinstance(storage, torch.storage.TypedStorage):
            raise Refused(f'a tensor of a {type(storage).__name__}, not of a storage in the file')
        if not isinstance(dtype, torch.dtype):
            raise Refused(f'a tensor of dtype {brief(dtype)}')
        plain_int(offset, "a tensor's storage offset")
        size, stride = plain_ints(size, "a tensor's size"), plain_ints(stride, "a tensor's strides")
        if len(size) != len(stride):
            raise Refused(f'a tensor of size {brief(size)} with strides {brief(stride)}')
        self.budget.charge(product_past(size, self.budget.limits['data']) * torch._utils._element_size(dtype),
                           f'a tensor of {brief(size)} with strides {brief(stride)}')

    @staticmethod
    def _flags(requires_grad: Any, hooks: Any, metadata: Any) -> None:
        if type(requires_grad) is not bool:
            raise Refused('a tensor whose requires_grad is not a bool')
        _empty_hooks(hooks)
        if metadata is not None and not (isinstance(metadata, dict) and all(
                isinstance(k, str) and type(v) is bool for k, v in metadata.items())):
            raise Refused('a tensor whose metadata is not a dict of flags')

    def _tensor_v1(self, storage: Any, offset: Any, size: Any, stride: Any) -> torch.Tensor:
        self._view(storage, offset, size, stride, getattr(storage, 'dtype', None))
        return torch._utils._rebuild_tensor(storage, offset, size, stride)

    def _tensor_v2(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                   metadata: Any = None) -> torch.Tensor:
        self._view(storage, offset, size, stride, getattr(storage, 'dtype', None))
        self._flags(requires_grad, hooks, metadata)
        return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, metadata)

    def _tensor_v3(self, storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                   dtype: Any, metadata: Any = None) -> torch.Tensor:
        self._view(storage, offset, size, stride, dtype)
        self._flags(requires_grad, hooks, metadata)
        return torch._utils._rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata)

    def _parameter(self, data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> torch.nn.Parameter:
        if not isinstance(data, torch.Tensor) or type(requires_grad) is not bool:
            raise Refused('a parameter of something other than a tensor')
        _empty_hooks(hooks)
        _attribute_state(state)
        return torch._utils._rebuild_parameter_with_state(data, requires_grad, OrderedDict(), state or {})

    def _from_type(self, func: Any, new_type: Any, args: Any, state: Any) -> torch.Tensor:
        if not (isinstance(func, _Call) and func.name in _TENSOR_REBUILDS) or \
                new_type not in (torch.Tensor, torch.nn.Parameter) or not isinstance(args, tuple):
            raise Refused(f'_rebuild_from_type_v2({brief(func)}, {brief(new_type)}): only tensors rebuilt by torch')
        _attribute_state(state)
        return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)

    def _ordered_dict(self, *args: Any) -> OrderedDict:
        if args:
            raise Refused('OrderedDict called with arguments (pickles fill it item by item)')
        return OrderedDict()

    def _counter(self, *args: Any) -> Counter:
        if args and (len(args) > 1 or type(args[0]) is not dict):
            raise Refused('Counter of something other than a dict')
        return Counter(*args)

    def _size(self, sizes: Any = ()) -> torch.Size:
        return torch.Size(plain_ints(sizes, 'torch.Size'))

    def _device(self, kind: Any, index: Any = None) -> torch.device:
        if type(kind) is not str or len(kind) > SHOWN_CHARS or not (index is None or type(index) is int
                                                                  and 0 <= index < LARGEST_INT):
            raise Refused(f'torch.device({brief(kind)}, {brief(index)})')
        return torch.device(kind) if index is None else torch.device(kind, index)

    def _encode(self, text: Any, encoding: Any = None) -> bytes:
        """Protocol 2 writes bytes as ``_codecs.encode(text, 'latin1')``."""
        if type(text) is not str or encoding not in ('latin1', 'latin-1'):
            raise Refused(f'_codecs.encode of {brief(text)} as {brief(encoding)}')
        self.budget.charge(len(text), 'a bytes value')
        return text.encode('latin1')

    def _bytes(self) -> bytes:
        """Protocol 2 writes empty bytes as ``bytes()`` (an empty numpy array's data, say)."""
        return b''

    def _bytearray(self, data: Any = b'', encoding: Any = None) -> bytearray:
        """``bytearray(bytes)`` or ``bytearray(text, 'latin-1')`` (protocol 2): never of a size."""
        if not (type(data) is bytes and encoding is None or type(data) is str and encoding in ('latin1', 'latin-1')):
            raise Refused(f'bytearray of {type(data).__name__} {brief(data)}: only of bytes (a size, also one hidden '
                          f'in another object, is refused)')
        self.budget.charge(len(data), 'a bytearray')
        return bytearray(data, encoding) if encoding else bytearray(data)

    def _set(self, items: Any = ()) -> set:
        if type(items) not in (list, tuple):
            raise Refused(f'a set of {brief(items)}')
        self.budget.charge(SET_COST * len(items), 'a set', 'objects')
        return set(hashable_key(item) for item in items)

    def _frozenset(self, items: Any = ()) -> frozenset:
        return frozenset(self._set(items))

    def _getattr(self, obj: Any, name: Any) -> Any:
        return history_buffer_method(obj, name)

    def _reconstruct(self, array_type: Any, shape: Any, code: Any) -> np.ndarray:
        """numpy's ``_reconstruct(ndarray, (0,), b'b')``: an empty array that BUILD then fills, once."""
        if array_type is not np.ndarray or shape != (0,) or code not in (b'b', 'b'):
            raise Refused(f'_reconstruct({brief(array_type)}, {brief(shape)}, {brief(code)}): numpy pickles its '
                          f"arrays as _reconstruct(ndarray, (0,), b'b')")
        array = numpy_reconstruct(np.ndarray, (0,), b'b')
        self._arrays_to_build.add(id(array))
        return array

    def _scalar(self, dtype: Any, data: Any = None) -> Any:
        return numeric_scalar(dtype, data)

    def _dtype(self, code: Any, align: Any = False, copy: Any = True) -> np.dtype:
        return numeric_dtype(code, align, copy)

    def _complex(self, real: Any = 0.0, imag: Any = 0.0) -> complex:
        if type(real) not in (int, float) or type(imag) not in (int, float):
            raise Refused(f'complex({brief(real)}, {brief(imag)})')
        return complex(real, imag)


def _check_module_metadata(metadata: Any) -> None:
    """A state dict's ``_metadata`` (what ``load_state_dict`` hands each module): a dict of module
    names to dicts of string keys, ``version`` an integer if given."""
    if metadata is None:
        return
    if type(metadata) not in _DICTS or any(
            type(k) is not str or type(v) not in _DICTS or any(type(name) is not str for name in v)
            or not (v.get('version') is None or type(v['version']) is int) for k, v in metadata.items()):
        raise Refused(f"a state dict's _metadata that is {brief(metadata)}, not a dict of module names to dicts "
                      f"of their versions")


def _charged(handler: Callable, cost: int) -> Callable:
    def run(self: CheckedUnpickler) -> None:
        self.budget.charge(cost, 'one more pickle opcode', 'objects')
        handler(self)
    return run


def _refused(name: str) -> Callable:
    def run(self: CheckedUnpickler) -> None:
        raise Refused(f'the pickle opcode {name} is refused (torch.save never writes it)')
    return run


_OVERRIDES = {pickle.REDUCE[0]: CheckedUnpickler._reduce, pickle.NEWOBJ[0]: CheckedUnpickler._newobj,
              pickle.NEWOBJ_EX[0]: CheckedUnpickler._newobj_ex, pickle.BUILD[0]: CheckedUnpickler._build,
              pickle.BINPERSID[0]: CheckedUnpickler._binpersid, pickle.BYTEARRAY8[0]: CheckedUnpickler._bytearray8,
              pickle.APPEND[0]: CheckedUnpickler._append, pickle.APPENDS[0]: CheckedUnpickler._appends,
              pickle.SETITEM[0]: CheckedUnpickler._setitem, pickle.SETITEMS[0]: CheckedUnpickler._setitems,
              pickle.ADDITEMS[0]: CheckedUnpickler._additems, pickle.DICT[0]: CheckedUnpickler._dict,
              pickle.LIST[0]: CheckedUnpickler._list, pickle.FROZENSET[0]: CheckedUnpickler._frozenset_op,
              pickle.TUPLE[0]: CheckedUnpickler._tuple, pickle.TUPLE1[0]: CheckedUnpickler._tuple1,
              pickle.TUPLE2[0]: CheckedUnpickler._tuple2, pickle.TUPLE3[0]: CheckedUnpickler._tuple3,
              **{code: _refused(name) for code, name in _REFUSED_OPCODES.items()}}
class _Dispatch(dict):
    def __missing__(self, code: int) -> Callable:
        raise DamagedCheckpoint(f'not a pickle (byte {code:#04x} is no opcode)')


CheckedUnpickler.dispatch = _Dispatch({
    code: _charged(_OVERRIDES.get(code, handler), SET_COST if code in _SET_OPCODES else OPCODE_COST)
    for code, handler in pickle._Unpickler.dispatch.items()})


class _PickleModule:
    """What torch's archive readers take as ``pickle_module``: the checked unpickler, all the file's
    pickles under one budget (a legacy file has five)."""

    def __init__(self, budget: Budget) -> None:
        self.Unpickler = type('Unpickler', (CheckedUnpickler,), {'budget': budget})

    def load(self, file: IO[bytes], **kwargs: Any) -> Any:
        return self.Unpickler(file, **kwargs).load()


def check_archive(f: IO[bytes], size: int) -> List[Record]:
    """The records of a torch zip archive, parsed as torch's reader will find them
    (:func:`torch_archive.read_layout`), holding exactly one ``data.pkl``, ``<folder>/data.pkl``, the
    folder being the first record's (torch's reader names the archive so) and every record's."""
    try:
        records = read_layout(f, size)
    except ArchiveRefused as exc:
        raise Refused(f'an archive torch could read otherwise than it is checked: {exc}') from None
    except ArchiveDamaged as exc:
        raise DamagedCheckpoint(f'a damaged archive: {exc}') from None
    folder = records[0].name.split('/', 1)[0] if records and '/' in records[0].name else None
    # torch's reader finds names regardless of ASCII case
    pickles = [r.name for r in records if r.name.rsplit('/', 1)[-1].lower() == 'data.pkl']
    if folder is None or not pickles:
        raise DamagedCheckpoint('the archive has no data.pkl in a folder: not a torch checkpoint')
    if pickles != [f'{folder}/data.pkl']:
        shown = ', '.join(brief(name) for name in pickles[:3])
        raise Refused(f'the archive holds {len(pickles)} data.pkl records ({shown}), '
                      f'where torch reads exactly one, {brief(folder)}/data.pkl')
    outside = [r.name for r in records if not r.name.startswith(f'{folder}/')]
    if outside:
        raise Refused(f'a record outside the archive\'s folder {brief(folder)}: {brief(outside[0])}')
    return records


def check_torch_view(reader: Any, records: List[Record]) -> None:
    """What torch's reader (``torch._C.PyTorchFileReader``, opened on the checked file) finds: the same
    records, in the same order, each of the parsed size at the parsed offset. Anything else means the
    two parsers disagree on the file, so the check would not be of what torch reads."""
    prefix = len(records[0].name.split('/', 1)[0]) + 1
    names = [r.name[prefix:] for r in records]
    listed = reader.get_all_records()
    if listed != names:
        differing = next((a, b) for a, b in zip(listed + [''], names + ['']) if a != b)
        raise Refused(f"torch's reader lists {len(listed)} records, the archive's central directory {len(names)}; "
                      f'first differing: {brief(differing[0])} and {brief(differing[1])}')
    for name, record in zip(names, records):
        found = reader.get_record_offset(name), reader.get_record_size(name)
        if found != (record.data, record.size):
            raise Refused(f"torch's reader finds {brief(name)} at offset {found[0]} of {found[1]} bytes, the "
                          f'archive at {record.data} of {record.size}')


def is_tar_header(block: bytes) -> bool:
    """Whether ``block`` (a file's first 512 bytes) is a tar header whose checksum holds, as ``tarfile``
    judges it: only then does ``tarfile`` (torch's legacy reader opens every legacy file with it) parse
    further, pax headers included (CVE-2024-6232 on this Python). Nothing but these bytes is read."""
    if len(block) < TAR_BLOCK or block.count(0) == TAR_BLOCK:
        return False
    field = block[148:156]
    if field[0] in (0o200, 0o377):  # base-256, as tarfile reads it
        recorded = int.from_bytes(field[1:], 'big') - (256 ** 7 if field[0] == 0o377 else 0)
    else:
        digits = field.split(b'\0', 1)[0].strip()
        if digits.strip(b'01234567'):
            return False
        recorded = int(digits or b'0', 8)
    rest = block[:148] + block[156:TAR_BLOCK]
    unsigned = 256 + sum(rest)
    signed = 256 + sum(struct.unpack(f'{len(rest)}b', rest))
    return recorded in (unsigned, signed)


def _check_not_tar(f: IO[bytes]) -> None:
    """torch reads a legacy file that opens as a tar archive in the tar format of torch < 0.4, whose
    storages take their sizes from the file before anything is checked: refused, from its first block."""
    block = f.read(TAR_BLOCK)
    f.seek(0)
    if is_tar_header(block):
        raise Refused('the legacy tar format (torch before 0.4) is not read: load and save it again with a '
                      'current torch, where you trust it')


def load_checked(path: str, map_location: Any = 'cpu') -> Any:
    """The object in the checkpoint file ``path``, every object checked as it is built (see the
    module's docstring); raises :class:`Refused` for a file that could run code or exhaust memory."""
    if os.environ.get('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '0').lower() in ('1', 'y', 'yes', 'true'):
        _note_forced_weights_only()
    with open(path, 'rb') as f:
        size = os.fstat(f.fileno()).st_size
        pickle_module = _PickleModule(Budget(size))
        if torch.serialization._is_zipfile(f):  # the first bytes, as torch decides
            records = check_archive(f, size)
            f.seek(0)
            with torch.serialization._open_zipfile_reader(f) as archive:
                check_torch_view(archive, records)
                return torch.serialization._load(archive, map_location, pickle_module, encoding='utf-8')
        _check_not_tar(f)
        return torch.serialization._legacy_load(f, map_location, pickle_module, encoding='utf-8')


@functools.lru_cache(maxsize=None)
def _note_forced_weights_only() -> None:
    print_log('TORCH_FORCE_WEIGHTS_ONLY_LOAD is set: it applies to torch.load; the checkpoints xcit_dense reads '
              'go through its own checked unpickler, stricter than torch\'s weights-only one (docs/security.md)',
              logger='current')


def refusal_reason(exc: BaseException) -> Optional[str]:
    """The reason to show for a refused file, or None when ``exc`` is not a refusal."""
    if not isinstance(exc, Refused):
        return None
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    first = first if len(first) <= MAX_REASON else f'{first[:MAX_REASON]}...'
    return (f'refused, since unpickling it could run code or exhaust memory ({first}); a checkpoint may hold '
            f"only tensors, plain containers, numeric numpy values and MMEngine's logging objects")
