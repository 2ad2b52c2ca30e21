# COCO 2017 instance segmentation with the authors' multi-scale training (the DETR / Swin
# "AutoAugment" policy). Images are padded to a multiple of 32 by the model's
# DetDataPreprocessor (pad_size_divisor=32), not in the pipeline.
dataset_type = 'CheckedCocoDataset'
data_root = 'data/coco/'
# images are decoded as stored, EXIF orientation ignored: annotations are drawn on the stored pixels
color_type = 'color_ignore_orientation'
backend_args = None

# short side 480..800 in steps of 32, long side at most 1333
multi_scales = [(1333, short) for short in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type, backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    # one of two policies per image: (a) multi-scale resize; (b) resize to short side
    # 400/500/600, crop a random 384..600 box, then multi-scale resize as in (a)
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize',
                     scales=[(1333, 400), (1333, 500), (1333, 600)],
                     keep_ratio=True),
                dict(type='RandomCrop',
                     crop_type='absolute_range',
                     crop_size=(384, 600),
                     allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type, backend_args=backend_args),
    dict(type='Resize', scale=(1333, 800), keep_ratio=True),
    # annotations are loaded after Resize: the metric compares with the original boxes
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]

# 2 images per GPU; the reference total batch is 8 GPUs x 2 = 16. The toolkit's samplers: mmdet's
# DefaultSampler order and aspect-ratio batches, each image augmented under its own seed, and a
# resume that starts at its next sample without loading the trained ones (docs/training.md)
train_dataloader = dict(
    batch_size=2,
    num_workers=2,
    persistent_workers=True,
    sampler=dict(type='ResumableSampler', shuffle=True),
    batch_sampler=dict(type='ResumableAspectRatioBatchSampler'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=32),
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'),
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

# FasterCocoMetric (this toolkit): mmdet's CocoMetric, same arguments and keys, computed by
# faster-coco-eval, many times faster (benchmarks/reports/coco_eval.md). For pycocotools, set
# type='CocoMetric' (--cfg-options val_evaluator.type=CocoMetric test_evaluator.type=CocoMetric).
val_evaluator = dict(
    type='FasterCocoMetric',
    ann_file=data_root + 'annotations/instances_val2017.json',
    metric=['bbox', 'segm'],
    format_only=False,
    backend_args=backend_args)
test_evaluator = val_evaluator
