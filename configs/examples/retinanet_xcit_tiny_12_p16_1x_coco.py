# Option, not the authors' recipe: mmdet's RetinaNet 1x on COCO with an XCiT-T12/16 backbone, to show
# an XCiT backbone under a one-stage detector. The detector, data and schedule are mmdet's stock
# RetinaNet R-50 config; the backbone, its pyramid widths and the optimiser (AdamW, no weight decay on
# the LayerNorms, as the XCiT recipes) are replaced. Not trained here: no reference result.
# On a GPU its focal loss runs mmcv's sigmoid_focal_loss (served without compiled mmcv, docs/install.md).
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['xcit_dense.checked_loading'], allow_failed_imports=False)
# backbone initialised from the authors' ImageNet-1k 384 distilled weights
checkpoint_file = 'https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_384_dist.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='tiny_12',
        patch_size=16,
        drop_path_rate=0.05,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint_file)),
    # strides 8, 16 and 32 of the 4-level pyramid (start_level 1), P6 and P7 on top, as for R-50
    neck=dict(in_channels=[192] * 4))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
