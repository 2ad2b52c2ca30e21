"""Attention pictures of a checkpoint: a dense model's backbone, or an authors' ImageNet classifier."""
from typing import List, Optional, Sequence, Tuple

from mmengine.logging import print_log
from torch import nn

from ..io.weights import backbone_mismatch, diff_keys, read_checkpoint, summarise_keys, to_backbone_layout
from .attention import class_attention_maps, classifier_from_state, xca_maps
from .attention_plots import load_image, output_prefix, save_arrays, save_class_attention, save_xca


def load_model(config: str, checkpoint: str) -> Tuple[nn.Module, bool]:
    """(model, is_classifier): timm's classifier for a checkpoint with class-attention layers
    (``config`` is then unused), else the config's backbone with the checkpoint's weights."""
    ckpt = read_checkpoint(checkpoint)
    state = ckpt.get('model', ckpt.get('state_dict', ckpt))
    if any('cls_attn_blocks.' in k for k in state):
        return classifier_from_state(state), True
    from ..builder import build_model
    backbone = build_model(config, {'model.backbone.init_cfg': None}, init=False).backbone
    weights, _ = to_backbone_layout(ckpt)
    mismatch = backbone_mismatch(weights, backbone, prefix='')
    if mismatch:
        raise ValueError(f'checkpoint {checkpoint} holds an XCiT backbone of {mismatch[0]}, but {config} '
                         f'builds one of {mismatch[1]}')
    backbone.load_state_dict(weights, strict=False)
    missing = [k for k in diff_keys(backbone.state_dict(), weights).missing
               if not k.startswith('fpn') and not k.endswith('num_batches_tracked')]
    if missing:
        raise ValueError(f'checkpoint {checkpoint} lacks backbone weights: {summarise_keys(missing)}')
    return backbone.eval(), False


def visualise(config: str, checkpoint: str, images: Sequence[str], out_dir: str,
              blocks: Optional[Sequence[int]] = None, heads: Optional[Sequence[int]] = None,
              top_k: int = 4, size: Tuple[int, int] = (448, 448)) -> List[str]:
    """Write the pictures (and the maps as .npz) for every image; returns the files written."""
    model, is_classifier = load_model(config, checkpoint)
    depth = len(model.blocks)
    blocks = list(blocks) if blocks is not None else [depth - 1]
    num_heads = model.blocks[0].attn.num_heads
    heads = list(heads) if heads is not None else list(range(num_heads))
    bad = [b for b in blocks if not 0 <= b < depth] + [h for h in heads if not 0 <= h < num_heads]
    if bad:
        raise ValueError(f'blocks must be in 0..{depth - 1} and heads in 0..{num_heads - 1}, got {bad}')
    written: List[str] = []
    for path in images:
        rgb, batch = load_image(path, size)
        prefix = output_prefix(out_dir, path)
        maps = xca_maps(model, batch, blocks)
        arrays = {f'block{b}_attention': m.attention for b, m in maps.items()}
        arrays.update({f'block{b}_values': m.values for b, m in maps.items()})
        for block, block_maps in maps.items():
            written += save_xca(block_maps, rgb, block, heads, top_k, prefix)
        if is_classifier:
            arrays['class_attention'] = class_attention_maps(model, batch)
            written += save_class_attention(arrays['class_attention'], rgb, prefix)
        written.append(save_arrays(arrays, prefix))
    print_log(f'wrote {len(written)} files to {out_dir}', logger='current')
    return written
