# The toolkit's hooks, as named default_hooks entries: default_hooks merges by name on
# inheritance (a custom_hooks list would be replaced whole by a config that sets its own), and
# an entry is switched off by name, e.g. --cfg-options default_hooks.throughput=None.
# Inherited by default_runtime_det.py and, for segmentation, default_hooks_seg.py (which the
# schedules inherit). This file is the one list of the toolkit's hooks: for configs that inherit
# neither, xcit_dense/engine/planning/declared_hooks.py reads it (engine/planning/run_config.py's declare_hooks adds
# the entries) and engine/planning/run_config.py sets their run-time arguments (the batch plan,
# --skip-nonfinite). The hook types come with custom_imports of xcit_dense (the model bases).

default_hooks = dict(
    # images per second over all ranks in the log (img_per_s)
    throughput=dict(type='ThroughputHook'),
    # each rank's memory, data wait and own step time per logger line, the slow rank named
    rank_figures=dict(type='RankFiguresHook'),
    # SIGTERM/SIGUSR1: checkpoint at the next iteration, requeue under Slurm, exit
    preemption=dict(type='PreemptionHook'),
    # a NaN/inf loss makes no update; stop (or skip the batch with skip=True)
    nonfinite_loss=dict(type='NonFiniteLossHook'),
    # MMEngine's scheduler hook, stepping at the end of each optimizer step: under gradient
    # accumulation every micro-batch of step j trains at the schedule's value for step j
    param_scheduler=dict(type='OptimizerStepSchedulerHook'),
    # the batch plan in checkpoints; a resume under another plan keeps the optimizer steps
    batch_plan=dict(type='BatchPlanHook'),
    # the data position (epoch, samples) in checkpoints; a resume continues at the next sample
    data_position=dict(type='DataPositionHook'),
    # every rank's random-number generator states in checkpoints, restored on resume
    rng_state=dict(type='RNGStateHook'),
    # a lost peer named within XCIT_STEP_TIMEOUT inside a step, XCIT_WAIT_TIMEOUT elsewhere
    step_bound=dict(type='StepBoundHook'),
    # progress bars for validation and test
    eval_progress=dict(type='EvalProgressHook'),
    # checkpoints are written to a temporary file and renamed, never left half-written
    checkpoint=dict(backend_args=dict(backend='atomic_local')))

# An exponential moving average of the weights (timm's --model-ema), off by default; tools/train.py
# --ema [DECAY] switches it on. Updated once per optimizer step; validation and the checkpoints'
# state_dict use the average (engine/training/model_ema_hook.py).
model_ema = dict(enable=False, decay=0.9999, warmup=2000)
