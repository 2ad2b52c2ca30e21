# ADE20K (150 classes, label 0 "other" ignored via reduce_zero_label) with 512x512 crops.
# Padding crops to 512x512 (label 255) is done by the model's SegDataPreProcessor (size).
dataset_type = 'ADE20KDataset'
data_root = 'data/ade/ADEChallengeData2016'
# images are decoded as stored, EXIF orientation ignored: annotations are drawn on the stored pixels
color_type = 'color_ignore_orientation'
crop_size = (512, 512)
train_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
# whole-image, single-scale test
test_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    # annotations are loaded after Resize: mIoU is computed at the original resolution
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]

# 2 images per GPU; the reference total batch is 8 GPUs x 2 = 16. The toolkit's endless sampler:
# each image augmented under its own seed, and a resume that starts at its next sample without
# loading the trained ones (docs/training.md)
train_dataloader = dict(
    batch_size=2,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='ResumableInfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

# test-time augmentation (tools/test.py --tta), as in mmseg's ADE20K configs: six scales of the
# image and a horizontal flip, logits averaged by SegTTAModel. The paper's mIoU are single-scale
# (test_pipeline above; the authors' config has these ratios commented out).
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in img_ratios],
            [dict(type='RandomFlip', prob=0.0, direction='horizontal'),
             dict(type='RandomFlip', prob=1.0, direction='horizontal')],
            [dict(type='LoadAnnotations', reduce_zero_label=True)],
            [dict(type='PackSegInputs')],
        ]),
]
tta_model = dict(type='SegTTAModel')
