# Mask R-CNN with FPN on an XCiT patch-16 backbone (the authors' COCO model).
# Sizes other than small_12 override backbone arch/drop_path_rate and neck in_channels.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
# xcit_dense.models.kernel_dtypes: the RPN head and RoI extractor that bf16 training needs (see there)
custom_imports = dict(imports=['xcit_dense.checked_loading', 'xcit_dense.models.kernel_dtypes'],
                      allow_failed_imports=False)
default_scope = 'mmdet'

model = dict(
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='small_12',
        patch_size=16,
        drop_path_rate=0.05,
        # no init_cfg: the configs in configs/xcit/ set the pretrained weights per size
        norm_cfg=dict(type='SyncBN', requires_grad=True)),
    neck=dict(in_channels=[384, 384, 384, 384]),
    # NMS and RoIAlign in float32 under bf16 autocast (mmcv has no bf16 kernels); as mmdet's otherwise
    rpn_head=dict(type='KernelDtypeRPNHead'),
    roi_head=dict(bbox_roi_extractor=dict(type='KernelDtypeRoIExtractor'),
                  mask_roi_extractor=dict(type='KernelDtypeRoIExtractor')))
