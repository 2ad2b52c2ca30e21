"""Checkpoint files: safe reading, atomic writing, diffing key sets (engine/resume.py chooses the one to resume from).

Both the backbone's pretrained weights (models/weights.py maps their layouts) and the training
checkpoints go through here, and so does MMEngine's own reader of local files (its
``CheckpointLoader`` scheme is replaced). Files are inspected (weights_only.py) and read with
``torch.load(weights_only=True)``, so a checkpoint can never run code nor claim more memory than
it holds; URLs are downloaded by download.py. Writes go to a temporary file, created exclusively
and renamed into place, so a kill while saving never leaves a truncated checkpoint under a
checkpoint's name and a link planted in a shared work dir is never followed. The authors' released
detectors and segmentors are read in this toolkit's layout (``models/weights.py`` maps them).
"""
import os
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn

from .download import DownloadError, download, file_digest
from .weights_only import allow_mmengine_checkpoints, describe as describe_refusal, inspect_checkpoint

__all__ = ['CheckpointError', 'read_checkpoint', 'read_meta', 'local_checkpoint', 'load_weights_only', 'allow_mmengine_checkpoints',
           'check_matches_model', 'diff_keys', 'AtomicLocalBackend', 'ATOMIC_WRITES']


_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: checkpoints get the permissions a plain open() would give


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit the model."""


def load_weights_only(path: str, map_location: Union[str, torch.device, None] = 'cpu',
                      mmap: bool = False) -> Any:
    """``torch.load(weights_only=True)`` after :func:`inspect_checkpoint`; errors name the file.
    ``mmap``: the tensors' data is mapped from the file, read only when used (zip archives only)."""
    try:
        inspect_checkpoint(path)
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:
        reason = describe_refusal(exc)
        if reason is None:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f'cannot read checkpoint {path}: {reason}') from exc


def _toolkit_layout(ckpt: Any) -> Any:
    """A released model's file (the authors' key names) as this toolkit's; anything else as it is."""
    from .models.weights import from_released_layout  # models/ imports this module
    return from_released_layout(ckpt)[0] if isinstance(ckpt, dict) else ckpt


def local_checkpoint(path: str, sha256: Optional[str] = None) -> str:
    """The local file of a checkpoint path or URL (downloaded by download.py, digests checked)."""
    if '://' in path:
        try:
            return download(path, sha256)
        except DownloadError as exc:
            raise CheckpointError(str(exc)) from exc
    if sha256:
        file_sha = file_digest(path) if os.path.isfile(path) else ''
        if not file_sha.startswith(sha256.lower()):
            raise CheckpointError(f'checkpoint {path} has sha256 {file_sha or "(no file)"}, '
                                  f'expected {sha256}')
    return path


def read_checkpoint(path: str, map_location: Union[str, torch.device] = 'cpu',
                    sha256: Optional[str] = None) -> dict:
    """Load a checkpoint file or URL (download.py: https, digests), weights only, in this toolkit's
    layout; errors name it."""
    path = local_checkpoint(path, sha256)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    ckpt = load_weights_only(path, map_location)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'checkpoint {path} holds a {type(ckpt).__name__}, not a dict of tensors')
    return _toolkit_layout(ckpt)


def read_meta(path: str) -> dict:
    """The ``meta`` of a local checkpoint file ({} if it has none), without reading its tensors'
    data (they are memory-mapped, not read: a detector's checkpoint is half a gigabyte). Raises
    CheckpointError for a file that cannot be read, as :func:`read_checkpoint` does."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    ckpt = load_weights_only(path, mmap=zipfile.is_zipfile(path))
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    return meta if isinstance(meta, dict) else {}


@CheckpointLoader.register_scheme(prefixes='', force=True)
def _load_local(filename: str, map_location=None) -> Any:
    """MMEngine's reader of local checkpoints (``load_from``, ``resume``, mmdet's and mmseg's
    inferencers), replaced so that every file is inspected and read weights only."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return _toolkit_layout(load_weights_only(filename, map_location))


@CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), force=True)
def _load_url(filename: str, map_location=None, model_dir=None) -> Any:
    """MMEngine's reader of URLs, replaced by the checked download and the weights-only read."""
    try:
        return _toolkit_layout(load_weights_only(download(filename), map_location))
    except DownloadError as exc:
        raise CheckpointError(str(exc)) from exc


@dataclass
class KeyDiff:
    """How a checkpoint's state dict differs from a model's, in the model's key order."""

    missing: List[str]  # in the model only
    unexpected: List[str]  # in the checkpoint only
    mismatched: List[Tuple[str, tuple, tuple]]  # (key, checkpoint shape, model shape)


def diff_keys(own: Dict[str, torch.Tensor], state: Dict[str, torch.Tensor]) -> KeyDiff:
    """Compare a model's state dict ``own`` with a checkpoint's ``state``: keys and shapes."""
    return KeyDiff(missing=[k for k in own if k not in state],
                   unexpected=[k for k in state if k not in own],
                   mismatched=[(k, tuple(state[k].shape), tuple(own[k].shape))
                               for k in own if k in state and state[k].shape != own[k].shape])


def check_matches_model(model: nn.Module, checkpoint: str, loaded: Optional[dict] = None) -> None:
    """Refuse a checkpoint of another model for ``model`` (resume, test, inference), naming the keys,
    or both backbones when its XCiT backbone differs (patch size, width, depth read from its keys).
    ``loaded``: the checkpoint's contents when they are already read (not read again)."""
    state = (read_checkpoint(checkpoint) if loaded is None else loaded).get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    from .models.weights import check_backbone_fits  # models/ imports this module
    check_backbone_fits(model, state, checkpoint)
    diff = diff_keys((model.module if hasattr(model, 'module') else model).state_dict(), state)
    mismatched = [f'{k} {saved} vs {own}' for k, saved, own in diff.mismatched]
    if diff.missing or diff.unexpected or mismatched:
        def head(keys):
            return ', '.join(keys[:5]) + (f' ... ({len(keys)})' if len(keys) > 5 else '')
        raise CheckpointError(
            f'{checkpoint} was saved from a different model: missing {head(diff.missing) or "none"}; '
            f'unexpected {head(diff.unexpected) or "none"}; shape mismatches {head(mismatched) or "none"}')


class AtomicLocalBackend(LocalBackend):
    """A local file backend whose writes are all-or-nothing (write, fsync, rename)."""

    def put(self, obj: bytes, filepath) -> None:
        filepath = str(filepath)
        os.makedirs(os.path.dirname(filepath) or '.', exist_ok=True)
        folder, name = os.path.split(filepath)
        tmp = None
        try:
            # O_EXCL | O_NOFOLLOW under a random name: a file or link planted in the folder is never
            # written through; the rename then replaces the name itself, never a link's target
            fd, tmp = tempfile.mkstemp(dir=folder or '.', prefix=f'{name}.tmp-')
            with os.fdopen(fd, 'wb') as f:
                os.fchmod(f.fileno(), 0o666 & ~_UMASK)
                f.write(obj)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, filepath)
        except OSError as exc:
            raise CheckpointError(f'cannot write {filepath}: {exc.strerror or exc} (the checkpoints '
                                  f'written before are untouched)') from exc
        finally:
            if tmp and os.path.lexists(tmp):
                os.remove(tmp)

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        self.put(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend, force=True)
ATOMIC_WRITES = dict(backend='atomic_local')  # the ``backend_args`` of a checkpoint written through it


def __getattr__(name: str) -> Any:
    """The resume helpers, now in engine/resume.py, under their old import path."""
    if name in ('find_resumable_checkpoint', 'write_pointer'):
        from .engine import resume  # the engine imports this module
        return getattr(resume, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
