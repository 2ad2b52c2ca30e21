# The authors' COCO "3x" schedule: AdamW, 36 epochs, x0.1 at epochs 27 and 33, 500-iteration
# linear warmup. Mixed precision is switched on from the command line (--amp), not here.
max_epochs = 36
# evaluate (and checkpoint, see default_runtime_det) every epoch, as mmdet 2 did by default
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    # no weight decay on the LayerNorms (every parameter whose name contains 'norm')
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))

# the learning rate above is for the reference total batch of 16 (8 GPUs x 2 images);
# tools/train.py --scale-lr rescales it linearly for another effective total batch
auto_scale_lr = dict(enable=False, base_batch_size=16)
