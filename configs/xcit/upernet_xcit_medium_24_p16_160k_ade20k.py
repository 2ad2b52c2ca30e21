# UperNet 160k on ADE20K with XCiT-M24/16 (paper: 47.6 mIoU).
_base_ = [
    '../_base_/models/upernet_xcit_p16.py', '../_base_/datasets/ade20k_xcit.py',
    '../_base_/schedules/schedule_160k_seg.py', '../_base_/default_runtime_seg.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p16_384_dist.pth'

model = dict(
    backbone=dict(
        arch='medium_24',
        patch_size=16,
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    decode_head=dict(in_channels=[512] * 4),
    auxiliary_head=dict(in_channels=512))
