# Mask R-CNN 3x on COCO with XCiT-M24/8 (paper: box / mask AP 48.5 / 43.7).
_base_ = [
    '../_base_/models/mask_rcnn_xcit_p8.py', '../_base_/datasets/coco_instance_xcit.py',
    '../_base_/schedules/schedule_3x_det.py', '../_base_/default_runtime_det.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p8_384_dist.pth'

model = dict(
    backbone=dict(
        arch='medium_24',
        patch_size=8,
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    neck=dict(in_channels=[512] * 4))
