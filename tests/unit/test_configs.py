"""The config tree: every config builds the model its name promises, carries the authors'
recipe (see the reference's detection and segmentation recipes), and trains a step on CPU."""
import functools
import importlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from xcit_dense.builder import build_model
from xcit_dense.inference import predict
from xcit_dense.models.presets import PRESETS

CONFIGS = ROOT / 'configs'
XCIT_CONFIGS = sorted((CONFIGS / 'xcit').glob('*.py'))
EXAMPLE = CONFIGS / 'custom_dataset_example.py'
NAME = re.compile(r'(?P<model>mask_rcnn|upernet|sem_fpn)_xcit_(?P<arch>[a-z]+_\d+)_'
                  r'p(?P<patch>16|8)_(?P<schedule>3x_coco|160k_ade20k|80k_ade20k)\.py')
SCHEDULES = {'mask_rcnn': '3x_coco', 'upernet': '160k_ade20k', 'sem_fpn': '80k_ade20k'}
# arch -> drop path rate of the recipes (width and depth: the presets); Semantic FPN on M24 uses 0.2
DROP_PATH = {'tiny_12': 0.0, 'small_12': 0.05, 'small_24': 0.1, 'medium_24': 0.15}
NO_WEIGHTS = {'model.backbone.init_cfg': None}


@functools.lru_cache(maxsize=None)
def load(path: Path) -> Config:
    return Config.fromfile(str(path))


def parse(path: Path) -> dict:
    match = NAME.fullmatch(path.name)
    assert match, f'unexpected config name {path.name}'
    return dict(match.groupdict(), patch=int(match['patch']))


def configs_of(*models: str) -> list:
    return [p for p in XCIT_CONFIGS if parse(p)['model'] in models]


def ids(paths):
    return [p.stem for p in paths]


def find(pipeline: list, type_: str) -> dict:
    steps = [step for step in pipeline if step['type'] == type_]
    assert len(steps) == 1, f'{type_} appears {len(steps)} times in {pipeline}'
    return steps[0]


def test_the_config_set_is_complete():
    """3 models x 4 sizes x 2 patch sizes, each with its own schedule."""
    names = {p.name for p in XCIT_CONFIGS}
    expected = {f'{model}_xcit_{arch}_p{patch}_{schedule}.py'
                for model, schedule in SCHEDULES.items() for arch in DROP_PATH for patch in (16, 8)}
    assert names == expected


# (a) every config builds the model its name describes ----------------------------------------

@pytest.mark.parametrize('path', XCIT_CONFIGS, ids=ids(XCIT_CONFIGS))
def test_config_builds_named_model(path):
    spec = parse(path)
    preset = PRESETS[spec['arch']]
    dims, depth, drop_path = preset.embed_dims, preset.depth, DROP_PATH[spec['arch']]
    if spec['model'] == 'sem_fpn' and spec['arch'] == 'medium_24':
        drop_path = 0.2
    cfg = load(path)
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=preset.weights_url(spec['patch']))

    with torch.device('meta'):  # the structure only: no memory filled for the full-size model
        model = build_model(path.as_posix(), cfg_options=NO_WEIGHTS, init=False)
    backbone = model.backbone
    assert type(backbone).__name__ == 'XCiT'
    assert (backbone.arch, backbone.patch_size) == (spec['arch'], spec['patch'])
    assert (backbone.embed_dims, len(backbone.blocks)) == (dims, depth)
    assert cfg.model.backbone.drop_path_rate == drop_path
    assert {getattr(b.drop_path, 'drop_prob', 0.) for b in backbone.blocks} == {drop_path}

    if spec['model'] == 'mask_rcnn':
        assert list(model.neck.in_channels) == [dims] * 4
        assert model.neck.out_channels == 256
    elif spec['model'] == 'upernet':
        assert list(model.decode_head.in_channels) == [dims] * 4
        assert model.auxiliary_head.in_channels == dims
    else:
        assert list(model.neck.in_channels) == [dims] * 4
        assert model.neck.out_channels == dims
        assert list(model.decode_head.in_channels) == [dims] * 4


def test_custom_dataset_example():
    """The example changes the classes, heads, data and schedule; the rest is the S12/16 recipe."""
    cfg = load(EXAMPLE)
    classes = cfg.metainfo['classes']
    roi = cfg.model.roi_head
    assert roi.bbox_head.num_classes == roi.mask_head.num_classes == len(classes) != 80
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        assert loader.dataset.metainfo['classes'] == classes
        assert loader.dataset.data_root == cfg.data_root != 'data/coco/'
    assert cfg.val_evaluator.ann_file == cfg.data_root + cfg.val_dataloader.dataset.ann_file
    assert cfg.train_cfg.max_epochs == 12
    assert cfg.param_scheduler[1].milestones == [9, 11]
    # the rest is the S12/16 COCO recipe
    assert cfg.model.backbone.arch == 'small_12' and cfg.model.backbone.patch_size == 16
    assert cfg.optim_wrapper.optimizer.lr == 1e-4
    assert find(cfg.train_dataloader.dataset.pipeline, 'RandomChoice')

    model = build_model(EXAMPLE.as_posix(), cfg_options=NO_WEIGHTS, init=False)
    assert model.roi_head.bbox_head.fc_cls.out_features == len(classes) + 1  # + background
    assert model.roi_head.mask_head.conv_logits.out_channels == len(classes)


# (b) the recipe ----------------------------------------------------------------------------

def check_adamw(cfg: Config, lr: float, weight_decay: float) -> None:
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=lr, betas=(0.9, 0.999),
                                               weight_decay=weight_decay)
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys == {'norm': dict(decay_mult=0.)}
    # reference total batch: 2 images per GPU x 8 GPUs
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)


@pytest.mark.parametrize('path', configs_of('mask_rcnn'), ids=ids(configs_of('mask_rcnn')))
def test_detection_recipe(path):
    cfg = load(path)
    assert cfg.default_scope == 'mmdet'
    check_adamw(cfg, lr=1e-4, weight_decay=0.05)
    warmup, steps = cfg.param_scheduler
    assert warmup == dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500)
    assert steps == dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33],
                         gamma=0.1)
    assert cfg.train_cfg == dict(type='EpochBasedTrainLoop', max_epochs=36, val_interval=1)
    assert cfg.default_hooks.checkpoint.interval == 1
    # mmdet's order and aspect-ratio batches, resumable without loading the trained images
    assert cfg.train_dataloader.sampler == dict(type='ResumableSampler', shuffle=True)
    assert cfg.train_dataloader.batch_sampler == dict(type='ResumableAspectRatioBatchSampler')

    # random flip, then one of the two multi-scale policies
    pipeline = cfg.train_dataloader.dataset.pipeline
    types = [step['type'] for step in pipeline]
    assert types == ['LoadImageFromFile', 'LoadAnnotations', 'RandomFlip', 'RandomChoice',
                     'PackDetInputs']
    assert pipeline[1].with_mask and pipeline[2].prob == 0.5
    policy_a, policy_b = pipeline[3].transforms
    multi_scale = {(1333, short) for short in range(480, 801, 32)}

    def scales(step):
        assert step['type'] == 'RandomChoiceResize' and step['keep_ratio']
        return {tuple(sorted(s, reverse=True)) for s in step['scales']}  # (long max, short)

    assert len(policy_a) == 1 and scales(policy_a[0]) == multi_scale
    assert len(policy_b) == 3
    assert scales(policy_b[0]) == {(1333, 400), (1333, 500), (1333, 600)}
    assert policy_b[1] == dict(type='RandomCrop', crop_type='absolute_range',
                               crop_size=(384, 600), allow_negative_crop=True)
    assert scales(policy_b[2]) == multi_scale

    assert cfg.model.data_preprocessor.pad_size_divisor == 32
    test_resize = find(cfg.test_dataloader.dataset.pipeline, 'Resize')
    assert test_resize.scale == (1333, 800) and test_resize.keep_ratio
    assert cfg.val_evaluator.type == 'FasterCocoMetric'
    assert cfg.val_evaluator.metric == ['bbox', 'segm']
    roi = cfg.model.roi_head
    assert roi.bbox_head.num_classes == roi.mask_head.num_classes == 80
    assert roi.bbox_roi_extractor.featmap_strides == [4, 8, 16, 32]
    assert roi.mask_roi_extractor.roi_layer.output_size == 14


SEG_CONFIGS = configs_of('upernet', 'sem_fpn')


@pytest.mark.parametrize('path', SEG_CONFIGS, ids=ids(SEG_CONFIGS))
def test_segmentation_recipe(path):
    cfg = load(path)
    max_iters, interval = (160000, 16000) if parse(path)['model'] == 'upernet' else (80000, 8000)
    assert cfg.default_scope == 'mmseg'
    check_adamw(cfg, lr=6e-5, weight_decay=0.01)
    warmup, poly = cfg.param_scheduler
    assert warmup == dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500)
    assert poly == dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0,
                        end=max_iters)
    assert cfg.train_cfg == dict(type='ResumableIterBasedTrainLoop', max_iters=max_iters,
                                 val_interval=interval)
    assert cfg.train_dataloader.sampler == dict(type='ResumableInfiniteSampler', shuffle=True)
    assert cfg.default_hooks.checkpoint == dict(type='CheckpointHook', by_epoch=False,
                                                interval=interval,
                                                backend_args=dict(backend='atomic_local'))

    pipeline = cfg.train_dataloader.dataset.pipeline
    assert [step['type'] for step in pipeline] == [
        'LoadImageFromFile', 'LoadAnnotations', 'RandomResize', 'RandomCrop', 'RandomFlip',
        'PhotoMetricDistortion', 'PackSegInputs']
    assert pipeline[1].reduce_zero_label
    assert pipeline[2].scale == (2048, 512) and pipeline[2].ratio_range == (0.5, 2.0)
    assert pipeline[3].crop_size == (512, 512) and pipeline[3].cat_max_ratio == 0.75
    assert pipeline[4].prob == 0.5
    preprocessor = cfg.model.data_preprocessor
    assert preprocessor.size == (512, 512) and preprocessor.seg_pad_val == 255
    test_pipeline = cfg.test_dataloader.dataset.pipeline
    assert find(test_pipeline, 'Resize') == dict(type='Resize', scale=(2048, 512), keep_ratio=True)
    assert find(test_pipeline, 'LoadAnnotations').reduce_zero_label
    assert cfg.model.test_cfg.mode == 'whole'
    assert cfg.val_evaluator == dict(type='IoUMetric', iou_metrics=['mIoU'])

    head = cfg.model.decode_head
    assert head.num_classes == 150 and head.dropout_ratio == 0.1
    assert head.norm_cfg.type == 'SyncBN'
    if parse(path)['model'] == 'upernet':
        assert head.type == 'UPerHead' and head.channels == 512
        assert head.pool_scales == (1, 2, 3, 6)
        aux = cfg.model.auxiliary_head
        assert (aux.type, aux.in_index, aux.channels, aux.num_convs) == ('FCNHead', 2, 256, 1)
        assert aux.num_classes == 150 and aux.loss_decode.loss_weight == 0.4
        assert aux.norm_cfg.type == 'SyncBN'
    else:
        assert head.type == 'FPNHead' and head.channels == 128
        assert head.feature_strides == [4, 8, 16, 32] and head.in_index == [0, 1, 2, 3]
        assert cfg.model.neck.type == 'FPN' and cfg.model.neck.num_outs == 4


def build_transforms(cfg: Config, pipeline: list) -> list:
    """The pipeline's transforms, built in the config's scope (mmdet or mmseg)."""
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.datasets')  # registers the transforms
    registry = importlib.import_module(f'{scope}.registry').TRANSFORMS
    with DefaultScope.overwrite_default_scope(scope):
        return [registry.build(step) for step in pipeline]


def test_detection_train_pipeline_runs():
    """After loading, the pipeline gives short sides from the multi-scale set (a 400x600 image
    never reaches the 1333 cap), with masks kept in step with the image; both policies run:
    the plain resize keeps the 3:2 aspect, the crop changes it."""
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks

    cfg = load(configs_of('mask_rcnn')[0])
    transforms = build_transforms(cfg, cfg.train_dataloader.dataset.pipeline[2:])
    h, w = 400, 600
    masks = np.zeros((2, h, w), dtype=np.uint8)
    masks[0, 50:300, 40:400] = masks[1, 100:380, 300:590] = 1
    aspects, with_masks = set(), 0
    for seed in range(10):
        np.random.seed(seed)
        results = dict(img=np.random.randint(0, 256, (h, w, 3), dtype=np.uint8),
                       img_shape=(h, w), ori_shape=(h, w), img_id=seed, img_path='x.jpg',
                       gt_bboxes=HorizontalBoxes(torch.tensor([[40., 50., 400., 300.],
                                                               [300., 100., 590., 380.]])),
                       gt_bboxes_labels=np.array([0, 3]), gt_ignore_flags=np.zeros(2, bool),
                       gt_masks=BitmapMasks(masks, h, w))
        for transform in transforms:
            results = transform(results)
        image_size = tuple(results['inputs'].shape[1:])
        assert min(image_size) in range(480, 801, 32)
        aspects.add(round(image_size[1] / image_size[0], 2))
        instances = results['data_samples'].gt_instances
        if len(instances):  # a crop may miss both objects (allow_negative_crop)
            assert instances.masks.masks.shape[1:] == image_size
            with_masks += 1
    assert with_masks > 0, 'no crop kept an object: the masks were never checked'
    assert 1.5 in aspects and len(aspects) > 1, aspects


def test_segmentation_train_pipeline_runs():
    """After loading, the pipeline gives image and label crops of at most 512x512, together."""
    cfg = load(configs_of('upernet')[0])
    transforms = build_transforms(cfg, cfg.train_dataloader.dataset.pipeline[2:])
    for seed in range(5):
        np.random.seed(seed)
        results = dict(img=np.random.randint(0, 256, (512, 683, 3), dtype=np.uint8),
                       img_shape=(512, 683), ori_shape=(512, 683), img_path='x.jpg',
                       seg_map_path='x.png', reduce_zero_label=True, seg_fields=['gt_seg_map'],
                       gt_seg_map=np.random.randint(0, 150, (512, 683), dtype=np.uint8))
        for transform in transforms:
            results = transform(results)
        image_size = results['inputs'].shape[1:]
        assert max(image_size) <= 512
        assert results['data_samples'].gt_sem_seg.data.shape[1:] == image_size


def test_segmentation_lr_follows_mmcv_poly_with_warmup():
    """The authors' mmcv 1 policy: lr = base * (1 - t/T) * (r + (1 - r) * t/w) while t < w,
    base * (1 - t/T) after (a poly decay from 0, not from the end of the warmup). Replays the
    80k config's schedulers; MMEngine places the end points one step earlier, a difference
    below 0.1% of the base rate."""
    from mmengine.optim.scheduler import LinearLR, PolyLR

    cfg = load(CONFIGS / 'xcit' / 'sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')
    base = cfg.optim_wrapper.optimizer.lr
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    kinds = {'LinearLR': LinearLR, 'PolyLR': PolyLR}
    schedulers = [kinds[s['type']](optimizer, **{k: v for k, v in s.items() if k != 'type'})
                  for s in cfg.param_scheduler]
    total, warmup, ratio = cfg.train_cfg.max_iters, 1500, 1e-6
    worst = 0.
    for t in range(total):
        factor = ratio + (1 - ratio) * t / warmup if t < warmup else 1.
        expected = base * (1 - t / total) * factor
        worst = max(worst, abs(optimizer.param_groups[0]['lr'] - expected) / base)
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
    assert worst < 1e-3


# (c) one training step on CPU -----------------------------------------------------------------

SEG_SIZE = 64
# fewer RoIs than the recipe's 2000 proposals / 512 samples per image: keeps the step fast
FEW_ROIS = {'model.train_cfg.rpn_proposal.nms_pre': 200,
            'model.train_cfg.rpn_proposal.max_per_img': 100,
            'model.train_cfg.rcnn.sampler.num': 64}


def det_batch() -> dict:
    """Two images (different sizes) with two boxes and box-shaped masks each."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for h, w in ((128, 128), (112, 128)):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        boxes = torch.tensor([[10., 12., 70., 80.], [50., 40., 120., 100.]])
        masks = np.zeros((len(boxes), h, w), dtype=np.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
            mask[y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                             scale_factor=(1., 1.)))
        sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 7]),
                                           masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def seg_batch() -> dict:
    """Two SEG_SIZE images with random labels (two, as UperNet's pooled BN needs a batch)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    size = SEG_SIZE
    for _ in range(2):
        inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=gen))
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, size, size), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def has_grad(module: torch.nn.Module) -> bool:
    return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


TRAIN_CASES = [(model, patch) for model in SCHEDULES for patch in (16, 8)]


@pytest.mark.parametrize('model_name,patch', TRAIN_CASES,
                         ids=[f'{m}_p{p}' for m, p in TRAIN_CASES])
def test_training_step(model_name, patch):
    """Preprocess, loss, backward, step with the config's optimiser: a finite loss, gradients
    in the backbone and every head, and no weight decay on the LayerNorms only."""
    path = CONFIGS / 'xcit' / f'{model_name}_xcit_tiny_12_p{patch}_{SCHEDULES[model_name]}.py'
    if model_name == 'mask_rcnn':
        options = dict(NO_WEIGHTS, **FEW_ROIS)
    else:  # pad to the test images' size, not the recipe's 512x512 crops
        options = dict(NO_WEIGHTS, **{'model.data_preprocessor.size': (SEG_SIZE, SEG_SIZE)})
    torch.manual_seed(0)
    model = build_model(path.as_posix(), cfg_options=options, init=False).train()

    cfg = load(path)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    # the constructor makes one group per parameter
    group_decay = {id(g['params'][0]): g['weight_decay'] for g in optim_wrapper.param_groups}
    decay = {name: group_decay[id(param)] for name, param in model.named_parameters()}
    weight_decay = cfg.optim_wrapper.optimizer.weight_decay
    assert decay['backbone.blocks.0.norm1.weight'] == decay['backbone.blocks.0.norm3.bias'] == 0
    assert decay['backbone.blocks.0.mlp.fc1.weight'] == weight_decay
    assert decay['backbone.blocks.0.local_mp.bn.weight'] == weight_decay  # BN: not a 'norm' key

    data = model.data_preprocessor(det_batch() if model_name == 'mask_rcnn' else seg_batch(), True)
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert torch.isfinite(loss), log_vars
    optim_wrapper.backward(loss)

    backbone = model.backbone
    modules = {'patch_embed': backbone.patch_embed,
               'last block': backbone.blocks[backbone.out_indices[-1]],
               'stride-4 adapter': backbone.fpn1}
    if model_name == 'mask_rcnn':
        modules.update(neck=model.neck, rpn=model.rpn_head, bbox_head=model.roi_head.bbox_head,
                       mask_head=model.roi_head.mask_head)
    else:
        modules['decode_head'] = model.decode_head
        if model_name == 'upernet':
            modules['auxiliary_head'] = model.auxiliary_head
        else:
            modules['neck'] = model.neck
    assert [name for name, module in modules.items() if not has_grad(module)] == []
    optim_wrapper.step()

    # and a prediction on a small image, with the real mmcv ops (RoIAlign, NMS)
    image = torch.randint(0, 256, (3, 96, 128), dtype=torch.uint8)
    result = predict(model.eval(), image)
    if model_name == 'mask_rcnn':
        instances = result.pred_instances
        assert instances.bboxes.shape[1] == 4 and instances.masks.shape[1:] == (96, 128)
    else:
        assert result.pred_sem_seg.data.shape == (1, 96, 128)
