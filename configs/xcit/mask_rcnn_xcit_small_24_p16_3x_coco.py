# Mask R-CNN 3x on COCO with XCiT-S24/16 (paper: box / mask AP 46.5 / 41.8).
_base_ = [
    '../_base_/models/mask_rcnn_xcit_p16.py', '../_base_/datasets/coco_instance_xcit.py',
    '../_base_/schedules/schedule_3x_det.py', '../_base_/default_runtime_det.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_24_p16_384_dist.pth'

model = dict(
    backbone=dict(
        arch='small_24',
        patch_size=16,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    neck=dict(in_channels=[384] * 4))
