"""Reading XCiT checkpoints safely and mapping them onto the backbone's key layout.

Three layouts are understood:
- the authors' ImageNet files: weights under ``'model'``, ``pos_embeder.*`` naming, plus
  class-attention, final-norm and head keys the dense backbone does not use;
- timm state dicts: the same keys at top level, ``pos_embed.*`` naming;
- this toolkit's checkpoints: ``'state_dict'`` with ``backbone.``-prefixed keys.
Files are read with ``torch.load(weights_only=True)``, so a checkpoint can never run code.
"""
import logging
import os
from collections import OrderedDict
from typing import Dict, List, Sequence, Tuple, Union

import torch
from torch import nn

# keys of the classification model that the dense backbone has no use for
CLASSIFICATION_ONLY = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
StateDict = Dict[str, torch.Tensor]


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
                          logger: logging.Logger = logging.getLogger(__name__)) -> None:
    """Load ``checkpoint`` into ``model`` strictly, except for keys under ``allowed_missing``.

    Raises ``CheckpointError`` naming the keys when a weight is missing, unexpected or of
    another shape (a checkpoint of another architecture), and logs one summary line.
    """
    state, ignored = to_backbone_layout(read_checkpoint(checkpoint))
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    tolerated = [k for k in missing
                 if k.startswith(tuple(allowed_missing)) or k.endswith('num_batches_tracked')]
    not_loaded = [k for k in missing if k not in tolerated]
    unexpected = [k for k in state if k not in own]
    mismatched = [f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                  for k in state if k in own and state[k].shape != own[k].shape]
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
