# UperNet 160k on ADE20K with XCiT-S24/8 (paper: 48.1 mIoU).
_base_ = [
    '../_base_/models/upernet_xcit_p8.py', '../_base_/datasets/ade20k_xcit.py',
    '../_base_/schedules/schedule_160k_seg.py', '../_base_/default_runtime_seg.py'
]
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_24_p8_384_dist.pth'

model = dict(
    backbone=dict(
        arch='small_24',
        patch_size=8,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
