# Runtime for the segmentation configs: logging, visualisation, environment. Training is
# counted in iterations; the hooks are in default_hooks_seg.py, which the schedule files inherit
# and complete with their checkpoint interval.
# default_scope and custom_imports come from the model bases.

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))

vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)

# MMEngine's Runner, with a log header naming the process group and devices in use
runner_type = 'ToolkitRunner'
log_level = 'INFO'
load_from = None
resume = False
