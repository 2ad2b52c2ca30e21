# Mask R-CNN 3x on COCO with XCiT-M24/16 (paper: box / mask AP 46.7 / 42.0).
_base_ = [
    '../_base_/models/mask_rcnn_xcit_p16.py', '../_base_/datasets/coco_instance_xcit.py',
    '../_base_/schedules/schedule_3x_det.py', '../_base_/default_runtime_det.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p16_384_dist.pth'

model = dict(
    backbone=dict(
        arch='medium_24',
        patch_size=16,  # 16, not the 8 of the authors' file (a defect there)
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    neck=dict(in_channels=[512] * 4))
