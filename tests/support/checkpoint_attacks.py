"""The checkpoint attacks of issue 31, tried in one process as a user's run meets them, with the address
space capped after the imports (its size + 1 GiB: a declared 64 GiB fails at once). Prints one JSON line
per case, flushed, so that a case which crashes the process is the one after the last line printed.

Run by tests/unit/test_checkpoint_security.py as ``python checkpoint_attacks.py FOLDER`` with TORCH_HOME
set to FOLDER/torch_home: the files are written under FOLDER; the planted ones hold a PickleExploit that
creates FOLDER/pwned when unpickled."""
import json
import pickle
import resource
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch

import xcit_dense.checked_loading  # noqa: F401  (routes the checkpoint schemes to the checked reader)
from capped_load import cap_address_space
from helpers import PickleExploit
from mmdet.models.backbones import ResNet
from mmengine.runner.checkpoint import _load_checkpoint
from xcit_dense.checkpoint import CheckpointError
from xcit_dense.models.weights import read_checkpoint

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
        return (bytearray, (np._core.multiarray.scalar(np.dtype('i8'), DECLARED.to_bytes(8, 'little')),))


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
    """A real checkpoint whose tensor record (deflated) declares ``size`` bytes in the central
    directory, as a crafted archive would."""
    torch.save({'state_dict': {'w': torch.zeros(256)}}, folder / 'plain.pth')
    path = folder / 'record.pth'
    with zipfile.ZipFile(folder / 'plain.pth') as source, zipfile.ZipFile(path, 'w') as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info), compress_type=zipfile.ZIP_DEFLATED
                         if '/data/' in info.filename else zipfile.ZIP_STORED)
        record = next(i for i in out.filelist if '/data/' in i.filename)
        record.file_size = size  # written into the central directory (zip64) at close
    return path


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


def main(folder: Path) -> None:
    opcodes = many_opcodes(folder)  # first: nothing else has raised the peak yet
    cap_address_space()
    print(json.dumps({'many opcodes': peak_growth(lambda: read_checkpoint(str(opcodes)))}), flush=True)
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


if __name__ == '__main__':
    main(Path(sys.argv[1]))
