"""Checkpoint files: reading them safely, writing them atomically.

Every read of a checkpoint goes through :func:`load_weights_only` (or :func:`read_without_data`, which
leaves the tensors' data unread): the file is read by checked_unpickler.py, which builds nothing but
tensors, containers and numeric values and checks each as it is built, so a checkpoint can never run
code nor claim more memory than its size allows; URLs are downloaded by download.py. Writes go through
output_files.py (a temporary file, created exclusively and renamed into place), so a kill while saving never leaves a
truncated checkpoint under a checkpoint's name and a link planted in a shared work dir is never
followed. What the contents mean to a model (the released models' layout, fit checks), the types of
the values in them and MMEngine's checkpoint schemes are in ``weights.py``, ``checkpoint_schema.py``
and ``checkpoint_schemes.py`` beside it.
"""
import io
import os
from typing import Any, Optional, Union

import torch
from mmengine.fileio import LocalBackend, register_backend

from .checked_unpickler import (
    MAX_REASON,
    Budget,
    _PickleModule,
    check_archive,
    check_torch_view,
    refusal_reason,
)
from .download import DownloadError, download, file_digest
from .hub import HubError, is_hub_name, resolve_hub_name
from .output_files import write_bytes
from .safetensors_files import load_weights_file

__all__ = ['CheckpointError', 'read_checkpoint_file', 'read_without_data', 'local_checkpoint', 'load_weights_only',
           'AtomicLocalBackend', 'ATOMIC_WRITES', 'write_checkpoint']


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit the model."""


def load_weights_only(path: str, map_location: Union[str, torch.device, None] = 'cpu') -> Any:
    """The object in the checkpoint file ``path``: a safetensors file's tensors, else read by
    :func:`checked_unpickler.load_checked` (nothing but weights and plain values), through
    ``safetensors_files.load_weights_file``; errors name the file."""
    try:
        return load_weights_file(path, map_location)
    except Exception as exc:
        raise CheckpointError(f'cannot read checkpoint {path}: {_reason(exc)}') from exc


def local_checkpoint(path: str, sha256: Optional[str] = None) -> str:
    """The local file of a checkpoint path, URL (downloaded by download.py, digests checked) or
    ``hf-hub:`` name (hub.py: huggingface_hub's cache; its file's digest checked here, as a local
    path's, where ``sha256`` pins one)."""
    if is_hub_name(path):
        try:
            path = resolve_hub_name(path)
        except HubError as exc:
            raise CheckpointError(str(exc)) from exc
    elif '://' in path:
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


def read_checkpoint_file(path: str, map_location: Union[str, torch.device] = 'cpu',
                         sha256: Optional[str] = None) -> dict:
    """The dict in a checkpoint file or URL (download.py: https, digests), read weights only, as
    saved; errors name it. ``io.weights.read_checkpoint`` gives it in this toolkit's layout."""
    path = local_checkpoint(path, sha256)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    ckpt = load_weights_only(path, map_location)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'checkpoint {path} holds a {type(ckpt).__name__}, not a dict of tensors')
    return ckpt


def read_without_data(path: str) -> Any:
    """The object in a local checkpoint file with its tensors on the ``meta`` device: of a zip archive
    (what ``torch.save`` writes) only ``data.pkl`` is read, through the checked unpickler, each storage
    a placeholder of its size, so that keys, shapes and plain values can be judged without reading or
    memory-mapping the tensors' data (a file truncated while mapped would end the process with
    SIGBUS). A legacy file, whose data lies between its pickles, is read whole. Errors as
    :func:`load_weights_only`'s."""
    with open(path, 'rb') as f:
        is_zip = torch.serialization._is_zipfile(f)  # as torch.load decides, by the first bytes
    if not is_zip:
        return load_weights_only(path)
    try:
        return _unpickle_without_data(path)
    except Exception as exc:
        raise CheckpointError(f'cannot read checkpoint {path}: {_reason(exc)}') from exc


def _unpickle_without_data(path: str) -> Any:
    with open(path, 'rb') as f:
        size = os.fstat(f.fileno()).st_size
        records = check_archive(f, size)
        f.seek(0)
        with torch.serialization._open_zipfile_reader(f) as archive:
            check_torch_view(archive, records)
            pickled = archive.get_record('data.pkl')
    placeholders = {}

    def placeholder(pid: tuple) -> torch.storage.TypedStorage:
        storage_type, key, _, numel = pid[1:5]  # checked by the unpickler before this is called
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        if key not in placeholders:
            empty = torch.empty(numel * torch._utils._element_size(dtype), dtype=torch.uint8, device='meta')
            placeholders[key] = torch.storage.TypedStorage(wrap_storage=empty.untyped_storage(), dtype=dtype,
                                                           _internal=True)
        return placeholders[key]

    class Unpickler(_PickleModule(Budget(size)).Unpickler):
        def find_class(self, module: str, name: str) -> Any:  # storage names as torch's reader maps them
            if type(name) is str and 'Storage' in name:
                try:
                    return torch.serialization.StorageType(name)
                except KeyError:
                    pass
            return super().find_class('torch._tensor' if module == 'torch.tensor' else module, name)

    unpickler = Unpickler(io.BytesIO(pickled), encoding='utf-8')
    unpickler.persistent_load = placeholder
    return unpickler.load()


def _reason(exc: BaseException) -> str:
    """The reason a message gives for ``exc``: a refusal's, or its first line, bounded."""
    reason = refusal_reason(exc)
    if reason is None:
        text = str(exc).strip()
        reason = text.splitlines()[0][:MAX_REASON] if text else type(exc).__name__
    return reason


class AtomicLocalBackend(LocalBackend):
    """A local file backend whose writes are all-or-nothing (write, fsync, rename)."""

    def put(self, obj: bytes, filepath) -> None:
        filepath = str(filepath)
        try:
            write_bytes(filepath, obj, replace_link=True)  # a link planted at the name is replaced
        except OSError as exc:
            raise CheckpointError(f'cannot write {filepath}: {exc.strerror or exc} (the checkpoints '
                                  f'written before are untouched)') from exc

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        self.put(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend, force=True)
ATOMIC_WRITES = dict(backend='atomic_local')  # the ``backend_args`` of a checkpoint written through it


def write_checkpoint(obj: Any, path: str) -> None:
    """``torch.save`` of ``obj`` to ``path`` through :class:`AtomicLocalBackend` (never a half-written
    file under its name, never through a link planted beside it)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    AtomicLocalBackend().put(buffer.getvalue(), path)
