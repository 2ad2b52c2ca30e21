"""Checkpoint attacks tried in one process as a user's run meets them, with the address space capped after
the imports (its size + 1 GiB: a declared 64 GiB fails at once). Prints one JSON line per case, flushed,
so that a case which crashes the process is the one after the last line printed.

``python checkpoint_attacks.py FOLDER`` (tests/unit/test_checkpoint_security.py, TORCH_HOME set to
FOLDER/torch_home): issue 31's attacks (the planted ones hold a PickleExploit that creates FOLDER/pwned
when unpickled) and issue 63's deflate bomb behind a second central directory (both with their peak
memory), then issue 47's (:func:`shape_attacks`) through the checked reader, each line
``{case: [outcome, CPU seconds]}``, and torch's allow-list before and after ``import xcit_dense`` and a
read (``{"safe globals": [...]}``). ``python checkpoint_attacks.py FOLDER read_meta|mmengine`` tries
issue 47's attacks (and the damaged metas) through that reading path only."""
import copy
import json
import pickle
import resource
import struct
import sys
import tarfile
import time
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (adds its own entries to torch's allow-list when imported)
from numpy._core.multiarray import scalar as numpy_scalar  # by name: numpy 1.26 does not import it

SAFE_GLOBALS = [sorted(map(str, torch.serialization.get_safe_globals()))]  # before the toolkit's import

from capped_load import cap_address_space  # noqa: E402
from helpers import PickleExploit  # noqa: E402
from mmdet.models.backbones import ResNet  # noqa: E402
from mmengine.runner.checkpoint import _load_checkpoint, load_checkpoint  # noqa: E402

import xcit_dense.checked_loading  # noqa: E402,F401  (routes the checkpoint schemes to the checked reader)
from xcit_dense.engine.training.resume import judge_candidate  # noqa: E402
from xcit_dense.engine.training.rng_state_hook import get_rng_state  # noqa: E402
from xcit_dense.io.checkpoint import CheckpointError  # noqa: E402
from xcit_dense.io.weights import read_checkpoint  # noqa: E402

SAFE_GLOBALS.append(sorted(map(str, torch.serialization.get_safe_globals())))  # after the imports

DECLARED = 2 ** 36  # 64 GiB
# the hub-cache names MMEngine's tables give these model-zoo names
PLANTED = {'resnet50-0676ba61.pth': ('torchvision://resnet50', 'modelzoo://resnet50'),
           'resnet50_v1c-2cccc1ad.pth': ('open-mmlab://resnet50_v1c', 'openmmlab://resnet50_v1c'),
           'resnet50_8xb32_in1k_20210831-ea4938fc.pth': ('mmcls://resnet50',)}
BENIGN = 'resnet18-f37072fd.pth'  # torchvision://resnet18, placed by hand


class Bytearray:
    def __init__(self, size: int) -> None:
        self.size = size

    def __reduce__(self):
        return (bytearray, (self.size,))


class ObjectArray:
    """``numpy.ndarray`` called directly: an object array whose element is the pointer 0x4141..."""

    def __reduce__(self):
        return (np.ndarray, ((1,), 'O', b'AAAAAAAA'))


class BytearrayOf:
    """``bytearray(data)``: a copy of ``data``, which the pickle stores once however often it is copied."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self):
        return (bytearray, (self.data,))


class ScalarSize:
    """A size hidden in a numpy scalar: ``bytearray(scalar(dtype('i8'), <64 GiB>))``."""

    def __reduce__(self):
        return (bytearray, (numpy_scalar(np.dtype('i8'), DECLARED.to_bytes(8, 'little')),))


def many_calls(folder: Path, calls: int = 20_000) -> Path:
    """``calls`` copies of one stored 256 KB bytes value (``bytearray(data)``): each within any limit
    per call, 5 GiB in all, from a file of about 400 KB."""
    path = folder / 'many_calls.pth'
    data = bytes(2 ** 18)
    torch.save({'meta': [BytearrayOf(data) for _ in range(calls)]}, path)
    return path


def many_opcodes(folder: Path, count: int = 2 ** 20) -> Path:
    """A legacy file whose pickle is ``{'meta': [[], [], ...]}``, ``count`` empty lists of one opcode
    each: 1 MB that unpickles into about 70 MB of objects (and a symbolic scan's stack of as many)."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION
    info = dict(protocol_version=PROTOCOL_VERSION, little_endian=True, type_sizes=dict(short=2, int=4, long=4))
    head = b''.join(pickle.dumps(value, 2) for value in (MAGIC_NUMBER, PROTOCOL_VERSION, info))
    path = folder / 'many_opcodes.pth'
    body = (pickle.PROTO + b'\x02' + pickle.EMPTY_DICT + pickle.BINUNICODE + b'\x04\x00\x00\x00meta' + pickle.EMPTY_LIST
            + pickle.MARK + pickle.EMPTY_LIST * count + pickle.APPENDS + pickle.SETITEM + pickle.STOP)
    path.write_bytes(head + body + pickle.dumps([], 2))
    return path


def zip_declaring(folder: Path, size: int) -> Path:
    """A real checkpoint whose tensor record declares ``size`` bytes (stored, in its central entry and its
    local header alike), as a crafted archive would: more than the file holds."""
    records = torch_records(folder)
    return write(folder / 'record.pth', zip_bytes([(name, data, dict(declared=size) if '/data/' in name else {})
                                                   for name, data in records]))


def zero_strides(folder: Path) -> Path:
    """One stored double viewed as 2**18 x 2**18 (zero strides): 512 GiB once materialised (a cast)."""
    path = folder / 'zero_strides.pth'
    torch.save({'t': torch.zeros(1, dtype=torch.float64).expand(2 ** 18, 2 ** 18)}, path)
    return path


def legacy_with_zip_appended(folder: Path) -> Path:
    """A legacy stream declaring 64 GiB, a harmless zip checkpoint appended: zipfile.is_zipfile finds the
    zip, torch reads the first bytes."""
    torch.save({'meta': Bytearray(DECLARED)}, folder / 'legacy.pth', _use_new_zipfile_serialization=False)
    torch.save({'state_dict': {}}, folder / 'harmless.pth')
    path = folder / 'legacy_zip.pth'
    path.write_bytes((folder / 'legacy.pth').read_bytes() + (folder / 'harmless.pth').read_bytes())
    return path


def two_pickles(folder: Path) -> Path:
    """``archive/x/data.pkl`` (harmless, first) beside ``archive/data.pkl`` (64 GiB), which torch reads."""
    torch.save({'meta': Bytearray(DECLARED)}, folder / 'bomb.pth')
    path = folder / 'two_pickles.pth'
    with zipfile.ZipFile(folder / 'bomb.pth') as bomb, zipfile.ZipFile(folder / 'harmless.pth') as harmless, \
            zipfile.ZipFile(path, 'w') as out:
        archive = bomb.namelist()[0].split('/')[0]
        out.writestr(f'{archive}/x/data.pkl', harmless.read(harmless.namelist()[0]))
        for name in bomb.namelist():
            out.writestr(name, bomb.read(name))
    return path


def report(case: str, attempt) -> None:
    try:
        result = attempt()
        outcome = f'loaded {result!r}'[:200]  # repr touches every value (an object array's pointer too)
    except CheckpointError as exc:
        outcome = f'refused {exc}'
    except MemoryError:
        outcome = 'MemoryError'
    except Exception as exc:  # noqa: BLE001  (the report names whatever else happened)
        outcome = f'{type(exc).__name__} {exc}'
    print(json.dumps({case: outcome}), flush=True)


def init_resnet(model: ResNet) -> str:
    model.init_weights()
    return 'initialised'


def peak_growth(attempt) -> str:
    """What ``attempt`` gives, and how far it raised the process's peak memory (MB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        attempt()
        outcome = 'loaded'
    except CheckpointError as exc:
        outcome = f'refused {exc}'
    except MemoryError:
        outcome = 'MemoryError'
    return f'{outcome} | peak +{(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024} MB'


# --- issue 47: what is built, the work on it, messages, tar, metas -----------------------------------

class Reduce:
    """Pickled as ``func(*args)``, then given ``state`` (BUILD) or ``items`` (SETITEMS), as a crafted file
    would be written."""

    def __init__(self, func, args, state=None, items=None) -> None:
        self.func, self.args, self.state, self.items = func, args, state, items

    def __call__(self):  # the pickler takes only callables as functions
        raise NotImplementedError

    def __reduce__(self):
        return (self.func, self.args, self.state, None, iter(self.items) if self.items else None)


P2 = pickle.PROTO + b'\x02'


def binput(index: int) -> bytes:
    return pickle.LONG_BINPUT + struct.pack('<I', index)


def binget(index: int) -> bytes:
    return pickle.LONG_BINGET + struct.pack('<I', index)


def long1(value: int) -> bytes:
    data = value.to_bytes((value.bit_length() + 8) // 8, 'little', signed=True)
    return pickle.LONG1 + bytes([len(data)]) + data


def zip_of(path: Path, body: bytes) -> Path:
    """A torch zip archive (the records torch.save writes) whose data.pkl is ``body``."""
    torch.save({}, path)
    with zipfile.ZipFile(path) as source:
        records = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, 'w') as out:
        for name, data in records:
            out.writestr(name, body if name.endswith('/data.pkl') else data)
    return path


def doubling(levels: int, tuples: bool) -> bytes:
    """t(n+1) = (t(n), t(n)) through the memo (each level memoised, then popped): a few bytes per level,
    2**levels values unrolled; the last level is left on the stack."""
    out = pickle.BININT1 + b'\x01' + pickle.TUPLE1 + binput(0) if tuples else \
        pickle.EMPTY_LIST + binput(0) + pickle.BININT1 + b'\x01' + pickle.APPEND
    for n in range(1, levels + 1):
        out += pickle.POP
        if tuples:
            out += binget(n - 1) + binget(n - 1) + pickle.TUPLE2 + binput(n)
        else:
            out += pickle.EMPTY_LIST + binput(n) + pickle.MARK + binget(n - 1) + binget(n - 1) + pickle.APPENDS
    return out


def key_of(value: bytes) -> bytes:
    """``{value: 1}``: the value used as a dict key (hashed)."""
    return P2 + pickle.EMPTY_DICT + value + pickle.BININT1 + b'\x01' + pickle.SETITEM + pickle.STOP


def tar_with_pax(path: Path, digits: int = 80_000) -> Path:
    """A legacy-format name, a tar archive: a pax header of ``digits`` digits, which Python 3.11.7's tarfile
    searches for ``hdrcharset`` by backtracking (CVE-2024-6232: quadratic), as torch's legacy reader opens it."""
    header = tarfile.TarInfo('././@PaxHeader')
    header.type, header.size = tarfile.XHDTYPE, digits
    data = b'1' * digits
    padding = b'\0' * (-digits % tarfile.BLOCKSIZE)
    path.write_bytes(header.tobuf(tarfile.USTAR_FORMAT) + data + padding + b'\0' * 2 * tarfile.BLOCKSIZE)
    return path


def shape_attacks(folder: Path) -> Dict[str, Path]:
    """Issue 47's files: each would crash the process, take unbounded CPU time, build an unbounded message
    or parse a tar archive, if read by the reader of issue 31; the bad metas stop a resume."""
    files = {
        # hashing a tuple nested 200,000 deep recurses in C past the stack (SIGSEGV)
        'deep tuple key': zip_of(folder / 'deep.pth', key_of(pickle.EMPTY_TUPLE + pickle.TUPLE1 * 200_000)),
        # 1.9 KB: hashing visits 2**28 nodes
        'doubling tuple key': zip_of(folder / 'doubling.pth', key_of(doubling(28, tuples=True))),
        # a refusal that printed the called value's repr: 2**26 lists
        'repr of a call': zip_of(folder / 'repr.pth', P2 + doubling(26, tuples=False) + pickle.EMPTY_TUPLE
                                 + pickle.REDUCE + pickle.STOP),
        # a refusal naming a 2 MB global
        'long global name': zip_of(folder / 'global.pth', P2 + pickle.GLOBAL + b'os\n' + b'x' * 2_000_000 + b'\n'
                                   + pickle.STOP),
        # a size of 400,000 bits (its decimal digits are over Python's limit; formatting it raised)
        'huge int in a message': zip_of(folder / 'huge_int.pth', P2 + pickle.GLOBAL + b'builtins\nbytearray\n'
                                        + pickle.LONG4 + struct.pack('<i', 50_000) + b'\x7f' * 50_000
                                        + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP),
        # 20,000 integer keys of one hash (multiples of 2**61 - 1 apart)
        'colliding int keys': zip_of(folder / 'collide.pth', P2 + pickle.EMPTY_DICT + pickle.MARK + b''.join(
            long1(5 + i * (2 ** 61 - 1)) + pickle.BININT1 + b'\x00' for i in range(20_000)) + pickle.SETITEMS
            + pickle.STOP),
        # a list that holds itself
        'cycle': zip_of(folder / 'cycle.pth', P2 + pickle.EMPTY_DICT + pickle.BINUNICODE + b'\x04\0\0\0meta'
                        + pickle.EMPTY_LIST + binput(0) + binget(0) + pickle.APPEND + pickle.SETITEM + pickle.STOP),
        'legacy tar with a pax header': tar_with_pax(folder / 'tar.pth'),
    }
    # a view of 80 sizes of 2,040 bits: prod() of them before any check
    torch.save({'t': Reduce(torch._utils._rebuild_tensor_v2, (torch.zeros(1).untyped_storage(), 0,
                                                              (2 ** 2040 + 1,) * 80, (1,) * 80, False, OrderedDict()))},
               folder / 'view.pth')
    files['huge sizes in a view'] = folder / 'view.pth'
    state = OrderedDict(w=torch.ones(1))
    state._metadata = []  # load_state_dict fails on it, long after the choice of the checkpoint
    torch.save({'state_dict': state, 'meta': {'iter': 1}}, folder / 'metadata.pth')
    files['_metadata a list'] = folder / 'metadata.pth'
    torch.save({'state_dict': {}, 'meta': {1.5: 1}}, folder / 'float_key.pth')
    files['meta with a float key'] = folder / 'float_key.pth'
    return files


def with_config_texts(checkpoint: dict, marker: Path,
                      places: Tuple[str, ...] = ('meta config', 'meta cfg', 'runtime_info cfg')) -> dict:
    """``checkpoint`` (a copy) with Python that creates ``marker`` in the given ``places`` where MMEngine
    reads a config's text and runs it (``Config.fromstring``): ``meta['config']`` (``Runner.resume``),
    the message hub's ``runtime_info['cfg']`` and ``meta['cfg']`` (the inferencers given no config).
    Plain strings: the checked reader reads them as data, as it should."""
    code = f"open({str(marker)!r}, 'w').write('pwned')\n"
    out = dict(checkpoint, meta=dict(checkpoint.get('meta') or {}))
    hub = dict(out.get('message_hub') or {})
    out['message_hub'] = dict(hub, runtime_info=dict(hub.get('runtime_info') or {}))
    keys = {'meta config': (out['meta'], 'config'), 'meta cfg': (out['meta'], 'cfg'),
            'runtime_info cfg': (out['message_hub']['runtime_info'], 'cfg')}
    for place in places:
        parent, key = keys[place]
        parent[key] = code
    return out


# metas that stopped a resume's choice of the newest checkpoint: plain values, which the checked reader
# reads; the typed record (data_position.progress_of) refuses them
BAD_METAS = {'iter a string': {'iter': '7'}, 'iter NaN': {'iter': float('nan')}, 'iter inf': {'iter': float('inf')},
             'iter of 5,000 digits': {'iter': '9' * 5000}, 'epoch 2**60': {'epoch': 2 ** 60},
             'data_position without epoch': {'data_position': {'samples': 3}}}


# --- issue 63: plain values where the toolkit or MMEngine's resume needs other types -----------------

def _with(checkpoint: dict, change: Callable[[dict], None]) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in checkpoint.items()}  # what a change replaces
    change(out)
    return out


def _meta(**values) -> Callable[[dict], None]:
    return lambda checkpoint: checkpoint['meta'].update(values)


def _rename_weight(checkpoint: dict) -> None:
    state = checkpoint['state_dict']
    state['backbone.blocks.x.y'] = state.pop(next(iter(state)))


# files whose values the checked reader reads (plain data) and whose use stopped a resume with a traceback, or
# took seconds and gigabytes (a zero-stride view iterated or broadcast): each a change of a real checkpoint,
# and what refuses it
PLANTED_VALUES = {
    'seed a string': (_meta(seed='x'), "meta's seed is 'x'"),
    'seed 2**70': (_meta(seed=2 ** 70), "meta's seed is an int of 71 bits"),
    'message_hub a string': (lambda c: c.update(message_hub='x'), "message_hub is 'x', not a dict"),
    'optimizer without param groups': (lambda c: c.update(optimizer={'state': {}}),
                                       "optimizer param_groups is None"),
    'state dict key backbone.blocks.x.y': (_rename_weight, "'backbone.blocks.x.y' has 'x' where an index"),
    'rng_states torch a string': (_meta(rng_states=[dict(get_rng_state(), torch='x')]),
                                  "meta's rng_states[0] torch is 'x'"),
    'rng_states torch of 65536 bytes': (_meta(rng_states=[dict(get_rng_state(), torch=np.zeros(1 << 16, np.uint8))]),
                                        "meta's rng_states[0] torch is a uint8 array of shape (65536,)"),
    'batch plan lr a tensor': (lambda c: c['meta'].update(batch_plan=dict(
        c['meta'].get('batch_plan') or {}, lr=torch.zeros(1).expand(2 ** 10))), "meta's batch_plan lr holds a tensor"),
}


def _reshape_first(part: str, *keys) -> Callable[[dict], None]:
    """Replace the first tensor of ``checkpoint[part]`` (under ``keys``) by one of another shape."""
    def change(checkpoint: dict) -> None:
        checkpoint[part] = copy.deepcopy(checkpoint[part])
        parent = checkpoint[part]
        for key in keys:
            parent = parent[key]
        name = next(k for k, v in parent.items() if isinstance(v, torch.Tensor) and v.dim())
        parent[name] = torch.zeros(parent[name].numel() + 1)
    return change


def _scheduler(change: Callable[[list], None]) -> Callable[[dict], None]:
    def apply(checkpoint: dict) -> None:
        checkpoint['param_schedulers'] = copy.deepcopy(checkpoint['param_schedulers'])
        change(checkpoint['param_schedulers'])
    return apply


def _group_fewer(checkpoint: dict) -> None:
    """The optimizer without its last parameter group and that group's state (of the right types)."""
    groups = checkpoint['optimizer']['param_groups'][:-1]
    kept = {index for group in groups for index in group['params']}
    state = {k: v for k, v in checkpoint['optimizer']['state'].items() if k in kept}
    checkpoint['optimizer'] = dict(checkpoint['optimizer'], param_groups=groups, state=state)


def _ema_of_another_shape(checkpoint: dict) -> None:
    """An EMA run's trained weights (``module.``-prefixed, beside ``steps``), the first of another shape."""
    ema = {'steps': torch.tensor(4), **{f'module.{k}': v for k, v in checkpoint['state_dict'].items()}}
    first = next(k for k, v in ema.items() if k.startswith('module.') and v.dim())
    ema[first] = torch.zeros(ema[first].numel() + 1)
    checkpoint['ema_state_dict'] = ema


def _nan_weights(checkpoint: dict) -> None:
    checkpoint['state_dict'] = {k: torch.full_like(v, float('nan')) if v.is_floating_point() else v
                                for k, v in checkpoint['state_dict'].items()}


# files of plain, well-typed values that do not fit the model, optimizer or schedulers the run's config
# builds: each was chosen by a bare --resume and ended the run (one line, or a traceback at the first
# optimizer or scheduler step); each is skipped now (engine/training/resume_fit.py), with what names it
PLANTED_MISFITS = {
    'a weight of another shape': (_reshape_first('state_dict'), 'was saved from a different model'),
    'NaN weights': (_nan_weights, 'holds NaN or infinite weights'),
    'an EMA run\'s trained weights of another shape': (_ema_of_another_shape, '(its ema_state_dict) was saved from'),
    'an optimizer state of another shape': (_reshape_first('optimizer', 'state', 0), 'its optimizer state 0 '),
    'an optimizer group fewer': (_group_fewer, 'parameter groups, the config builds'),
    'a scheduler more, with an optimizer': (_scheduler(lambda s: s.append(dict(optimizer='x', last_step=1))),
                                            'holds 1 parameter schedulers, the config builds 0'),
}


def planted(checkpoint: dict, case: str) -> dict:
    """``checkpoint`` (a copy of its top-level dicts) changed as ``PLANTED_VALUES[case]`` or
    ``PLANTED_MISFITS[case]`` says."""
    return _with(checkpoint, {**PLANTED_VALUES, **PLANTED_MISFITS}[case][0])


def released(classes, palette=None) -> dict:
    """A file in the authors' released layout (``backbone.pos_embeder.*``) whose meta holds ``CLASSES`` and
    ``PALETTE`` (a zero-stride view of 2**20 elements as ``CLASSES``: ``tuple()`` of it took 8.8 s)."""
    meta = {'CLASSES': classes} if palette is None else {'CLASSES': classes, 'PALETTE': palette}
    return {'state_dict': {'backbone.pos_embeder.token_projection.weight': torch.ones(1)}, 'meta': meta}


def timed(case: str, attempt: Callable) -> None:
    """One line: ``{case: [outcome, CPU seconds]}``."""
    start = time.process_time()
    try:
        result = attempt()
        outcome = f'loaded {type(result).__name__}'
    except CheckpointError as exc:
        outcome = f'refused {exc}'
    except Exception as exc:  # noqa: BLE001  (the report names whatever else happened)
        outcome = f'{type(exc).__name__} {exc}'
    print(json.dumps({case: [outcome[:100_000], time.process_time() - start]}), flush=True)


PATHS = {'reader': lambda path: read_checkpoint(path), 'read_meta': judge_candidate,
         'mmengine': lambda path: load_checkpoint(torch.nn.Linear(1, 1), path, map_location='cpu')}


def try_shape_attacks(folder: Path, path_kind: str) -> None:
    files = shape_attacks(folder)
    if path_kind == 'read_meta':
        for case, meta in BAD_METAS.items():
            files[case] = folder / f'{len(files)}.pth'
            torch.save({'state_dict': {}, 'meta': meta}, files[case])
    read = PATHS[path_kind]
    for case, path in files.items():
        timed(case, lambda: read(str(path)))


# --- issue 63: archives that torch's reader (miniz) reads otherwise than Python's zipfile ------------

def torch_records(folder: Path) -> List[Tuple[str, bytes]]:
    """The records (name, data) torch.save writes for a small state dict, in its order."""
    torch.save({'state_dict': {'w': torch.ones(2)}}, folder / 'small.pth')
    with zipfile.ZipFile(folder / 'small.pth') as source:
        return [(info.filename, source.read(info)) for info in source.infolist()]


def zip_record(name: str, data: bytes, offset: int, deflate: bool = False, declared: Optional[int] = None,
               local_name: Optional[str] = None, content: Optional[Tuple[bytes, int, int]] = None
               ) -> Tuple[bytes, bytes]:
    """A record at ``offset`` as Python's zipfile writes one (no data descriptor): its local header
    with its data, and its central entry. ``deflate``: its data deflated; ``content``: (deflated data,
    CRC, size) given instead; ``declared``: the size both headers declare (a zip64 field from 4 GiB);
    ``local_name``: another name in its local header."""
    if deflate:
        content = zlib.compress(data, 9, wbits=-15), zlib.crc32(data), len(data)
    payload, crc, size = content or (data, zlib.crc32(data), len(data))
    method, sizes, extra = 0 if content is None else 8, (len(payload), size), b''
    if declared is not None:
        sizes = (min(declared, 0xFFFFFFFF),) * 2
        extra = struct.pack('<2H2Q', 1, 16, declared, declared) if declared >= 0xFFFFFFFF else b''
    encoded, local_encoded = name.encode(), (local_name or name).encode()
    local = struct.pack('<4s5H3L2H', b'PK\x03\x04', 20, 0, method, 0, 0, crc, *sizes, len(local_encoded),
                        len(extra)) + local_encoded + extra + payload
    central = struct.pack('<4s6H3L5H2L', b'PK\x01\x02', 20, 20, 0, method, 0, 0, crc, *sizes, len(encoded),
                          len(extra), 0, 0, 0, 0, offset) + encoded + extra
    return local, central


def end_record(entries: int, directory_size: int, directory_at: int, comment: bytes = b'') -> bytes:
    return struct.pack('<4s4H2LH', b'PK\x05\x06', 0, 0, entries, entries, directory_size, directory_at,
                       len(comment)) + comment


def zip_parts(records: List[Tuple[str, bytes, dict]], start: int = 0) -> Tuple[bytes, bytes]:
    """The records (name, data, options of :func:`zip_record`) end to end from offset ``start``, and their
    central directory."""
    body, directory = b'', b''
    for name, data, options in records:
        local, central = zip_record(name, data, start + len(body), **options)
        body, directory = body + local, directory + central
    return body, directory


def zip_bytes(records: List[Tuple[str, bytes, dict]], comment: bytes = b'') -> bytes:
    """A zip archive of ``records`` as Python's zipfile writes one (what torch.save writes, less its
    zip64 end record and data descriptors)."""
    body, directory = zip_parts(records)
    return body + directory + end_record(len(records), len(directory), len(body), comment)


def two_directories(records: List[Tuple[str, bytes]], torch_pickle: Tuple[str, bytes, dict]) -> bytes:
    """``records`` twice, each with its own central directory, the end record pointing at the first (which
    torch's reader reads, with ``torch_pickle`` for its data.pkl) while the second lies directly before it
    (which zipfile reads: the records as they are)."""
    torch_body, torch_directory = zip_parts([torch_pickle] + [(name, data, {}) for name, data in records[1:]])
    body, directory = zip_parts([(name, data, {}) for name, data in records], len(torch_body))
    assert len(directory) == len(torch_directory)  # one size in the end record serves both
    return torch_body + body + torch_directory + directory + end_record(len(records), len(directory),
                                                                        len(torch_body) + len(body))


def overlapping(records: List[Tuple[str, bytes]]) -> bytes:
    """``records`` with ``data/0`` inside the data of one more, ``cover``: the central entry of ``data/0``
    points into it, every header agreeing with its entry."""
    name = records[0][0].replace('data.pkl', 'data/0')
    tensor = dict(records)[name]
    body, directory = zip_parts([(n, data, {}) for n, data in records if n != name])
    inner, _ = zip_record(name, tensor, 0)
    cover, cover_entry = zip_record(name.replace('data/0', 'cover'), inner, len(body))
    _, entry = zip_record(name, tensor, len(body) + len(cover) - len(inner))
    directory += cover_entry + entry
    return body + cover + directory + end_record(len(records) + 1, len(directory), len(body + cover))


def with_more(records: List[Tuple[str, bytes]], name: str, data: bytes) -> bytes:
    """``records`` and one more, ``name`` in their folder (``data.pkl`` replaced by it)."""
    return zip_bytes([(n, d, {}) for n, d in records] + [(records[0][0].replace('data.pkl', name), data, {})])


# what each file does: a record torch would inflate whole (deflated ones up to 4x the file were read);
# an archive comment (readers find the end record each its own way); two names one record for torch's
# lookup, which ignores case; a local header that names another record (torch reads the data where the
# local header says); a record inside another's data; the end record pointing at one central directory while
# another lies directly before it (zipfile reads that one); a name longer than torch's reader lists (its
# list cuts names at 511 bytes)
ARCHIVE_ATTACKS: Dict[str, Callable[[List[Tuple[str, bytes]]], bytes]] = {
    'deflated record': lambda records: zip_bytes([(name, data, dict(deflate=name.endswith('/data.pkl')))
                                                  for name, data in records]),
    'archive comment': lambda records: zip_bytes([(name, data, {}) for name, data in records], b'made by hand'),
    'names equal but for case': lambda records: with_more(records, 'DATA/0', b'\0' * 8),
    'local header naming another record': lambda records: zip_bytes([(name, data, dict(
        local_name=name.replace('data/0', 'data/1')) if name.endswith('/data/0') else {}) for name, data in records]),
    'overlapping records': overlapping,
    'a second central directory': lambda records: two_directories(
        records, (records[0][0], pickle.dumps({'state_dict': {}}, 2), {})),
    'a name torch lists cut short': lambda records: with_more(records, 'n' * 600, b''),
}


def bomb_behind_a_second_directory(folder: Path, inflated: int = 2 ** 28) -> Path:
    """Issue 63's file: zipfile reads the records as torch.save wrote them, torch's reader a data.pkl that
    inflates to an empty dict's pickle and ``inflated`` zero bytes (256 MiB from about 256 KB), before
    any pickle opcode is read. One compressed MiB repeated (each ends in a full flush, so copies chain)."""
    records = torch_records(folder)
    head, mib = zlib.compressobj(9, zlib.DEFLATED, -15), zlib.compressobj(9, zlib.DEFLATED, -15)
    block = mib.compress(bytes(2 ** 20)) + mib.flush(zlib.Z_FULL_FLUSH)
    pickled = pickle.dumps({}, 2)
    deflated = (head.compress(pickled) + head.flush(zlib.Z_FULL_FLUSH) + block * (inflated >> 20)
                + zlib.compressobj(9, zlib.DEFLATED, -15).flush())
    crc = zlib.crc32(pickled)
    for _ in range(inflated >> 20):
        crc = zlib.crc32(bytes(2 ** 20), crc)
    content = (deflated, crc, len(pickled) + (inflated >> 20 << 20))
    return write(folder / 'bomb_directory.pth', two_directories(records, (records[0][0], b'', dict(content=content))))


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def main(folder: Path) -> None:
    opcodes = many_opcodes(folder)  # first: nothing else has raised the peak yet
    cap_address_space()
    print(json.dumps({'many opcodes': peak_growth(lambda: read_checkpoint(str(opcodes)))}), flush=True)
    bomb = bomb_behind_a_second_directory(folder)  # second: its growth is measured too
    print(json.dumps({'deflate bomb behind a second directory': peak_growth(lambda: read_checkpoint(str(bomb)))}),
          flush=True)
    hub = Path(torch.hub.get_dir()) / 'checkpoints'
    hub.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        torch.save({'state_dict': {}, 'meta': PickleExploit(str(folder / 'pwned'))}, hub / name)
    benign = ResNet(depth=18).state_dict()
    torch.save(benign, hub / BENIGN)
    torch.save({'meta': {'classes': ObjectArray()}}, folder / 'object_array.pth')
    torch.save({'meta': ScalarSize()}, folder / 'scalar_size.pth')
    torch.save({'meta': Bytearray(DECLARED)}, folder / 'bytearray.pth')
    files = {'legacy with a zip appended': legacy_with_zip_appended(folder), 'two data.pkl': two_pickles(folder),
             'size in a numpy scalar': folder / 'scalar_size.pth', 'many calls': many_calls(folder),
             'bytearray of 64 GiB': folder / 'bytearray.pth', 'record of 64 GiB': zip_declaring(folder, DECLARED)}
    planted_resnet = ResNet(depth=50, init_cfg=dict(type='Pretrained', checkpoint='torchvision://resnet50'))
    benign_resnet = ResNet(depth=18, init_cfg=dict(type='Pretrained', checkpoint='torchvision://resnet18'))

    for names in PLANTED.values():
        for name in names:
            report(name, lambda: _load_checkpoint(name))
    report('ResNet init_cfg torchvision://resnet50', lambda: init_resnet(planted_resnet))
    report('ResNet init_cfg torchvision://resnet18 (placed by hand)',
           lambda: init_resnet(benign_resnet) == 'initialised' and all(
               torch.equal(v, benign[k]) for k, v in benign_resnet.state_dict().items()))
    for name in ('s3://bucket/model.pth', 'pavi://model', 'petrel://bucket/model.pth'):
        report(name, lambda: _load_checkpoint(name))
    report('object array', lambda: read_checkpoint(str(folder / 'object_array.pth')))
    report('object array, torch weights_only', lambda: torch.load(folder / 'object_array.pth', weights_only=True))
    for case, path in files.items():
        report(case, lambda: read_checkpoint(str(path)))
    report('zero strides, cast', lambda: read_checkpoint(str(zero_strides(folder)))['t'].float().sum())
    SAFE_GLOBALS.append(sorted(map(str, torch.serialization.get_safe_globals())))  # after the reads above
    try_shape_attacks(folder, 'reader')
    print(json.dumps({'safe globals': SAFE_GLOBALS}), flush=True)


if __name__ == '__main__':
    if len(sys.argv) > 2:
        try_shape_attacks(Path(sys.argv[1]), sys.argv[2])
    else:
        main(Path(sys.argv[1]))
