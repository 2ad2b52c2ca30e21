# Mask R-CNN with FPN on an XCiT patch-8 backbone (the authors' COCO model).
# Sizes other than small_12 override backbone arch/drop_path_rate and neck in_channels.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['xcit_dense'], allow_failed_imports=False)
default_scope = 'mmdet'

model = dict(
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='small_12',
        patch_size=8,
        drop_path_rate=0.05,
        # no init_cfg: the configs in configs/xcit/ set the pretrained weights per size
        norm_cfg=dict(type='SyncBN', requires_grad=True)),
    neck=dict(in_channels=[384, 384, 384, 384]))
