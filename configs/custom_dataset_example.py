# Worked example: Mask R-CNN with XCiT-S12/16 on your own COCO-format dataset.
# Everything not overridden here (model, augmentation, optimiser, runtime) comes from the
# COCO config below; only what differs for the new data is restated.
_base_ = './xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py'

# 1. The classes: names as in the "categories" of the annotation files. CocoDataset loads
#    only these categories and numbers them 0..n-1 in this order; the palette (one RGB
#    colour per class) is used when drawing predictions.
classes = ('person', 'bicycle', 'helmet')
metainfo = dict(classes=classes, palette=[(220, 20, 60), (119, 11, 32), (0, 0, 142)])
num_classes = len(classes)

# 2. The model: the box and mask heads output one channel per class, so both must change
#    (COCO has 80). The backbone still starts from the ImageNet weights of the base config.
model = dict(
    roi_head=dict(
        bbox_head=dict(num_classes=num_classes),
        mask_head=dict(num_classes=num_classes)))

# 3. The data: images in data_root/train/ and data_root/val/, COCO-style json files in
#    data_root/annotations/. Paths in the dataloaders are relative to data_root; the metric
#    reads its annotation file directly, so it takes the full path.
data_root = 'data/my_dataset/'
train_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/train.json',
        data_prefix=dict(img='train/')))
val_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/val.json',
        data_prefix=dict(img='val/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator

# 4. The schedule: 12 epochs instead of 36, with the learning-rate steps scaled the same way
#    (epochs 27 and 33 of 36 become 9 and 11 of 12). The scheduler list replaces the base's
#    list as a whole, so the warmup is restated too.
max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[9, 11],
         gamma=0.1),
]

# 5. The learning rate (1e-4) is for a total batch of 16 (8 GPUs x 2 images). On other
#    hardware, `tools/train.py --keep-total-batch` accumulates gradients up to 16, or
#    `--scale-lr` (or auto_scale_lr = dict(enable=True, base_batch_size=16) here) scales the
#    LR linearly with the effective total batch, accumulation included.
