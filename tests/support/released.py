"""The authors' released dense checkpoints, rebuilt at tiny widths for the tests.

``manifests/xcit_released_keys.json`` is the manifest: for each task and patch size, the key names and
shapes of a released file's ``state_dict`` at the widths of :func:`tiny_config` (backbone from the
authors' detection/backbone/xcit.py, necks and heads from mmdet 2.11 / mmseg 0.11). From it,
:func:`released_file` writes a file as mmcv-full 1.3 saved them, every tensor with its own random
values, and :func:`toolkit_twin` writes the same weights in this toolkit's layout without the code
under test: timm's key filter for the backbone, :data:`HEAD_KEYS` for the rest.
"""
import json
import time
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from helpers import ROOT

MANIFEST = Path(__file__).resolve().parent / 'manifests' / 'xcit_released_keys.json'
SHAPES = ('rectangle', 'ellipse', 'triangle')
SEG_CLASSES = ('background', *SHAPES)
PALETTE = [[0, 0, 0], [220, 20, 60], [0, 130, 200], [60, 180, 75]]

# mmdet 2.11 / mmseg 0.11 module prefix -> mmdet 3 / mmseg 1 prefix (the same: their names are unchanged)
HEAD_KEYS = {
    'neck.lateral_convs.': 'neck.lateral_convs.', 'neck.fpn_convs.': 'neck.fpn_convs.',
    'rpn_head.rpn_conv.': 'rpn_head.rpn_conv.', 'rpn_head.rpn_cls.': 'rpn_head.rpn_cls.',
    'rpn_head.rpn_reg.': 'rpn_head.rpn_reg.',
    'roi_head.bbox_head.shared_fcs.': 'roi_head.bbox_head.shared_fcs.',
    'roi_head.bbox_head.fc_cls.': 'roi_head.bbox_head.fc_cls.',
    'roi_head.bbox_head.fc_reg.': 'roi_head.bbox_head.fc_reg.',
    'roi_head.mask_head.convs.': 'roi_head.mask_head.convs.',
    'roi_head.mask_head.upsample.': 'roi_head.mask_head.upsample.',
    'roi_head.mask_head.conv_logits.': 'roi_head.mask_head.conv_logits.',
    'decode_head.scale_heads.': 'decode_head.scale_heads.',
    'decode_head.psp_modules.': 'decode_head.psp_modules.',
    'decode_head.bottleneck.': 'decode_head.bottleneck.',
    'decode_head.lateral_convs.': 'decode_head.lateral_convs.',
    'decode_head.fpn_convs.': 'decode_head.fpn_convs.',
    'decode_head.fpn_bottleneck.': 'decode_head.fpn_bottleneck.',
    'decode_head.conv_seg.': 'decode_head.conv_seg.',
    'auxiliary_head.convs.': 'auxiliary_head.convs.',
    'auxiliary_head.conv_seg.': 'auxiliary_head.conv_seg.',
}
BACKBONE = dict(arch='tiny_12', embed_dims=32, depth=4, num_heads=4, out_indices=(0, 1, 2, 3),
                norm_cfg=dict(type='BN', requires_grad=True), init_cfg=None)
CONFIGS = {
    'mask_rcnn': 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py',
    'sem_fpn': 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py',
    'upernet': 'configs/demo/upernet_xcit_tiny_12_p16_demo.py',
}
_SEG_DATA = dict(type='BaseSegDataset', img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=False,
                 metainfo=dict(classes=SEG_CLASSES, palette=PALETTE),
                 data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                 pipeline=[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
                           dict(type='PackSegInputs')])


def _heads(task: str, num_classes: int) -> dict:
    """The necks and heads at the manifest's widths (``num_classes`` objects, or segments)."""
    if task == 'mask_rcnn':
        return dict(neck=dict(in_channels=[32] * 4, out_channels=16),
                    rpn_head=dict(in_channels=16, feat_channels=16),
                    roi_head=dict(bbox_roi_extractor=dict(out_channels=16),
                                  bbox_head=dict(in_channels=16, fc_out_channels=32, num_classes=num_classes),
                                  mask_roi_extractor=dict(out_channels=16),
                                  mask_head=dict(in_channels=16, conv_out_channels=16, num_classes=num_classes)))
    if task == 'sem_fpn':
        return dict(data_preprocessor=dict(size=(64, 64)), neck=dict(in_channels=[32] * 4, out_channels=16),
                    decode_head=dict(in_channels=[16] * 4, channels=8, num_classes=num_classes,
                                     norm_cfg=dict(type='BN', requires_grad=True)))
    return dict(data_preprocessor=dict(size=(64, 64)),
                decode_head=dict(in_channels=[32] * 4, channels=16, num_classes=num_classes),
                auxiliary_head=dict(in_channels=32, channels=8, num_classes=num_classes))


def tiny_config(tmp_path: Path, task: str, patch_size: int, data_root: Path, num_classes: int = 0,
                **extra) -> Path:
    """The task's real config at the manifest's widths, on the demo data under ``data_root``, for the
    demo's classes (or ``num_classes`` other ones: fine-tuning)."""
    num_classes = num_classes or (len(SHAPES) if task == 'mask_rcnn' else len(SEG_CLASSES))
    model = dict(_heads(task, num_classes), backbone=dict(BACKBONE, patch_size=patch_size))
    cfg = {'_base_': [str(ROOT / CONFIGS[task])], 'model': model}
    loader = dict(batch_size=1, num_workers=0, persistent_workers=False)
    if task == 'mask_rcnn':
        root = str(data_root / 'demo_coco')
        cfg['test_dataloader'] = dict(loader, dataset=dict(data_root=root))
        cfg['test_evaluator'] = dict(ann_file=f'{root}/annotations/instances_val.json')
    else:
        cfg['test_dataloader'] = dict(loader, dataset=dict(_SEG_DATA, data_root=str(data_root / 'demo_ade')))
        cfg['test_evaluator'] = dict(type='IoUMetric', iou_metrics=['mIoU'])
    cfg.update(extra)
    path = tmp_path / f'tiny_{task}_p{patch_size}.py'
    path.write_text('\n'.join(f'{k} = {v!r}' for k, v in cfg.items()) + '\n')
    return path


def manifest(task: str, patch_size: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """(key, shape) of the released file's state dict, in its order."""
    return [(k, tuple(s)) for k, s in json.loads(MANIFEST.read_text())[f'{task}_p{patch_size}']]


def _value(name: str, shape: Tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values of a trained model's scale for the tensor's role (so outputs stay finite)."""
    if name.endswith('num_batches_tracked'):
        return torch.tensor(1000)
    noise = torch.randn(shape, generator=gen)
    if name.endswith('running_var'):
        return 0.5 + noise.abs()
    leaf = name.split('.')[-1]
    if leaf.startswith('gamma') or leaf == 'temperature':
        return 0.3 + 0.1 * noise
    if leaf == 'weight' and len(shape) == 1:  # norm layers
        return 1.0 + 0.1 * noise
    return 0.1 * noise


def released_state(task: str, patch_size: int, seed: int = 0) -> 'OrderedDict[str, torch.Tensor]':
    """The released state dict of the manifest, every tensor with its own random values."""
    gen = torch.Generator().manual_seed(seed)
    return OrderedDict((k, _value(k, s, gen)) for k, s in manifest(task, patch_size))


def released_file(path: Path, task: str, patch_size: int, state: Dict[str, torch.Tensor] = None) -> Path:
    """A checkpoint as mmcv-full 1.3 saved the authors' models: meta, state_dict, optimizer (+ amp)."""
    state = released_state(task, patch_size) if state is None else state
    detection = task == 'mask_rcnn'
    meta = dict(env_info='sys.platform: linux\nPyTorch: 1.8.1', config='model = dict(...)\n', seed=0,
                exp_name=f'{task}_xcit.py', mmcv_version='1.3.0', time=time.asctime(),
                CLASSES=SHAPES if detection else SEG_CLASSES,
                hook_msgs=dict(last_ckpt='/checkpoint/xcit/latest.pth'))
    meta.update(dict(mmdet_version='2.11.0', epoch=36, iter=263_000) if detection else
                dict(mmseg_version='0.11.0', PALETTE=PALETTE, iter=80_000))
    params = [k for k, v in state.items() if v.is_floating_point() and 'running_' not in k]
    optimizer = dict(
        state={i: dict(step=1000, exp_avg=torch.zeros_like(state[k]), exp_avg_sq=torch.ones_like(state[k]))
               for i, k in enumerate(params[:3])},
        param_groups=[dict(lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05, amsgrad=False,
                           initial_lr=1e-4, params=list(range(len(params))))])
    ckpt = dict(meta=meta, state_dict=OrderedDict(state), optimizer=optimizer)
    if detection:
        ckpt['amp'] = dict(loss_scaler0=dict(loss_scale=512.0, unskipped=1234))
    torch.save(ckpt, path)
    return path


def toolkit_twin(path: Path, state: Dict[str, torch.Tensor]) -> Path:
    """The same weights in this toolkit's layout, mapped by timm (backbone) and HEAD_KEYS."""
    from types import SimpleNamespace

    from timm.models.xcit import checkpoint_filter_fn
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    backbone = checkpoint_filter_fn(backbone, SimpleNamespace(pos_embed=True))
    out = OrderedDict((f'backbone.{k}', v) for k, v in backbone.items())
    for key, value in state.items():
        if not key.startswith('backbone.'):
            prefix = next(p for p in HEAD_KEYS if key.startswith(p))
            out[HEAD_KEYS[prefix] + key[len(prefix):]] = value
    torch.save(dict(state_dict=out, meta=dict(dataset_meta=dict(classes=SHAPES))), path)
    return path
