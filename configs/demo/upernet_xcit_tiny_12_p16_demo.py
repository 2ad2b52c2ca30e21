# Demo: UperNet with XCiT-T12/16 on the generated shapes set in the ADE20K layout
# (tools/make_demo_data.py), trained from scratch in minutes on 2 CPU processes. Only what a
# small dataset and a CPU need differs from the ADE20K recipe: data, image size, classes
# (the background is a class here), CPU-sized heads, schedule, BN, no pretrained weights.
_base_ = '../xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py'

data_root = 'data/demo_ade/'
# images are decoded as stored, EXIF orientation ignored: annotations are drawn on the stored pixels
color_type = 'color_ignore_orientation'
classes = ('background', 'rectangle', 'ellipse', 'triangle')
metainfo = dict(classes=classes,
                palette=[[0, 0, 0], [220, 20, 60], [0, 130, 200], [60, 180, 75]])
image_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=image_size),
    backbone=dict(norm_cfg=norm_cfg, init_cfg=None),
    # the recipe's 512 / 256 channels are sized for GPUs
    decode_head=dict(channels=128, num_classes=len(classes), norm_cfg=norm_cfg),
    auxiliary_head=dict(channels=64, num_classes=len(classes), norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='LoadAnnotations'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.jpg',
               seg_map_suffix='.png', reduce_zero_label=False)
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(dataset, data_prefix=dict(img_path='images/training',
                                           seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                           seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

# 2 processes x 4 images; evaluate at the middle and at the end, checkpoint at the end
max_iters = 1400
train_cfg = dict(max_iters=max_iters, val_interval=max_iters // 2)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters),
]
# from scratch and short: a higher AdamW LR than the recipe's (tried: 8e-4 learns faster than 4e-4)
optim_wrapper = dict(optimizer=dict(lr=8e-4), clip_grad=dict(max_norm=10.0))
# per-rank lines without the slow-rank and waiting warnings: the 2 processes share 2 cores with
# their data workers, so each waits on the other by design
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=max_iters),
                     rank_figures=dict(warn=False))
log_processor = dict(window_size=10)

# seeded, so that a run reproduces (the README figures, tests/integration/test_demo.py)
randomness = dict(seed=0)
