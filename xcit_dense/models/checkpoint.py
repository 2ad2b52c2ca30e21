"""Mapping XCiT checkpoints onto the backbone's key layout, and loading them into it strictly.

Three layouts are understood:
- the authors' ImageNet files: weights under ``'model'``, ``pos_embeder.*`` naming, plus
  class-attention, final-norm and head keys the dense backbone does not use;
- timm state dicts: the same keys at top level, ``pos_embed.*`` naming;
- this toolkit's checkpoints: ``'state_dict'`` with ``backbone.``-prefixed keys.
Files are read by ``xcit_dense.checkpoint.read_checkpoint`` (weights only, never code).
"""
import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..checkpoint import CheckpointError, diff_keys, read_checkpoint

# keys of the classification model that the dense backbone has no use for
CLASSIFICATION_ONLY = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
StateDict = Dict[str, torch.Tensor]


def to_backbone_layout(ckpt: dict) -> Tuple[StateDict, List[str]]:
    """Map any known layout to the backbone's keys; returns (state dict, ignored keys)."""
    if 'state_dict' in ckpt and isinstance(ckpt['state_dict'], dict):
        ckpt = ckpt['state_dict']
    elif 'model' in ckpt and isinstance(ckpt['model'], dict):
        ckpt = ckpt['model']
    tensors = {k: v for k, v in ckpt.items() if isinstance(v, torch.Tensor)}
    has_prefix = any(k.startswith('backbone.') for k in tensors)
    out: StateDict = OrderedDict()
    ignored = sorted(k for k in ckpt if k not in tensors)
    for key, value in tensors.items():
        if has_prefix:
            if not key.startswith('backbone.'):
                ignored.append(key)  # necks and heads of a whole detector/segmentor
                continue
            key = key[len('backbone.'):]
        if key.startswith('module.'):
            key = key[len('module.'):]
        if key.startswith(CLASSIFICATION_ONLY):
            ignored.append(key)
            continue
        if key.startswith('pos_embeder.'):
            key = 'pos_embed.' + key[len('pos_embeder.'):]
        out[key] = value
    return out, ignored


def _summarise(keys: Sequence[str], limit: int = 12) -> str:
    keys = list(keys)
    if len(keys) <= limit:
        return ', '.join(keys) or 'none'
    return ', '.join(keys[:limit]) + f', ... ({len(keys)} in all)'


def load_backbone_weights(model: nn.Module, checkpoint: str, allowed_missing: Sequence[str] = (),
                          logger: logging.Logger = logging.getLogger(__name__),
                          sha256: Optional[str] = None) -> None:
    """Load ``checkpoint`` into ``model`` strictly, except for keys under ``allowed_missing``;
    ``sha256`` (or a prefix of it) pins the file's digest.

    Raises ``CheckpointError`` naming the keys when a weight is missing, unexpected or of
    another shape (a checkpoint of another architecture), and logs one summary line.
    """
    state, ignored = to_backbone_layout(read_checkpoint(checkpoint, sha256=sha256))
    diff = diff_keys(model.state_dict(), state)
    tolerated = [k for k in diff.missing
                 if k.startswith(tuple(allowed_missing)) or k.endswith('num_batches_tracked')]
    not_loaded = [k for k in diff.missing if k not in tolerated]
    unexpected = diff.unexpected
    mismatched = [f'{k}: checkpoint {saved} vs model {own}' for k, saved, own in diff.mismatched]
    problems = []
    if not_loaded:
        problems.append(f'weights missing from the checkpoint: {_summarise(not_loaded)}')
    if unexpected:
        problems.append(f'weights the model does not have: {_summarise(unexpected)}')
    if mismatched:
        problems.append(f'shape mismatches: {_summarise(mismatched, 6)}')
    if problems:
        raise CheckpointError(f'checkpoint {checkpoint} does not fit {type(model).__name__}'
                              f'({getattr(model, "arch", "")}, patch {getattr(model, "patch_size", "?")}) '
                              f'- is it another architecture? ' + '; '.join(problems))
    model.load_state_dict(state, strict=False)
    logger.info(f'Loaded {len(state)} tensors from {checkpoint}; left at initial values: '
                f'{_summarise(tolerated)}; ignored: {_summarise(sorted(ignored))}')
