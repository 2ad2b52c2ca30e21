# Mask R-CNN 3x on COCO with XCiT-S12/16 (paper: box / mask AP 45.3 / 40.8).
_base_ = [
    '../_base_/models/mask_rcnn_xcit_p16.py', '../_base_/datasets/coco_instance_xcit.py',
    '../_base_/schedules/schedule_3x_det.py', '../_base_/default_runtime_det.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'

model = dict(
    backbone=dict(
        arch='small_12',
        patch_size=16,
        drop_path_rate=0.05,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    neck=dict(in_channels=[384] * 4))
