# Option, not the authors' recipe: mmdet's Mask2Former (COCO instance segmentation, LSJ 50 epochs)
# with an XCiT-T12/16 backbone, to show an XCiT backbone under a query-based segmenter. Detector,
# data, optimiser and schedule are mmdet's stock Mask2Former R-50 config; the backbone and the
# pixel decoder's input widths are replaced. Not trained here: no reference result.
# On a GPU its pixel decoder runs mmcv's ms_deform_attn (served without compiled mmcv, docs/install.md).
_base_ = 'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py'
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
    panoptic_head=dict(in_channels=[192] * 4))
