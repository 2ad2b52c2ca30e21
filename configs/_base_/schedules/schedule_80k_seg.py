# The authors' ADE20K schedule for 80k iterations: AdamW, 1500-iteration linear warmup
# from 1e-6 of the learning rate, then poly decay (power 1) to 0; checkpoint and evaluate
# every 8000 iterations.
_base_ = '../default_hooks_seg.py'  # the hooks, with the toolkit's
max_iters = 80000
interval = 8000
# the toolkit's loop: MMEngine's, resumed without iterating over the trained batches
train_cfg = dict(type='ResumableIterBasedTrainLoop', max_iters=max_iters, val_interval=interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

# The two schedulers overlap on purpose: MMEngine multiplies the factors of active
# schedulers, so the warmup scales a poly curve that runs from iteration 0, as mmcv 1's
# policy='poly' with warmup='linear' did for the authors (to within MMEngine's one-step
# offset of the end points: under 0.1% of the learning rate).
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters),
]

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    # no weight decay on the LayerNorms (every parameter whose name contains 'norm')
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))

default_hooks = dict(checkpoint=dict(interval=interval))

# the learning rate above is for the reference total batch of 16 (8 GPUs x 2 images);
# tools/train.py --scale-lr rescales it linearly for another effective total batch
auto_scale_lr = dict(enable=False, base_batch_size=16)
