"""Training checkpoints: safe loading, atomic writing, and choosing the one to resume from.

MMEngine's checkpoints pickle a few non-tensor objects (its ``HistoryBuffer``, numpy arrays and
scalars). Instead of turning ``weights_only`` off, exactly those types are allowed, so a crafted
file still cannot run code. Writes go to a temporary file that is renamed into place, so a kill
while saving never leaves a truncated checkpoint under a checkpoint's name.
"""
import codecs
import glob
import logging
import os
import re
from typing import List, Optional

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer, print_log
from torch import nn

from ..models.checkpoint import CheckpointError, read_checkpoint

# numpy dtype classes that appear in MMEngine's logged scalars
_NUMPY_DTYPES = [type(np.dtype(code)) for code in ('f2', 'f4', 'f8', 'i1', 'i2', 'i4', 'i8',
                                                    'u1', 'u2', 'u4', 'u8', 'b1')]


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read MMEngine's checkpoints, and nothing more.

    ``getattr`` is needed for numpy's dtype pickles; the weights-only unpickler still refuses
    to call anything that is not on the allow-list.
    """
    torch.serialization.add_safe_globals([
        HistoryBuffer, np.ndarray, np.dtype, np._core.multiarray._reconstruct,
        np._core.multiarray.scalar, codecs.encode, getattr, *_NUMPY_DTYPES])


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


def check_matches_model(model: nn.Module, checkpoint: str) -> None:
    """Refuse to resume ``model`` from a checkpoint of another model, naming the keys."""
    state = read_checkpoint(checkpoint).get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    own = (model.module if hasattr(model, 'module') else model).state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [f'{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}'
                  for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        def head(keys):
            return ', '.join(keys[:5]) + (f' ... ({len(keys)})' if len(keys) > 5 else '')
        raise CheckpointError(
            f'{checkpoint} was saved from a different model: missing {head(missing) or "none"}; '
            f'unexpected {head(unexpected) or "none"}; shape mismatches {head(mismatched) or "none"}')
