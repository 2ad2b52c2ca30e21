# Runtime for the detection configs: hooks, logging, visualisation, environment.
# default_scope and custom_imports come from the model bases.
_base_ = './toolkit_hooks.py'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    # a checkpoint every epoch, as the authors' runtime did
    checkpoint=dict(type='CheckpointHook', interval=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='DetVisualizationHook'))

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)

# MMEngine's Runner, with a log header naming the process group and devices in use
runner_type = 'ToolkitRunner'
log_level = 'INFO'
load_from = None
resume = False
