# Semantic FPN 80k on ADE20K with XCiT-T12/16 (paper: 38.1 mIoU).
_base_ = [
    '../_base_/models/sem_fpn_xcit_p16.py', '../_base_/datasets/ade20k_xcit.py',
    '../_base_/schedules/schedule_80k_seg.py', '../_base_/default_runtime_seg.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_384_dist.pth'

model = dict(
    backbone=dict(
        arch='tiny_12',
        patch_size=16,
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    neck=dict(in_channels=[192] * 4, out_channels=192),
    decode_head=dict(in_channels=[192] * 4))
