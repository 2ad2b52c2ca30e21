"""Attention maps of XCiT models: cross-covariance (d x d) maps per block and head, the spatial
maps of the channels they weight most, and the class-attention maps of ImageNet classifiers.

The maps are read by forward hooks on the attention dropout (its input is the softmax map),
so the models run unchanged; timm's fused attention paths are switched off to expose it.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch
from torch import nn


@dataclass
class XCAMaps:
    """One XCA block's maps for one image: ``attention`` (heads, d, d), ``values`` (heads, d, Hp, Wp)."""

    attention: torch.Tensor
    values: torch.Tensor

    def top_channels(self, head: int, k: int) -> torch.Tensor:
        """The k value channels the head's attention weights most (largest column sums)."""
        return self.attention[head].sum(0).topk(min(k, self.attention.shape[-1])).indices


def _unfuse(model: nn.Module) -> None:
    for module in model.modules():
        if hasattr(module, 'fused_attn'):
            module.fused_attn = False


def _grid(model: nn.Module, image: torch.Tensor) -> tuple:
    patch_embed = model.patch_embed
    with torch.no_grad():
        out = patch_embed(image)
    grid = out[1] if isinstance(out, tuple) else out.shape[-2:]
    return int(grid[0]), int(grid[1])


def _forward_once(model: nn.Module, image: torch.Tensor, handles: list) -> None:
    """One forward pass without gradients for the hooks in ``handles``, removed afterwards (also on error)."""
    try:
        with torch.no_grad():
            model(image)
    finally:
        for handle in handles:
            handle.remove()


def xca_maps(model: nn.Module, image: torch.Tensor, blocks: Sequence[int]) -> Dict[int, XCAMaps]:
    """Run ``model`` (this toolkit's XCiT or timm's) on one (1, 3, H, W) image; maps of ``blocks``."""
    _unfuse(model)
    height, width = _grid(model, image)
    captured: Dict[int, dict] = {i: {} for i in blocks}
    handles = []
    for i in blocks:
        attn = model.blocks[i].attn
        handles.append(attn.attn_drop.register_forward_hook(
            lambda m, args, out, i=i: captured[i].__setitem__('attention', args[0][0].detach())))
        handles.append(attn.qkv.register_forward_hook(
            lambda m, args, out, i=i, heads=attn.num_heads: captured[i].__setitem__(
                'values', out[0, :, out.shape[-1] * 2 // 3:].detach().reshape(height, width, heads, -1))))
    _forward_once(model, image, handles)
    missing = [i for i in blocks if len(captured[i]) < 2]
    if missing:
        raise ValueError(f'blocks {missing} did not run (the backbone stops after its last out index)')
    return {i: XCAMaps(c['attention'], c['values'].permute(2, 3, 0, 1)) for i, c in captured.items()}


def class_attention_maps(model: nn.Module, image: torch.Tensor) -> torch.Tensor:
    """Class-token attention over the patches of timm's XCiT: (layers, heads, Hp, Wp)."""
    _unfuse(model)
    height, width = _grid(model, image)
    maps: List[torch.Tensor] = []
    handles = [block.attn.attn_drop.register_forward_hook(
        lambda m, args, out: maps.append(args[0][0, :, 0, 1:].detach())) for block in model.cls_attn_blocks]
    _forward_once(model, image, handles)
    return torch.stack(maps).reshape(len(maps), -1, height, width)


def classifier_from_state(state: Dict[str, torch.Tensor]) -> nn.Module:
    """timm's XCiT classifier with the architecture a state dict (authors' or timm's) implies, loaded."""
    from timm.models.xcit import Xcit, checkpoint_filter_fn
    state = {k[len('module.'):] if k.startswith('module.') else k: v for k, v in state.items()}
    dims = state['cls_token'].shape[-1]
    convs = {k.split('.')[2] for k in state if k.startswith('patch_embed.proj.') and k.endswith('0.weight')}
    model = Xcit(
        patch_size=16 if len(convs) == 4 else 8, embed_dim=dims,
        depth=len({k.split('.')[1] for k in state if k.startswith('blocks.')}),
        num_heads=state['blocks.0.attn.temperature'].shape[0],
        mlp_ratio=state['blocks.0.mlp.fc1.weight'].shape[0] / dims,
        cls_attn_layers=len({k.split('.')[1] for k in state if k.startswith('cls_attn_blocks.')}),
        num_classes=state['head.weight'].shape[0])
    model.load_state_dict(checkpoint_filter_fn(dict(state), model))
    return model.eval()
