# The default_hooks of the segmentation configs, counted in iterations: MMEngine's and the
# toolkit's (toolkit_hooks.py). Both schedules inherit them and set the checkpoint interval:
# MMEngine allows a key in only one base of a config, and every segmentation config has a
# schedule and default_runtime_seg.py as bases, so the hooks go with the schedule.
_base_ = './toolkit_hooks.py'  # merged into default_hooks below

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False),  # interval: the schedule's
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
