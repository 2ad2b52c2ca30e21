"""Checkpoint files: safe reading, atomic writing, choosing the one to resume from, diffing key sets.

Both the backbone's pretrained weights (models/checkpoint.py maps their layouts) and the training
checkpoints go through here. Files are read with ``torch.load(weights_only=True)``, so a checkpoint
can never run code; MMEngine's checkpoints pickle a few non-tensor objects (its ``HistoryBuffer``,
numpy arrays and scalars), and exactly those types are allowed. Writes go to a temporary file that
is renamed into place, so a kill while saving never leaves a truncated checkpoint under a
checkpoint's name.
"""
import codecs
import glob
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer, print_log
from torch import nn

# numpy dtype classes that appear in MMEngine's logged scalars
_NUMPY_DTYPES = [type(np.dtype(code)) for code in ('f2', 'f4', 'f8', 'i1', 'i2', 'i4', 'i8',
                                                    'u1', 'u2', 'u4', 'u8', 'b1')]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit the model."""


def read_checkpoint(path: str, map_location: Union[str, torch.device] = 'cpu') -> dict:
    """Load a checkpoint file or URL with ``weights_only=True``; errors name the source."""
    if path.startswith(('http://', 'https://')):
        hub_dir = os.path.join(torch.hub.get_dir(), 'checkpoints')
        os.makedirs(hub_dir, exist_ok=True)
        local = os.path.join(hub_dir, os.path.basename(path.split('?')[0]))
        if not os.path.isfile(local):
            try:
                torch.hub.download_url_to_file(path, local, progress=True)
            except Exception as exc:  # network errors come in many types
                raise CheckpointError(f'cannot download checkpoint {path}: {exc}. Download it '
                                      f'elsewhere and point the config at the local file.') from exc
        path = local
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path}')
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if 'Weights only load failed' in str(exc) or 'Unsupported global' in str(exc):
            reason = ('it holds Python objects other than tensors and plain containers, which '
                      'are refused because unpickling them could run code')
        raise CheckpointError(f'cannot read checkpoint {path}: {reason}') from exc
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'checkpoint {path} holds a {type(ckpt).__name__}, not a dict of tensors')
    return ckpt


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read MMEngine's checkpoints, and nothing more.

    ``getattr`` is needed for numpy's dtype pickles; the weights-only unpickler still refuses
    to call anything that is not on the allow-list.
    """
    torch.serialization.add_safe_globals([
        HistoryBuffer, np.ndarray, np.dtype, np._core.multiarray._reconstruct,
        np._core.multiarray.scalar, codecs.encode, getattr, *_NUMPY_DTYPES])


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


def check_matches_model(model: nn.Module, checkpoint: str) -> None:
    """Refuse to resume ``model`` from a checkpoint of another model, naming the keys."""
    state = read_checkpoint(checkpoint).get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
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
        tmp = f'{filepath}.tmp-{os.getpid()}'
        try:
            with open(tmp, 'wb') as f:
                f.write(obj)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, filepath)
        except OSError as exc:
            raise CheckpointError(f'cannot write {filepath}: {exc.strerror or exc} (the checkpoints '
                                  f'written before are untouched)') from exc
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        self.put(obj.encode(encoding), filepath)


register_backend('atomic_local', AtomicLocalBackend, force=True)


def write_pointer(work_dir: str, checkpoint: str) -> None:
    """Point ``last_checkpoint`` (what MMEngine's auto-resume reads) at ``checkpoint``, atomically."""
    AtomicLocalBackend().put_text(checkpoint, os.path.join(work_dir, 'last_checkpoint'))


CHECKPOINT_NAME = re.compile(r'(?:iter|epoch)_(\d+)\.pth$')


def _candidates(work_dir: str) -> List[str]:
    """Training checkpoints of a work dir, the pointer's target first, then newest to oldest."""
    files = [f for f in glob.glob(os.path.join(work_dir, '*.pth')) if CHECKPOINT_NAME.search(f)]
    files.sort(key=lambda p: (int(CHECKPOINT_NAME.search(p).group(1)), os.path.getmtime(p)),
               reverse=True)
    pointer = os.path.join(work_dir, 'last_checkpoint')
    if os.path.isfile(pointer):
        target = open(pointer).read().strip()
        if target in files:
            files.remove(target)
            files.insert(0, target)
    return files


def find_resumable_checkpoint(work_dir: str) -> Optional[str]:
    """The newest checkpoint of ``work_dir`` that loads; None when there is none at all.

    Unreadable ones (truncated, empty) are reported and skipped; if checkpoints exist but none
    loads, this raises rather than letting the run start from scratch.
    """
    candidates = _candidates(work_dir)
    problems = []
    for path in candidates:
        try:
            read_checkpoint(path)
        except (CheckpointError, FileNotFoundError) as exc:
            problems.append(str(exc))
            print_log(f'{exc}; trying an older checkpoint', logger='current', level=logging.WARNING)
            continue
        if problems:
            print_log(f'resuming from {path}, the newest checkpoint that loads', logger='current',
                      level=logging.WARNING)
        return path
    if problems:
        raise CheckpointError(f'no checkpoint in {work_dir} can be loaded: ' + '; '.join(problems))
    return None
