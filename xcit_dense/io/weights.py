"""XCiT weights: their layouts mapped onto the backbone's and the released models' keys, loaded
strictly, and checks that a checkpoint fits a model, each naming what does not fit.

Three layouts are understood:
- the authors' ImageNet files: weights under ``'model'``, ``pos_embeder.*`` naming, plus
  class-attention, final-norm and head keys the dense backbone does not use;
- timm state dicts: the same keys at top level, ``pos_embed.*`` naming;
- this toolkit's checkpoints: ``'state_dict'`` with ``backbone.``-prefixed keys.
Files are read by ``xcit_dense.io.checkpoint.read_checkpoint_file`` (weights only, never code);
:func:`read_checkpoint` gives their contents in this toolkit's layout, which holds no config text
(:func:`without_config_text`).
"""
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .checkpoint import CheckpointError, read_checkpoint_file
from .checkpoint_schema import SchemaError, block_index, class_names, palette

# keys of the classification model that the dense backbone has no use for
CLASSIFICATION_ONLY = ('cls_token', 'cls_attn_blocks.', 'norm.', 'head.')
StateDict = Dict[str, torch.Tensor]


# Where MMEngine looks for a config's text in a checkpoint, and runs what it finds as Python
# (``Config.fromstring``): ``Runner.resume`` (and ``FlexibleRunner``'s) reads meta['config'], the
# inferencers given weights and no config (``BaseInferencer``) the message hub's runtime_info['cfg'],
# else meta['cfg']; a resume copies the message hub's runtime info into the run's, whose later
# checkpoints would then carry it.
CONFIG_TEXTS = (('meta', 'config'), ('meta', 'cfg'), ('message_hub', 'runtime_info', 'cfg'))


def without_config_text(ckpt: dict) -> dict:
    """``ckpt`` without the config texts of :data:`CONFIG_TEXTS`, so that no string read from a
    checkpoint reaches MMEngine's ``Config`` (the dicts on their way are copied, ``ckpt`` is left as
    it is). The run's own checkpoints still hold its config: MMEngine writes the running config's text
    into what it saves (``meta['cfg']``, the runtime info's ``'cfg'``), never a text it read."""
    out = dict(ckpt)
    for *parents, key in CONFIG_TEXTS:
        node = out
        for name in parents:
            if not isinstance(node.get(name), dict):
                break
            node[name] = dict(node[name])
            node = node[name]
        else:
            node.pop(key, None)
    return out


def to_toolkit_layout(ckpt: Any) -> Any:
    """A checkpoint's contents as this toolkit hands them on (to its runner, MMEngine's readers and
    the stock tools): a released model's file (the authors' key names) renamed to this toolkit's
    names, and no config text in any (:func:`without_config_text`); anything but a dict as it is."""
    return without_config_text(from_released_layout(ckpt)[0]) if isinstance(ckpt, dict) else ckpt


def read_checkpoint(path: str, map_location: Union[str, torch.device] = 'cpu',
                    sha256: Optional[str] = None) -> dict:
    """Load a checkpoint file or URL (download.py: https, digests), weights only, in this toolkit's
    layout; errors name it."""
    ckpt = read_checkpoint_file(path, map_location, sha256)
    try:
        return to_toolkit_layout(ckpt)
    except SchemaError as exc:
        raise SchemaError(f'checkpoint {path}: {exc}') from None


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


def summarise_keys(keys: Sequence[str], limit: int = 12) -> str:
    """The first ``limit`` keys and their count, for one line of a log or an error ('none' if empty)."""
    keys = list(keys)
    if len(keys) <= limit:
        return ', '.join(keys) or 'none'
    return ', '.join(keys[:limit]) + f', ... ({len(keys)} in all)'


def fit_problems(missing: Sequence[str], unexpected: Sequence[str],
                 mismatched: Sequence[Tuple[str, tuple, tuple]], mismatch_label: str = 'shape mismatches') -> List[str]:
    """What keeps a checkpoint's state dict from fitting a model, one phrase per kind (none: it fits);
    ``mismatched`` holds (key, checkpoint shape, model shape), as ``diff_keys`` gives them."""
    problems = []
    if missing:
        problems.append(f'weights missing from the checkpoint: {summarise_keys(missing)}')
    if unexpected:
        problems.append(f'weights the model does not have: {summarise_keys(unexpected)}')
    if mismatched:
        shapes = [f'{k}: checkpoint {saved} vs model {own}' for k, saved, own in mismatched]
        problems.append(f'{mismatch_label}: {summarise_keys(shapes, 6)}')
    return problems


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
    problems = fit_problems([k for k in diff.missing if k not in tolerated], diff.unexpected, diff.mismatched)
    if problems:
        raise CheckpointError(f'checkpoint {checkpoint} does not fit {type(model).__name__}'
                              f'({getattr(model, "arch", "")}, patch {getattr(model, "patch_size", "?")}) '
                              f'- is it another architecture? ' + '; '.join(problems))
    model.load_state_dict(state, strict=False)
    logger.info(f'Loaded {len(state)} tensors from {checkpoint}; left at initial values: '
                f'{summarise_keys(tolerated)}; ignored: {summarise_keys(sorted(ignored))}')


# --- the authors' released detectors and segmentors (mmcv-full 1.3, mmdet 2.11, mmseg 0.11) ------------
# Their backbone names the positional encoding ``pos_embeder``; every other key (the backbone's
# blocks and fpn1-fpn4, the FPN necks, RPN / RoI / mask heads, FPN / UPer / FCN heads) has the same
# name and shape in mmdet 3.3 and mmseg 1.2 (tests/integration/test_released_checkpoints.py checks each).
RELEASED_RENAMES = (('backbone.pos_embeder.', 'backbone.pos_embed.'),)
# what only a training run of theirs needs: apex's loss scaler and the optimizer, never applied here
RELEASED_TRAINING_ONLY = ('optimizer', 'amp')
# layers whose shape follows the number of classes: left initialised when fine-tuning on other classes
CLASS_DEPENDENT = ('fc_cls', 'fc_reg', 'conv_logits', 'conv_seg')


def is_released_layout(ckpt: dict) -> bool:
    """Whether ``ckpt`` is one of the authors' released dense models (``backbone.pos_embeder.*`` keys)."""
    state = ckpt.get('state_dict')
    return isinstance(state, dict) and any(k.startswith(RELEASED_RENAMES[0][0]) for k in state)


def from_released_layout(ckpt: dict) -> Tuple[dict, List[Tuple[str, str]]]:
    """A released file's dict in this toolkit's layout, and the (old, new) keys it renamed.

    The state dict's keys are renamed, ``meta['CLASSES']`` / ``['PALETTE']`` become the
    ``dataset_meta`` that mmdet's and mmseg's tools and inferencers read (names and colours checked:
    SchemaError otherwise), and the optimizer and amp entries are dropped. A file in another layout comes
    back unchanged.
    """
    if not is_released_layout(ckpt):
        return ckpt, []
    state: StateDict = OrderedDict()
    renamed = []
    for key, value in ckpt['state_dict'].items():
        new = next((to + key[len(old):] for old, to in RELEASED_RENAMES if key.startswith(old)), key)
        if new != key:
            renamed.append((key, new))
        state[new] = value
    meta = dict(ckpt.get('meta') or {})
    if 'CLASSES' in meta and 'dataset_meta' not in meta:
        dataset_meta = dict(classes=class_names(meta['CLASSES'], "its meta's CLASSES"))
        if meta.get('PALETTE') is not None:
            dataset_meta['palette'] = palette(meta['PALETTE'], "its meta's PALETTE")
        meta['dataset_meta'] = dataset_meta
    out = {k: v for k, v in ckpt.items() if k not in RELEASED_TRAINING_ONLY}
    out.update(state_dict=state, meta=meta)
    return out, renamed


def backbone_signature(state: Dict[str, torch.Tensor], prefix: str = 'backbone.') -> Optional[str]:
    """'patch P, D dims, N blocks' of the XCiT backbone in a state dict, read from its keys."""
    proj = f'{prefix}pos_embed.token_projection.weight'
    if proj not in state:
        return None
    embed, blocks = f'{prefix}patch_embed.proj.', f'{prefix}blocks.'  # indices checked: SchemaError
    stages = {block_index(k, len(embed)) for k in state if k.startswith(embed) and k.endswith('.0.weight')}
    depth = 1 + max((block_index(k, len(blocks)) for k in state if k.startswith(blocks)), default=-1)
    # a convolution every other module: 4 (stride 2 each) for patch 16, 3 for patch 8
    return f'patch {2 ** len(stages)}, {state[proj].shape[0]} dims, {depth} blocks'


def model_signature(backbone: nn.Module) -> str:
    """The same description of a built XCiT backbone."""
    return f'patch {backbone.patch_size}, {backbone.embed_dims} dims, {len(backbone.blocks)} blocks'


def backbone_mismatch(state: Dict[str, torch.Tensor], backbone: Optional[nn.Module],
                      prefix: str = 'backbone.') -> Optional[Tuple[str, str]]:
    """(the state dict's, the backbone's) descriptions where both are XCiT backbones and differ."""
    found = backbone_signature(state, prefix)
    if found is None or not hasattr(backbone, 'patch_size'):
        return None
    own = model_signature(backbone)
    return (found, own) if found != own else None


def check_backbone_fits(model: nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """Refuse a checkpoint whose XCiT backbone differs from the model's, naming both."""
    try:
        mismatch = backbone_mismatch(state, getattr(model.module if hasattr(model, 'module') else model,
                                                    'backbone', None))
    except SchemaError as exc:
        raise SchemaError(f'{source}: {exc}') from None
    if mismatch:
        raise CheckpointError(f'{source} holds an XCiT backbone of {mismatch[0]}, but the config builds one of '
                              f'{mismatch[1]}: pass the config of that model (configs/xcit/, patch size in its name)')


def check_finite(state: Dict[str, Any], source: str) -> None:
    """Refuse a state dict whose floating-point tensors hold a NaN or an infinity, naming them: such
    weights load without a word and predict nothing (all-NaN weights gave one class everywhere)."""
    bad = [key for key, value in state.items() if isinstance(value, torch.Tensor)
           and (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all())]
    if bad:
        raise CheckpointError(f'{source} holds NaN or infinite weights in {summarise_keys(bad)}: refused '
                              f'(a run that diverged, or a damaged file)')


def check_matches_model(model: nn.Module, checkpoint: str, loaded: Optional[dict] = None) -> None:
    """Refuse a checkpoint of another model for ``model`` (resume, test, inference), naming the keys,
    or both backbones when its XCiT backbone differs (patch size, width, depth read from its keys),
    and one of NaN or infinite weights (:func:`check_finite`).
    ``loaded``: the checkpoint's contents when they are already read (not read again)."""
    state = (read_checkpoint(checkpoint) if loaded is None else loaded).get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    check_backbone_fits(model, state, checkpoint)
    diff = diff_keys((model.module if hasattr(model, 'module') else model).state_dict(), state)
    mismatched = [f'{k} {saved} vs {own}' for k, saved, own in diff.mismatched]
    if diff.missing or diff.unexpected or mismatched:
        def head(keys):
            return ', '.join(keys[:5]) + (f' ... ({len(keys)})' if len(keys) > 5 else '')
        raise CheckpointError(
            f'{checkpoint} was saved from a different model: missing {head(diff.missing) or "none"}; '
            f'unexpected {head(diff.unexpected) or "none"}; shape mismatches {head(mismatched) or "none"}')
    check_finite(state, checkpoint)


def check_finetune_fits(model: nn.Module, checkpoint: str, loaded: Optional[dict] = None) -> List[str]:
    """Check that ``checkpoint`` fits ``model`` but for the class-dependent layers; returns those.

    Fine-tuning on other classes (``load_from``) leaves exactly the layers of :data:`CLASS_DEPENDENT`
    whose shapes differ at their initial values; any other missing, unexpected or mis-shaped key, or
    a NaN or infinite weight (:func:`check_finite`), is a ``CheckpointError`` naming it.
    ``loaded``: the checkpoint's contents when they are already read (not read again).
    """
    state = (read_checkpoint(checkpoint) if loaded is None else loaded).get('state_dict')
    if not isinstance(state, dict):
        raise CheckpointError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    check_backbone_fits(model, state, checkpoint)
    own = (model.module if hasattr(model, 'module') else model).state_dict()
    diff = diff_keys(own, state)

    def class_dependent(key: str) -> bool:
        return any(part in CLASS_DEPENDENT for part in key.split('.'))
    reinitialised = [f'{k} (checkpoint {saved} vs model {shape})' for k, saved, shape in diff.mismatched
                     if class_dependent(k)]
    problems = fit_problems([k for k in diff.missing if not k.endswith('num_batches_tracked')], diff.unexpected,
                            [m for m in diff.mismatched if not class_dependent(m[0])],
                            'shape mismatches outside the class-dependent layers')
    if problems:
        raise CheckpointError(f'cannot fine-tune from {checkpoint}: ' + '; '.join(problems))
    check_finite(state, checkpoint)
    return reinitialised
