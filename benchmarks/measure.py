"""One measurement in this process: build one configuration, time it, read its peak memory.

The runner starts ``python -m benchmarks.measure SPEC_JSON`` once per configuration, so
peaks never mix; the result is printed as one JSON line after ``RESULT_TAG``. On a GPU it uses
CUDA events and the allocator's peak above what was allocated before the first forward; on a
CPU, wall time and the resident memory the run adds above the process's resident size just
before the first forward (the high-water mark is reset there through /proc/self/clear_refs),
and, from one more profiled step, the peak tensor memory.
"""
import gc
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from mmengine.registry import MODELS as ROOT_MODELS
from torch import nn

from xcit_dense.engine.training.compile import compile_forward
from xcit_dense.tasks import SEGMENTATION, TASKS, Task, task_of_model

from .catalogue import MODELS, BenchTimmXCiTPyramid
from .sizes import hw

RESULT_TAG = 'BENCHMARK_RESULT '
DTYPES = ('fp32', 'fp16', 'bf16')


def _proc_status() -> Dict[str, int]:
    """VmRSS and VmHWM of this process in KiB (empty where /proc is missing)."""
    try:
        text = Path('/proc/self/status').read_text()
    except OSError:
        return {}
    return {k: int(m.group(1)) for k in ('VmRSS', 'VmHWM')
            for m in [re.search(rf'^{k}:\s+(\d+)', text, re.M)] if m}


def _reset_peak_rss() -> bool:
    """Reset the resident high-water mark to the current size; False where the kernel refuses."""
    try:
        Path('/proc/self/clear_refs').write_text('5')
    except OSError:
        return False
    status = _proc_status()
    return bool(status) and status['VmHWM'] <= status['VmRSS'] + 1024


def build(name: str, spec: dict, device: torch.device) -> Tuple[nn.Module, Callable[[], None]]:
    """The model and a step function running inference or one training step on random inputs."""
    info = MODELS.get(name) or dict(config=name)
    res, batch, train = spec['resolution'], spec['batch'], spec['mode'] == 'train'
    channels_last = spec['channels_last']
    torch.manual_seed(0)
    if 'config' in info:
        from xcit_dense.builder import build_model
        options = {'model.backbone.init_cfg': None}
        for key in ('with_cp', 'channels_last'):
            if spec[key]:
                options[f'model.backbone.{key}'] = True
        model = build_model(info['config'], options)
        if spec['compile']:  # what the run does for model.backbone.compile=True
            compile_forward(model.backbone)
        task = task_of_model(model)
        if task is SEGMENTATION and train:  # batch norm of the 1x1 pooled branch needs two images
            batch = spec['batch'] = max(batch, 2)
        inputs, samples = random_samples(task, batch, res)
    else:
        cfg = dict(info['cfg'])
        is_xcit, is_timm = cfg['type'] == 'XCiT', cfg['type'].startswith('BenchTimm')
        if spec['with_cp'] and not is_timm:
            cfg['with_cp'] = True
        if is_xcit:
            cfg.update(channels_last=channels_last)
        if info['scope'] == 'mmengine':  # XCiT and the timm references: the root registry
            model = ROOT_MODELS.build(cfg)
        else:
            model = TASKS[info['scope']].build_model(cfg)
        if is_timm:
            model.model.set_grad_checkpointing(spec['with_cp'])
        if hasattr(model, 'init_weights'):
            model.init_weights()
        if channels_last and not is_xcit:
            model.to(memory_format=torch.channels_last)
        if spec['compile'] and is_xcit:
            compile_forward(model)
        inputs, samples = torch.randn(batch, 3, *hw(res)), None
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
    model.to(device)
    model.train(train)
    if samples is not None:  # the annotations (boxes, masks, label maps) go where the model is
        samples = [sample.to(device) for sample in samples]
    return model, make_step(model, inputs.to(device), samples, spec, device)


def make_step(model: nn.Module, inputs: torch.Tensor, samples: Optional[list], spec: dict,
              device: torch.device) -> Callable[[], None]:
    """One inference (no grad) or one training step: forward, a loss, backward."""
    dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16}.get(spec['dtype'])

    def forward():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            if samples is None:
                return model(inputs)
            return (model.predict if spec['mode'] == 'infer' else model.loss)(inputs, samples)

    if spec['mode'] == 'infer':
        def step():
            with torch.no_grad():
                forward()
    else:
        def step():
            model.zero_grad(set_to_none=True)
            out = forward()
            loss = sum(o.float().mean() for o in out) if samples is None else model.parse_losses(out)[0]
            loss.backward()
    return step


def random_samples(task: Task, batch: int, res: Union[int, Tuple[int, int]],
                   instances: int = 3) -> Tuple[torch.Tensor, list]:
    """Random inputs and annotated data samples for a whole mmdet or mmseg model; ``res`` is the
    side of a square image or its (height, width); detection samples hold ``instances`` boxes and masks."""
    import numpy as np
    from mmengine.structures import InstanceData, PixelData
    height, width = hw(res)
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(batch, 3, height, width, generator=gen)
    shape = (height, width)
    meta = dict(img_shape=shape, ori_shape=shape, pad_shape=shape, batch_input_shape=shape,
                scale_factor=(1.0, 1.0), padding_size=[0, 0, 0, 0])
    samples = []
    for _ in range(batch):
        sample = task.data_sample_class()(metainfo=meta)
        if task is SEGMENTATION:
            sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, height, width), generator=gen))
        else:
            from mmdet.structures.mask import BitmapMasks
            scale = torch.tensor([width, height], dtype=torch.float32)
            xy = torch.rand(instances, 2, generator=gen) * scale * 0.5
            wh = scale * (0.1 + 0.4 * torch.rand(instances, 2, generator=gen))
            boxes = torch.cat([xy, xy + wh], 1)
            masks = np.zeros((instances, height, width), dtype=np.uint8)
            for i, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
                masks[i, y0:y1, x0:x1] = 1
            sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.arange(instances) % 3,
                                               masks=BitmapMasks(masks, height, width))
        samples.append(sample)
    return inputs, samples


class Timer:
    """Seconds of one call: CUDA events on a GPU, wall time on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == 'cuda'

    def __call__(self, fn: Callable[[], None]) -> float:
        """Run ``fn`` once and return how long it took."""
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) / 1e3


def measure_spec(spec: dict) -> dict:
    """Measure one configuration (``spec``), or time two side by side (``spec['pair']``)."""
    torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    if spec.get('pair'):
        return time_side_by_side(spec, device)
    spec['requested_batch'] = spec['batch']
    model, step = build(spec['model'], spec, device)
    timer = Timer(device)
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        hwm_reset = _reset_peak_rss()
        baseline = _proc_status().get('VmRSS', 0) * 1024
    first = [timer(step) for _ in range(spec['warmup'])]
    repeats = spec['repeats']
    if first and first[-1] > spec.get('slow_s', math.inf):
        repeats = 1
    times = [timer(step) for _ in range(repeats)]
    note = 'slow: 1 timed run' if repeats < spec['repeats'] else ''
    if device.type == 'cuda':
        peak = tensor_peak = torch.cuda.max_memory_allocated() - baseline
    else:
        import resource
        hwm = _proc_status().get('VmHWM', 0) * 1024
        if hwm_reset:
            peak = hwm - baseline
        else:  # the peak may then include building the model
            peak = max(hwm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - baseline
            note = 'peak RSS not reset: upper bound'
        tensor_peak = tensor_peak_bytes(model, step)  # after the resident peak is read: the profiler costs memory
    if spec['compile'] and getattr(getattr(model, 'backbone', model).forward, 'failed', False):
        note = (note + '; ' if note else '') + 'compile fell back to eager'
    if spec['batch'] != spec.get('requested_batch', spec['batch']):
        note = (note + '; ' if note else '') + f"batch {spec['batch']}"
    per_image = [t / spec['batch'] for t in times]
    return dict(status='ok', time_ms=statistics.median(per_image) * 1e3, time_min_ms=min(per_image) * 1e3,
                time_max_ms=max(per_image) * 1e3, peak_mem_mb=peak / 2 ** 20, baseline_mem_mb=baseline / 2 ** 20,
                peak_tensor_mb=None if tensor_peak is None else tensor_peak / 2 ** 20, note=note)


def tensor_peak_bytes(model: nn.Module, step: Callable[[], None]) -> Optional[int]:
    """Peak bytes of CPU tensors one step allocates above what was live before it.

    Summed from the profiler's allocation events (the CPU counterpart of the CUDA allocator's
    peak statistic): unlike the resident size, it does not see what malloc keeps for reuse.
    """
    from torch.profiler import ProfilerActivity, profile
    model.zero_grad(set_to_none=True)  # gradients count in the step, as in the first one
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == '[memory]')
    except Exception:  # a profiler without these events: no tensor figure
        return None
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def time_side_by_side(spec: dict, device: torch.device) -> dict:
    """Time variants of one model round-robin in one process (the order rotates every round).

    ``pair='timm'``: this toolkit's XCiT (``ours``), timm's XCiT plus the plain pyramid on the
    same weights (``timm``) and ours with ``channels_last`` (``ours_channels_last``); the ratio
    is ours / timm. ``pair='cp'``: one XCiT with ``with_cp`` on and off; the ratio is on / off.
    Ratios are of the medians.
    """
    base = dict(spec, pair=None, with_cp=False, channels_last=False)
    model, step = build(spec['model'], base, device)
    if spec['pair'] == 'timm':
        ref = BenchTimmXCiTPyramid(model.arch, model.patch_size, source=model).to(device)
        ref.train(spec['mode'] == 'train')
        fast, step_fast = build(spec['model'], dict(base, channels_last=True), device)
        fast.load_state_dict(model.state_dict())
        x = torch.randn(spec['batch'], 3, spec['resolution'], spec['resolution'], device=device)
        variants = {'ours': step, 'timm': make_step(ref, x, None, base, device), 'ours_channels_last': step_fast}
    else:
        def switch(flag: bool) -> Callable[[], None]:
            def run():
                model.with_cp = flag
                step()
            return run
        variants = {'with_cp': switch(True), 'plain': switch(False)}
    timer, names = Timer(device), list(variants)
    for _ in range(spec['warmup']):
        for name in names:
            timer(variants[name])
    runs: Dict[str, List[float]] = {name: [] for name in names}
    for i in range(spec['repeats']):
        for name in names[i % len(names):] + names[:i % len(names)]:
            runs[name].append(timer(variants[name]) / spec['batch'] * 1e3)
    times = {name: statistics.median(v) for name, v in runs.items()}
    first, second = names[:2]
    result = dict(status='ok', times_ms=times, runs_ms=runs, ratio=times[first] / times[second])
    if 'ours_channels_last' in times:
        result['ratio_channels_last'] = times['ours_channels_last'] / times['timm']
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Measure the spec given as JSON and print its result line; an error is the run's status, not a crash."""
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    try:
        result = measure_spec(spec)
    except Exception as exc:  # reported as the run's status, the parent goes on
        import traceback
        traceback.print_exc()
        result = dict(status='error', note=f'{type(exc).__name__}: {str(exc).strip()[:200]}')
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
