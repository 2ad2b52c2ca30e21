"""Drawing attention maps as PNG files: heat maps of d x d maps, maps overlaid on the image (written
through no link: io/output_files.py)."""
import os
from typing import Dict, List, Sequence, Tuple

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F

from ..io.output_files import writing
from .attention import XCAMaps

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_image(path: str, size: Tuple[int, int]) -> Tuple[np.ndarray, torch.Tensor]:
    """An image resized to (H, W): as RGB uint8 for drawing and as a normalised (1, 3, H, W) batch."""
    import mmcv
    rgb = mmcv.imresize(mmcv.imread(path, channel_order='rgb'), (size[1], size[0]))
    tensor = torch.from_numpy(rgb).float().div(255).permute(2, 0, 1)
    tensor = (tensor - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    return rgb, tensor[None]


def _overlay(ax, rgb: np.ndarray, grid_map: torch.Tensor, title: str) -> None:
    up = F.interpolate(grid_map[None, None].float(), size=rgb.shape[:2], mode='bilinear', align_corners=False)[0, 0]
    up = (up - up.min()) / (up.max() - up.min()).clamp_min(1e-12)
    ax.imshow(rgb)
    ax.imshow(up.numpy(), cmap='jet', alpha=0.5)
    ax.set_title(title, fontsize=8)
    ax.axis('off')


def _save(fig, path: str) -> str:
    fig.tight_layout()
    try:
        with writing(path) as written:  # a link at its name refused
            fig.savefig(written, dpi=100)
    finally:
        plt.close(fig)
    return path


def save_xca(maps: XCAMaps, rgb: np.ndarray, block: int, heads: Sequence[int], top_k: int,
             prefix: str) -> List[str]:
    """Per head: the d x d map as a heat map, and its top-k value channels over the image."""
    written = []
    for head in heads:
        fig, ax = plt.subplots(figsize=(5, 4))
        shown = ax.imshow(maps.attention[head].numpy(), cmap='viridis')
        fig.colorbar(shown, ax=ax)
        ax.set(title=f'block {block}, head {head}: XCA map', xlabel='value channel', ylabel='output channel')
        written.append(_save(fig, f'{prefix}_block{block}_head{head}_xca.png'))
        channels = maps.top_channels(head, top_k).tolist()
        fig, axes = plt.subplots(1, len(channels), figsize=(3 * len(channels), 3), squeeze=False)
        weights = maps.attention[head].sum(0)
        for ax, channel in zip(axes[0], channels):
            _overlay(ax, rgb, maps.values[head, channel], f'channel {channel} (weight {weights[channel]:.2f})')
        written.append(_save(fig, f'{prefix}_block{block}_head{head}_channels.png'))
    return written


def save_class_attention(maps: torch.Tensor, rgb: np.ndarray, prefix: str) -> List[str]:
    """One panel per class-attention layer and head, overlaid on the image."""
    layers, heads = maps.shape[:2]
    fig, axes = plt.subplots(layers, heads, figsize=(3 * heads, 3 * layers), squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            _overlay(axes[layer, head], rgb, maps[layer, head], f'class attention {layer}, head {head}')
    return [_save(fig, f'{prefix}_class_attention.png')]


def save_arrays(arrays: Dict[str, torch.Tensor], prefix: str) -> str:
    """The maps themselves, for analysis beyond the pictures."""
    path = f'{prefix}_maps.npz'
    with writing(path) as written:  # a link at its name refused
        np.savez(written, **{k: v.numpy() for k, v in arrays.items()})
    return path


def output_prefix(out_dir: str, image_path: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, os.path.splitext(os.path.basename(image_path))[0])
