"""Shared fixtures: tiny XCiT models and timm reference models on shared weights."""
from pathlib import Path

import pytest
import torch

import xcit_dense  # noqa: F401  (registers XCiT)

torch.set_num_threads(2)


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every float parameter and buffer random values, so that no weight goes untested.

    Layer scales get values of order 0.1-0.5 (not the presets' 1e-5), BN statistics are
    non-trivial, so a wrong mapping of any tensor shows in the outputs.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if name.endswith('running_var'):
                tensor.copy_(0.5 + noise.abs())
            elif name.split('.')[-1].startswith('gamma') or name.endswith('temperature'):
                tensor.copy_(0.3 + 0.1 * noise)
            elif name.endswith(('norm1.weight', 'norm2.weight', 'norm3.weight')) or \
                    name.endswith('.1.weight') or name.endswith('bn.weight'):
                tensor.copy_(1.0 + 0.1 * noise)
            else:
                tensor.copy_(0.02 * noise)
    return module


@pytest.fixture
def tiny_xcit():
    """A 4-block, 64-channel XCiT: small enough for every unit test."""
    def build(**kwargs):
        cfg = dict(arch='tiny_12', embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
        cfg.update(kwargs)
        return xcit_dense.XCiT(**cfg)
    return build


ROOT = Path(__file__).resolve().parents[1]


def tiny_seg_config(tmp_path: Path, data_root: Path, **overrides) -> Path:
    """A config that inherits the real Semantic FPN XCiT-T12/16 config, shrunk for a CPU test.

    No random augmentation, dropout, drop path or batch statistics (heads without norm, the
    backbone's BN in eval mode): the loss is then a plain per-image mean.
    """
    classes = ('background', 'rectangle', 'ellipse', 'triangle')
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), dict(type='PackSegInputs')]
    dataset = dict(type='BaseSegDataset', data_root=str(data_root), img_suffix='.jpg', seg_map_suffix='.png',
                   metainfo=dict(classes=classes), pipeline=pipeline)
    cfg = {
        '_base_': [str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')],
        'model': dict(
            data_preprocessor=dict(size=(64, 64)),
            backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), norm_eval=True,
                          init_cfg=None),
            neck=dict(in_channels=[64] * 4, out_channels=32),
            decode_head=dict(in_channels=[32] * 4, channels=16, num_classes=4, dropout_ratio=0.0,
                             norm_cfg=None)),
        'train_dataloader': dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            sampler=dict(type='InfiniteSampler', shuffle=False),
            dataset=dict(dataset, data_prefix=dict(img_path='images/training',
                                                   seg_map_path='annotations/training'))),
        'val_dataloader': dict(
            num_workers=0, persistent_workers=False,
            dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                                   seg_map_path='annotations/validation'))),
        'test_dataloader': dict(
            num_workers=0, persistent_workers=False,
            dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                                   seg_map_path='annotations/validation'))),
        'train_cfg': dict(max_iters=4, val_interval=4),
        'param_scheduler': [],
        'default_hooks': dict(checkpoint=dict(interval=4), logger=dict(interval=1),
                              visualization=dict(draw=False)),
        'randomness': dict(seed=0, deterministic=True),
        'env_cfg': dict(cudnn_benchmark=False),
    }
    cfg.update(overrides)
    path = tmp_path / 'tiny_sem_fpn.py'
    path.write_text('\n'.join(f'{k} = {v!r}' for k, v in cfg.items()) + '\n')
    return path


@pytest.fixture(scope='session')
def seg_data(tmp_path_factory) -> Path:
    """Eight training and four validation images in the ADE20K layout."""
    from xcit_dense.datasets.synthetic import write_segmentation_set
    root = tmp_path_factory.mktemp('seg_data')
    write_segmentation_set(root, 'training', 8, size=(64, 64), seed=0)
    write_segmentation_set(root, 'validation', 4, size=(64, 64), seed=1)
    return root
