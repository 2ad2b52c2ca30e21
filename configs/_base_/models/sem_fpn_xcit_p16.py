# Semantic FPN on an XCiT patch-16 backbone, for ADE20K's 150 classes. As in the authors'
# model, the FPN keeps the backbone width (out_channels = D, not 256). Sizes other than
# small_12 (D = 384) override the backbone and the neck/head in_channels.
_base_ = 'mmseg::_base_/models/fpn_r50.py'
custom_imports = dict(imports=['xcit_dense.checked_loading'], allow_failed_imports=False)
default_scope = 'mmseg'
norm_cfg = dict(type='SyncBN', requires_grad=True)

model = dict(
    pretrained=None,
    # train crops are padded to 512x512 (image 0, label 255)
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='small_12',
        patch_size=16,
        drop_path_rate=0.05,
        # no init_cfg: the configs in configs/xcit/ set the pretrained weights per size
        norm_cfg=norm_cfg),
    neck=dict(in_channels=[384, 384, 384, 384], out_channels=384, num_outs=4),
    decode_head=dict(
        in_channels=[384, 384, 384, 384],
        in_index=[0, 1, 2, 3],
        feature_strides=[4, 8, 16, 32],
        channels=128,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg))
