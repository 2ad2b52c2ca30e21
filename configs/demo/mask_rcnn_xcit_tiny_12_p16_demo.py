# Demo: Mask R-CNN with XCiT-T12/16 on the generated shapes set (tools/make_demo_data.py),
# trained from scratch in minutes on 2 CPU processes. Only what a small dataset and a CPU need
# differs from the COCO recipe: data, image size, classes, CPU-sized heads, schedule, BN, and
# no pretrained weights (nothing can be downloaded).
_base_ = '../xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py'

data_root = 'data/demo_coco/'
# images are decoded as stored, EXIF orientation ignored: annotations are drawn on the stored pixels
color_type = 'color_ignore_orientation'
classes = ('rectangle', 'ellipse', 'triangle')
metainfo = dict(classes=classes, palette=[(220, 20, 60), (0, 130, 200), (60, 180, 75)])
image_size = (128, 128)
channels = 64  # FPN and head width (the recipe's 256 is sized for GPUs)
# torchvision's RoIAlign: same output, its forward is ~3x faster than mmcv's on a CPU; one sample
# per bin (the recipe's 0 samples small RoIs 1-2 times a bin) makes its backward cheaper
roi_layer = dict(type='RoIAlign', sampling_ratio=1, use_torchvision=True)

model = dict(
    backbone=dict(norm_cfg=dict(type='BN', requires_grad=True), init_cfg=None),
    neck=dict(out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels,
                  anchor_generator=dict(scales=[4])),  # 16..256 px anchors for 128 px images
    roi_head=dict(
        bbox_roi_extractor=dict(roi_layer=dict(roi_layer, output_size=7), out_channels=channels),
        bbox_head=dict(in_channels=channels, fc_out_channels=256, num_classes=len(classes)),
        mask_roi_extractor=dict(roi_layer=dict(roi_layer, output_size=14), out_channels=channels),
        mask_head=dict(num_convs=2, in_channels=channels, conv_out_channels=channels,
                       num_classes=len(classes))),
    # a few objects per image: far fewer proposals and sampled RoIs than for COCO, half of
    # the RoIs positive (when there are enough) so that the heads learn faster; 32 RoIs an
    # image (at most 16 positive, each a mask head pass) take a fifth off a trained model's
    # step against 64, for bbox/mask mAP 0.55/0.53 against 0.61/0.58 after 1000 iterations
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=100),
        rcnn=dict(sampler=dict(num=32, pos_fraction=0.5))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=50),
        rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type=color_type),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]

dataset = dict(data_root=data_root, metainfo=metainfo)
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(dataset, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(dataset, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# 2 processes x 4 images, 2000 training images: 250 iterations an epoch; evaluate at the
# middle and at the end (the curve in tools/analysis_tools/plot_logs.py), checkpoint at the end
max_epochs = 4
train_cfg = dict(max_epochs=max_epochs, val_interval=2)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='CosineAnnealingLR', begin=0, end=max_epochs, by_epoch=True, eta_min_ratio=0.01,
         convert_to_iter_based=True),
]
# from scratch and short: a higher AdamW LR than the recipe's (tried: 8e-4 learns faster than 4e-4);
# fused=True: one kernel for all parameters, not a loop over tensors (a tenth of a CPU step)
optim_wrapper = dict(optimizer=dict(lr=8e-4, fused=True), clip_grad=dict(max_norm=10.0))
# per-rank lines without the slow-rank and waiting warnings: the 2 processes share 2 cores with
# their data workers, so each waits on the other by design
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=max_epochs),
                     rank_figures=dict(warn=False))
log_processor = dict(window_size=10)

# seeded, so that a run reproduces (the README figures, tests/integration/test_demo.py)
randomness = dict(seed=0)
