"""Speed and peak memory of XCiT and the backbones users would pick instead, against resolution.

For every model, square resolution and mode it measures the time per image and the peak memory
of inference (``infer``) and of one training step, forward and backward (``train``). Each
measurement runs in a fresh process, so peaks never mix: warm-up runs, then ``--repeats`` timed
runs, the median reported. On a GPU it uses CUDA events and the allocator's peak above what was
allocated before the first forward; on a CPU, wall time and the resident memory the run adds
above the process's resident size just before the first forward (the high-water mark is reset
there through /proc/self/clear_refs), and, from one more profiled step, the peak tensor memory
(what the GPU figure counts, without what malloc keeps for reuse).

Every model is built through the mmengine / mmdet / mmseg registries with random weights:

- ``xcit_{t12,s12}_p{16,8}``: this toolkit's XCiT (type='XCiT');
- ``timm_xcit_{t12,s12}_p{16,8}``: timm's XCiT on the same weights, followed by the same pyramid
  ops written in plain torch (functional transposed convolutions, batch norm, GELU, max pools);
- ``swin_t`` (mmdet SwinTransformer), ``r50`` (mmdet ResNet-50);
- ``vit_s16`` (timm ViT-S/16, fused attention) and ``mmseg_vit_s16`` (mmseg VisionTransformer,
  attention weights materialised), both global attention;
- ``mask_rcnn_xcit_t12_p16`` and ``upernet_xcit_t12_p16``: whole models built from the configs
  (``--config PATH`` adds any other config).

With ``--ratios`` it also measures the targets side by side: (1) the time ratio of this toolkit's
XCiT to timm's XCiT plus the plain pyramid at 512 and 1024, timed in turn in one process;
(2) XCiT-S12/16's peak memory at 1600 over 1024 against the pixel ratio, and the ViTs' ratio;
(3) what ``with_cp`` saves in training peak memory at 1024 (fresh processes) and costs in step
time (timed in turn in one process).

Outputs in ``--out-dir``: benchmark.md (also printed), benchmark.csv, benchmark.png, ratios.json.
Runs over ``--max-mem-gb`` or ``--timeout``, after ``--budget-s`` or matching ``--skip`` are
marked skipped. Example (the README has the command of its table)::

    .venv/bin/python tools/benchmark.py --resolutions 512 1024 1600 --ratios --out-dir work_dirs/benchmark
"""
import argparse
import csv
import fnmatch
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = 'BENCHMARK_RESULT '
ARCHS = {'t12': 'tiny_12', 's12': 'small_12'}
DTYPES = ('fp32', 'fp16', 'bf16')
CSV_COLUMNS = ['model', 'kind', 'resolution', 'mode', 'status', 'time_ms', 'time_min_ms', 'time_max_ms',
               'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb', 'dtype', 'with_cp', 'channels_last', 'compile',
               'batch', 'repeats', 'warmup', 'threads', 'device', 'note']


def _models() -> Dict[str, dict]:
    """Name -> how to build it: a registry config (``scope``, ``cfg``) or a model config file."""
    models = {}
    for short, arch in ARCHS.items():
        for patch in (16, 8):
            models[f'xcit_{short}_p{patch}'] = dict(
                kind='backbone', scope='mmengine', cfg=dict(type='XCiT', arch=arch, patch_size=patch))
            models[f'timm_xcit_{short}_p{patch}'] = dict(
                kind='backbone', scope='mmengine', cfg=dict(type='BenchTimmXCiTPyramid', arch=arch,
                                                            patch_size=patch))
    models['swin_t'] = dict(kind='backbone', scope='mmdet', cfg=dict(
        type='SwinTransformer', embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7,
        mlp_ratio=4, qkv_bias=True, drop_path_rate=0., patch_norm=True, out_indices=(0, 1, 2, 3)))
    models['r50'] = dict(kind='backbone', scope='mmdet', cfg=dict(
        type='ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3), norm_cfg=dict(type='BN'), style='pytorch'))
    models['vit_s16'] = dict(kind='backbone', scope='mmengine', cfg=dict(
        type='BenchTimmViT', name='vit_small_patch16_224', indices=(3, 5, 7, 11)))
    models['mmseg_vit_s16'] = dict(kind='backbone', scope='mmseg', cfg=dict(
        type='VisionTransformer', img_size=(224, 224), patch_size=16, embed_dims=384, num_layers=12,
        num_heads=6, mlp_ratio=4, qkv_bias=True, out_indices=(3, 5, 7, 11), final_norm=False,
        interpolate_mode='bicubic'))
    models['mask_rcnn_xcit_t12_p16'] = dict(
        kind='detector', config=str(ROOT / 'configs/xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py'))
    models['upernet_xcit_t12_p16'] = dict(
        kind='segmentor', config=str(ROOT / 'configs/xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py'))
    return models


MODELS = _models()
DEFAULT_MODELS = ['xcit_t12_p16', 'xcit_t12_p8', 'xcit_s12_p16', 'xcit_s12_p8', 'timm_xcit_s12_p16',
                  'swin_t', 'r50', 'vit_s16', 'mask_rcnn_xcit_t12_p16', 'upernet_xcit_t12_p16']


# ----------------------------------------------------------------------------------------------
# Reference models (registered in the child process only)

def _register_reference_models() -> None:
    import timm
    import torch.nn.functional as F
    from mmengine.registry import MODELS as ROOT_MODELS
    from torch import nn

    from xcit_dense.models.xcit import PYRAMID_STRIDES, XCiT

    class BenchTimmXCiTPyramid(nn.Module):
        """timm's XCiT (``forward_intermediates``) and the dense pyramid in plain functional torch.

        The weights are those of ``source`` (this toolkit's XCiT), or of a fresh one.
        """

        def __init__(self, arch: str = 'small_12', patch_size: int = 16, source: Optional[XCiT] = None):
            super().__init__()
            if source is None:
                source = XCiT(arch=arch, patch_size=patch_size)
                source.init_weights()
            self.model = timm.create_model(f'xcit_{arch}_p{patch_size}_224', pretrained=False)
            self.indices = list(source.out_indices)
            self.patch_size = patch_size
            self.model.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)
            state = source.state_dict()
            missing, _ = self.model.load_state_dict({k: v for k, v in state.items() if not k.startswith('fpn')},
                                                    strict=False)
            if missing:
                raise RuntimeError(f'timm XCiT weights not shared: {missing[:5]}')
            for key, value in state.items():
                if key.startswith('fpn') and 'num_batches_tracked' not in key:
                    name = key.replace('.', '_')
                    if 'running' in key:
                        self.register_buffer(name, value.clone())
                    else:
                        self.register_parameter(name, nn.Parameter(value.clone()))

        def _convt(self, x, prefix):
            return F.conv_transpose2d(x, getattr(self, prefix + '_weight'), getattr(self, prefix + '_bias'), stride=2)

        def _bn(self, x, prefix):
            return F.batch_norm(x, getattr(self, prefix + '_running_mean'), getattr(self, prefix + '_running_var'),
                                getattr(self, prefix + '_weight'), getattr(self, prefix + '_bias'),
                                self.training, 0.1, 1e-5)

        def forward(self, x):
            height, width = x.shape[2:]
            maps = self.model.forward_intermediates(x, indices=self.indices, intermediates_only=True)
            if self.patch_size == 16:
                outs = [self._convt(F.gelu(self._bn(self._convt(maps[0], 'fpn1_0'), 'fpn1_1')), 'fpn1_3'),
                        self._convt(maps[1], 'fpn2_0'), maps[2], F.max_pool2d(maps[3], 2, ceil_mode=True)]
            else:
                outs = [self._convt(maps[0], 'fpn1_0'), maps[1], F.max_pool2d(maps[2], 2, ceil_mode=True),
                        F.max_pool2d(maps[3], 4, ceil_mode=True)]
            return tuple(o[:, :, :math.ceil(height / s), :math.ceil(width / s)]
                         for o, s in zip(outs, PYRAMID_STRIDES))

    class BenchTimmViT(nn.Module):
        """timm's plain ViT at any input size (global attention), its intermediate token maps."""

        def __init__(self, name: str = 'vit_small_patch16_224', indices=(3, 5, 7, 11)):
            super().__init__()
            self.model = timm.create_model(name, pretrained=False, dynamic_img_size=True)
            self.indices = list(indices)
            self.model.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)

        def forward(self, x):
            return tuple(self.model.forward_intermediates(x, indices=self.indices, intermediates_only=True))

    ROOT_MODELS.register_module(module=BenchTimmXCiTPyramid, force=True)
    ROOT_MODELS.register_module(module=BenchTimmViT, force=True)


# ----------------------------------------------------------------------------------------------
# Child process: build one configuration, measure it, print one JSON line

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


def _build(name: str, spec: dict, device):
    """The model and a step function running inference or one training step on random inputs."""
    import importlib

    import torch
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmengine.registry import DefaultScope

    import xcit_dense  # noqa: F401  (registers XCiT)
    info = MODELS.get(name) or dict(config=name)
    res, batch, train = spec['resolution'], spec['batch'], spec['mode'] == 'train'
    channels_last = spec['channels_last']
    torch.manual_seed(0)
    if 'config' in info:
        from xcit_dense.builder import build_model
        options = {'model.backbone.init_cfg': None}
        for key in ('with_cp', 'channels_last', 'compile'):
            if spec[key]:
                options[f'model.backbone.{key}'] = True
        model = build_model(info['config'], options)
        package = type(model).__module__.split('.')[0]
        if package == 'mmseg' and train:  # batch norm of the 1x1 pooled branch needs two images
            batch = spec['batch'] = max(batch, 2)
        inputs, samples = _samples(package, batch, res)
    else:
        cfg = dict(info['cfg'])
        is_xcit, is_timm = cfg['type'] == 'XCiT', cfg['type'].startswith('BenchTimm')
        if spec['with_cp'] and not is_timm:
            cfg['with_cp'] = True
        if is_xcit:
            cfg.update(channels_last=channels_last, compile=spec['compile'])
        if info['scope'] == 'mmengine':  # XCiT and the timm references: the root registry
            if is_timm:
                _register_reference_models()
            model = ROOT_MODELS.build(cfg)
        else:
            registry = importlib.import_module(f"{info['scope']}.registry").MODELS
            with DefaultScope.overwrite_default_scope(info['scope']):
                importlib.import_module(f"{info['scope']}.models")
                model = registry.build(cfg)
        if is_timm:
            model.model.set_grad_checkpointing(spec['with_cp'])
        if hasattr(model, 'init_weights'):
            model.init_weights()
        if channels_last and not is_xcit:
            model.to(memory_format=torch.channels_last)
        inputs, samples = torch.randn(batch, 3, res, res), None
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
    model.to(device)
    model.train(train)
    return model, _make_step(model, inputs.to(device), samples, spec, device)


def _make_step(model, inputs, samples, spec: dict, device) -> Callable:
    """One inference (no grad) or one training step: forward, a loss, backward."""
    import torch
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


def _samples(kind: str, batch: int, res: int):
    """Random inputs and annotated data samples for a whole mmdet or mmseg model."""
    import numpy as np
    import torch
    from mmengine.structures import InstanceData, PixelData
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(batch, 3, res, res, generator=gen)
    meta = dict(img_shape=(res, res), ori_shape=(res, res), pad_shape=(res, res), batch_input_shape=(res, res),
                scale_factor=(1.0, 1.0), padding_size=[0, 0, 0, 0])
    samples = []
    for _ in range(batch):
        if kind == 'mmdet':
            from mmdet.structures import DetDataSample
            from mmdet.structures.mask import BitmapMasks
            sample = DetDataSample(metainfo=meta)
            xy = torch.rand(3, 2, generator=gen) * res * 0.5
            wh = res * (0.1 + 0.4 * torch.rand(3, 2, generator=gen))
            boxes = torch.cat([xy, xy + wh], 1)
            masks = np.zeros((3, res, res), dtype=np.uint8)
            for i, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
                masks[i, y0:y1, x0:x1] = 1
            sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([0, 1, 2]),
                                               masks=BitmapMasks(masks, res, res))
        else:
            from mmseg.structures import SegDataSample
            sample = SegDataSample(metainfo=meta)
            sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, res, res), generator=gen))
        samples.append(sample)
    return inputs, samples


class _Timer:
    """Seconds of one call: CUDA events on a GPU, wall time on a CPU."""

    def __init__(self, device):
        self.cuda = device.type == 'cuda'

    def __call__(self, fn: Callable) -> float:
        import torch
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


def child(spec: dict) -> dict:
    """Measure one configuration (``spec``), or time two side by side (``spec['pair']``)."""
    import torch
    torch.set_num_threads(spec['threads'])
    device = torch.device(spec['device'])
    if spec.get('pair'):
        return _pair(spec, device)
    spec['requested_batch'] = spec['batch']
    model, step = _build(spec['model'], spec, device)
    timer = _Timer(device)
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
        tensor_peak = _tensor_peak(model, step)  # after the resident peak is read: the profiler costs memory
    if spec['compile'] and getattr(getattr(model, 'backbone', model), '_compile_failed', False):
        note = (note + '; ' if note else '') + 'compile fell back to eager'
    if spec['batch'] != spec.get('requested_batch', spec['batch']):
        note = (note + '; ' if note else '') + f"batch {spec['batch']}"
    per_image = [t / spec['batch'] for t in times]
    return dict(status='ok', time_ms=statistics.median(per_image) * 1e3, time_min_ms=min(per_image) * 1e3,
                time_max_ms=max(per_image) * 1e3, peak_mem_mb=peak / 2 ** 20, baseline_mem_mb=baseline / 2 ** 20,
                peak_tensor_mb=None if tensor_peak is None else tensor_peak / 2 ** 20, note=note)


def _tensor_peak(model, step) -> Optional[int]:
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


def _pair(spec: dict, device) -> dict:
    """Time variants of one model round-robin in one process (the order rotates every round).

    ``pair='timm'``: this toolkit's XCiT (``ours``), timm's XCiT plus the plain pyramid on the
    same weights (``timm``) and ours with ``channels_last`` (``ours_channels_last``); the ratio
    is ours / timm. ``pair='cp'``: one XCiT with ``with_cp`` on and off; the ratio is on / off.
    Ratios are of the medians.
    """
    import torch
    from mmengine.registry import MODELS as ROOT_MODELS
    base = dict(spec, pair=None, with_cp=False, channels_last=False)
    model, step = _build(spec['model'], base, device)
    if spec['pair'] == 'timm':
        _register_reference_models()
        ref = ROOT_MODELS.get('BenchTimmXCiTPyramid')(model.arch, model.patch_size, source=model).to(device)
        ref.train(spec['mode'] == 'train')
        fast, step_fast = _build(spec['model'], dict(base, channels_last=True), device)
        fast.load_state_dict(model.state_dict())
        x = torch.randn(spec['batch'], 3, spec['resolution'], spec['resolution'], device=device)
        variants = {'ours': step, 'timm': _make_step(ref, x, None, base, device), 'ours_channels_last': step_fast}
    else:
        def switch(flag: bool) -> Callable:
            def run():
                model.with_cp = flag
                step()
            return run
        variants = {'with_cp': switch(True), 'plain': switch(False)}
    timer, names = _Timer(device), list(variants)
    for _ in range(spec['warmup']):
        for name in names:
            timer(variants[name])
    runs = {name: [] for name in names}
    for i in range(spec['repeats']):
        for name in names[i % len(names):] + names[:i % len(names)]:
            runs[name].append(timer(variants[name]) / spec['batch'] * 1e3)
    times = {name: statistics.median(v) for name, v in runs.items()}
    first, second = names[:2]
    result = dict(status='ok', times_ms=times, runs_ms=runs, ratio=times[first] / times[second])
    if 'ours_channels_last' in times:
        result['ratio_channels_last'] = times['ours_channels_last'] / times['timm']
    return result


# ----------------------------------------------------------------------------------------------
# Parent: run each configuration in a fresh process, watch its memory and time

def _rss_bytes(pid: int) -> int:
    try:
        text = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return 0
    m = re.search(r'^VmRSS:\s+(\d+)', text, re.M)
    return int(m.group(1)) * 1024 if m else 0


def run_child(spec: dict, timeout: float, max_mem_gb: float) -> dict:
    """Run ``spec`` in a fresh interpreter; a memory or time limit kills it and says so."""
    cmd = [sys.executable, str(Path(__file__).resolve()), '--child', json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])),
               OMP_NUM_THREADS=str(spec['threads']))
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start, peak_rss, killed = time.time(), 0, None
    limit = max_mem_gb * 2 ** 30
    output = []
    import threading
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        rss = _rss_bytes(proc.pid)
        peak_rss = max(peak_rss, rss)
        if rss > limit:
            killed = f'skipped: over {max_mem_gb:g} GB'
        elif time.time() - start > timeout:
            killed = f'skipped: over {timeout:g} s'
        if killed:
            proc.kill()
            proc.wait()
            break
        time.sleep(0.1)
    reader.join(timeout=5)
    if killed:
        return dict(status='skipped', note=killed)
    for line in reversed(output):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = [line.strip() for line in output if line.strip()][-1:] or ['no output']
    return dict(status='error', note=f'exit {proc.returncode}: {tail[0][:200]}')


def _spec(args, model: str, res: int, mode: str, **overrides) -> dict:
    spec = dict(model=model, resolution=res, mode=mode, dtype=args.dtype, with_cp=args.with_cp,
                channels_last=args.channels_last, compile=args.compile, batch=args.batch_size,
                repeats=args.repeats, warmup=args.warmup, threads=args.threads, device=args.device,
                slow_s=args.slow_s)
    spec.update(overrides)
    return spec


def _kind(model: str) -> str:
    return MODELS[model]['kind'] if model in MODELS else 'config'


def _row(spec: dict, result: dict) -> dict:
    row = {k: spec.get(k) for k in CSV_COLUMNS}
    row.update(kind=_kind(spec['model']), status=result.get('status'), note=result.get('note', ''))
    for key in ('time_ms', 'time_min_ms', 'time_max_ms', 'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb'):
        row[key] = result.get(key)
    return row


def measure(args, jobs: List[dict], log=print, deadline: float = math.inf) -> List[dict]:
    """Run the jobs in order; after a limit is hit, larger resolutions of that model and mode are skipped."""
    rows, exceeded = [], {}
    for spec in jobs:
        key = (spec['model'], spec['mode'], spec['with_cp'])
        tag = f"{spec['model']}:{spec['mode']}:{spec['resolution']}"
        if any(fnmatch.fnmatch(tag, pattern) for pattern in args.skip):
            result = dict(status='skipped', note='skipped: not run, --skip')
        elif time.time() > deadline:
            result = dict(status='skipped', note='skipped: not run, --budget-s spent')
        elif key in exceeded and spec['resolution'] > exceeded[key][0]:
            result = dict(status='skipped', note=f'skipped: {exceeded[key][1]} at {exceeded[key][0]}')
        else:
            t0 = time.time()
            result = run_child(spec, args.timeout, args.max_mem_gb)
            if result['status'] == 'skipped':
                exceeded[key] = (spec['resolution'], result['note'].replace('skipped: ', ''))
            log(f"[{time.time() - t0:6.1f} s] {tag}{' cp' if spec['with_cp'] else ''}: {result['status']} "
                + (f"{result['time_ms']:.1f} ms, {result['peak_mem_mb']:.0f} MB" if result['status'] == 'ok'
                   else result.get('note', '')))
        rows.append(_row(spec, result))
    return rows


def _cell(row: Optional[dict]) -> str:
    if row is None:
        return ''
    if row['status'] != 'ok':
        return row['note'].replace('skipped: ', 'skipped (') + ')' if row['note'].startswith('skipped') \
            else f"{row['status']} (see CSV)"
    text = f"{row['time_ms']:.0f} ms / {_size(row['peak_mem_mb'])}"
    return text if row.get('peak_tensor_mb') is None else f"{text} ({_size(row['peak_tensor_mb'])})"


def _size(mb: float) -> str:
    return f'{mb / 1024:.2f} GB' if mb >= 1024 else f'{mb:.0f} MB'


def markdown(rows: List[dict], ratios: dict, header: str) -> str:
    """One table per mode: a row per model, a column per resolution, time and peak memory in the cells."""
    lines = [header, '']
    main = [r for r in rows if not r.get('extra')]
    resolutions = sorted({r['resolution'] for r in main})
    for mode in ('infer', 'train'):
        mode_rows = [r for r in main if r['mode'] == mode]
        if not mode_rows:
            continue
        title = 'Inference' if mode == 'infer' else 'Training step (forward + backward)'
        lines += [f'**{title}**: time per image / peak memory added (peak tensor memory)', '',
                  '| model | ' + ' | '.join(f'{r}^2' for r in resolutions) + ' |',
                  '|---|' + '---|' * len(resolutions)]
        for model in dict.fromkeys(r['model'] for r in mode_rows):
            cells = [_cell(next((r for r in mode_rows if r['model'] == model and r['resolution'] == res), None))
                     for res in resolutions]
            lines.append(f'| {model} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    extra = [r for r in rows if r.get('extra')]
    if extra:
        lines += ['Extra measurements for the ratios:', '', '| model | mode | resolution | with_cp | result |',
                  '|---|---|---|---|---|']
        lines += [f"| {r['model']} | {r['mode']} | {r['resolution']} | {r['with_cp']} | {_cell(r)} |" for r in extra]
        lines.append('')
    if ratios:
        lines += ['**Target ratios** (measured in this run)', '']
        lines += [f'- {text}' for text in ratios.get('summary', [])]
        lines.append('')
    return '\n'.join(lines)


def write_csv(rows: List[dict], path: Path) -> None:
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction='ignore')
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ('' if row.get(k) is None else
                                 round(row[k], 3) if isinstance(row[k], float) else row[k]) for k in CSV_COLUMNS})


def plot(rows: List[dict], path: Path, title: str) -> None:
    """Time per image and peak memory against resolution, one line per model, a column per mode."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    main = [r for r in rows if not r.get('extra')]
    modes = [m for m in ('infer', 'train') if any(r['mode'] == m for r in main)] or ['infer']
    panels = [('time_ms', 'time per image', 'ms', 1), ('peak_mem_mb', 'peak memory added', 'GB', 1024)]
    if any(r.get('peak_tensor_mb') is not None for r in main):
        panels.append(('peak_tensor_mb', 'peak tensor memory', 'GB', 1024))
    fig, axes = plt.subplots(len(panels), len(modes), figsize=(6.5 * len(modes), 4 * len(panels)), squeeze=False)
    for col, mode in enumerate(modes):
        name = 'inference' if mode == 'infer' else 'training step'
        for row, (key, what, unit, scale) in enumerate(panels):
            ax = axes[row][col]
            for model in dict.fromkeys(r['model'] for r in main):
                points = sorted((r['resolution'], r[key] / scale) for r in main if r['model'] == model
                                and r['mode'] == mode and r['status'] == 'ok' and r.get(key) is not None)
                if points:
                    ax.plot(*zip(*points), marker='o', linestyle='-' if model.startswith('xcit') else '--',
                            label=model)
            ax.set(title=f'{name}: {what}', xlabel='resolution (pixels per side)', ylabel=unit)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Ratios

def ratio_jobs(args) -> Tuple[List[dict], List[dict]]:
    """Extra fresh-process measurements and side-by-side timings that the three targets need.

    The extra runs are for memory: one timed run each.
    """
    extra, pairs = [], []
    have = {(m, r, mode) for m in args.backbones for r in args.resolutions for mode in args.modes}
    low, high = args.memory_resolutions
    vits = [v for v in ('vit_s16', 'mmseg_vit_s16') if v in args.backbones]
    for model in ['xcit_s12_p16'] + vits:
        for res in (low, high):
            if (model, res, 'infer') not in have:
                extra.append(_spec(args, model, res, 'infer', with_cp=False, extra=True, repeats=1))
    if args.with_cp or ('xcit_s12_p16', args.cp_resolution, 'train') not in have:
        extra.append(_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', with_cp=False, extra=True, repeats=1))
    extra.append(_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', with_cp=True, extra=True, repeats=1))
    twins = [m for m in args.backbones if m.startswith('xcit_') and f'timm_{m}' in args.backbones] or ['xcit_s12_p16']
    repeats = max(args.repeats, args.pair_repeats)
    for model in twins:
        for res in args.ratio_resolutions:
            pairs.append(_spec(args, model, res, 'infer', pair='timm', with_cp=False, repeats=repeats))
    pairs.append(_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', pair='cp', with_cp=False))
    return extra, pairs


def compute_ratios(args, rows: List[dict], pair_results: List[Tuple[dict, dict]]) -> dict:
    """The three targets from this run's rows and side-by-side timings, with a one-line verdict each.

    Memory targets are given for both measures: the peak memory added (resident size on a CPU)
    and the peak tensor memory.
    """
    metrics = (('peak_mem_mb', 'added'), ('peak_tensor_mb', 'tensors'))

    def peak(model, res, mode, with_cp=False):
        for r in rows:
            cp_ok = mode == 'infer' or bool(r['with_cp']) == with_cp  # no checkpointing without grad
            if (r['model'], r['resolution'], r['mode']) == (model, res, mode) and cp_ok and r['status'] == 'ok':
                return {k: r.get(k) for k, _ in metrics}
        return None

    out, summary = {'timm': [], 'memory': [], 'with_cp': {}}, []
    for spec, result in pair_results:
        if spec['pair'] != 'timm':
            continue
        entry = dict(model=spec['model'], resolution=spec['resolution'], status=result['status'])
        if result['status'] == 'ok':
            t = result['times_ms']
            entry.update(result)
            summary.append(
                f"(1) {spec['model']} vs timm XCiT + plain pyramid, inference at {spec['resolution']}^2: "
                f"{t['ours']:.0f} / {t['timm']:.0f} ms = **{result['ratio']:.3f}** (target <= 1.05: "
                f"{'met' if result['ratio'] <= 1.05 else 'NOT met'}); with channels_last=True "
                f"{t['ours_channels_last']:.0f} ms = {result['ratio_channels_last']:.3f}")
        else:
            summary.append(f"(1) {spec['model']} at {spec['resolution']}^2: {result.get('note')}")
        out['timm'].append(entry)
    low, high = args.memory_resolutions
    pixel_ratio = (high / low) ** 2
    for model in ['xcit_s12_p16'] + [v for v in ('vit_s16', 'mmseg_vit_s16') if v in args.backbones]:
        for mode in ('infer', 'train'):
            a, b = peak(model, high, mode), peak(model, low, mode)
            if not (a and b):
                if mode == 'infer':
                    summary.append(f'(2) {model}: {high}^2 / {low}^2 memory ratio not measured (a run was skipped)')
                continue
            parts = []
            for key, name in metrics:
                if a[key] is None or b[key] is None or b[key] <= 0:
                    continue
                ratio = a[key] / b[key]
                out['memory'].append(dict(model=model, mode=mode, measure=key, ratio=ratio,
                                          pixel_ratio=pixel_ratio, low_mb=b[key], high_mb=a[key]))
                verdict = ''
                if model.startswith('xcit'):
                    verdict = f", {'met' if abs(ratio / pixel_ratio - 1) <= 0.1 else 'NOT met'}"
                parts.append(f'{name} {a[key]:.0f} / {b[key]:.0f} MB = **{ratio:.2f}**{verdict}')
            what = 'inference' if mode == 'infer' else 'training'
            target = (f', target within 10%: {0.9 * pixel_ratio:.2f}-{1.1 * pixel_ratio:.2f}'
                      if model.startswith('xcit') else '')
            summary.append(f'(2) {model} {what} peak memory {high}^2 / {low}^2 (pixel ratio {pixel_ratio:.2f}'
                           f'{target}): ' + '; '.join(parts))
    res = args.cp_resolution
    plain, ckpt = peak('xcit_s12_p16', res, 'train'), peak('xcit_s12_p16', res, 'train', True)
    cp_pair = next((r for s, r in pair_results if s['pair'] == 'cp'), None)
    if plain and ckpt:
        parts = []
        for key, name in metrics:
            if plain[key] is None or ckpt[key] is None or plain[key] <= 0:
                continue
            cut = 1 - ckpt[key] / plain[key]
            out['with_cp'][key] = dict(plain_mb=plain[key], with_cp_mb=ckpt[key], cut=cut)
            parts.append(f"{name} {plain[key]:.0f} -> {ckpt[key]:.0f} MB, **{100 * cut:.0f}% less** "
                         f"({'met' if cut >= 0.4 else 'NOT met'})")
        text = f'(3) xcit_s12_p16 training at {res}^2, with_cp (target >= 40% less memory): ' + '; '.join(parts)
        if cp_pair and cp_pair['status'] == 'ok':
            extra, t = cp_pair['ratio'] - 1, cp_pair['times_ms']
            out['with_cp'].update(time_plain_ms=t['plain'], time_cp_ms=t['with_cp'], time_increase=extra)
            text += (f"; step time {t['plain']:.0f} -> {t['with_cp']:.0f} ms (side by side), "
                     f"**{100 * extra:+.0f}%** (target <= +35%: {'met' if extra <= 0.35 else 'NOT met'})")
        summary.append(text)
    else:
        summary.append(f'(3) with_cp at {res}^2: not measured (a run was skipped)')
    out['summary'] = summary
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backbones', nargs='+', default=DEFAULT_MODELS, metavar='NAME',
                        help=f'models to measure, of: {", ".join(MODELS)}')
    parser.add_argument('--config', nargs='*', default=[], help='also measure the whole models of these configs')
    parser.add_argument('--resolutions', nargs='+', type=int, default=[224, 512, 768, 1024, 1280, 1600])
    parser.add_argument('--repeats', type=int, default=5, help='timed runs (median reported)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed runs first')
    parser.add_argument('--mode', choices=('infer', 'train', 'both'), default='both')
    parser.add_argument('--dtype', choices=DTYPES, default='fp32', help='fp16/bf16: autocast')
    parser.add_argument('--with-cp', action='store_true', help='activation checkpointing in the backbones')
    parser.add_argument('--channels-last', action='store_true')
    parser.add_argument('--compile', action='store_true', help="torch.compile XCiT's forward")
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--device', default=None, help='cuda or cpu (default: cuda when available)')
    parser.add_argument('--threads', type=int, default=os.cpu_count(), help='CPU threads per run')
    parser.add_argument('--ratios', action='store_true', help='measure the three target ratios too')
    parser.add_argument('--ratio-resolutions', nargs='+', type=int, default=[512, 1024],
                        help='resolutions of the side-by-side XCiT / timm timing')
    parser.add_argument('--memory-resolutions', nargs=2, type=int, default=[1024, 1600], metavar=('LOW', 'HIGH'),
                        help='peak memory at HIGH over LOW against the pixel ratio')
    parser.add_argument('--cp-resolution', type=int, default=1024, help='resolution of the with_cp target')
    parser.add_argument('--slow-s', type=float, default=60,
                        help='a run whose last warm-up took longer than this is timed once')
    parser.add_argument('--pair-repeats', type=int, default=6,
                        help='timed runs of each side of the XCiT / timm ratio (at least --repeats)')
    parser.add_argument('--timeout', type=float, default=600, help='seconds per run before it is skipped')
    parser.add_argument('--max-mem-gb', type=float, default=20, help='memory per run before it is skipped')
    parser.add_argument('--budget-s', type=float, default=0,
                        help='wall-time budget: runs not started by then are marked skipped (0: none)')
    parser.add_argument('--skip', nargs='*', default=[], metavar='MODEL:MODE:RES',
                        help='fnmatch patterns of runs not to attempt, e.g. "vit_s16:train:1600"')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [m for m in args.backbones if m not in MODELS]
    if unknown:
        parser.error(f'unknown models {unknown}; choose from {", ".join(MODELS)}')
    args.backbones = list(args.backbones) + list(args.config)
    args.modes = ['infer', 'train'] if args.mode == 'both' else [args.mode]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        try:
            result = child(json.loads(args.child))
        except Exception as exc:  # reported as the run's status, the parent goes on
            import traceback
            traceback.print_exc()
            result = dict(status='error', note=f'{type(exc).__name__}: {str(exc).strip()[:200]}')
        print(RESULT_TAG + json.dumps(result), flush=True)
        return 0
    import torch
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cpu':
        hardware = f'CPU ({_cpu_name()}), {args.threads} thread(s)'
    else:
        hardware = torch.cuda.get_device_name(0)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [_spec(args, m, r, mode) for m in args.backbones for mode in args.modes for r in sorted(args.resolutions)]
    extra, pairs = ratio_jobs(args) if args.ratios else ([], [])
    t0, load_start = time.time(), _load()
    deadline = t0 + args.budget_s if args.budget_s else math.inf
    pair_results = []  # the side-by-side timings first: they are the targets
    for spec in pairs:
        start = time.time()
        if start > deadline:
            result = dict(status='skipped', note='skipped: not run, --budget-s spent')
        else:
            result = run_child(spec, args.timeout * 2, args.max_mem_gb)
        pair_results.append((spec, result))
        print(f"[{time.time() - start:6.1f} s] pair {spec['pair']} {spec['model']}:{spec['mode']}:"
              f"{spec['resolution']}: {result['status']} " +
              (', '.join(f'{k} {v:.0f} ms' for k, v in result['times_ms'].items()) + f", ratio {result['ratio']:.3f}"
               if result['status'] == 'ok' else result.get('note', '')))
    rows = measure(args, extra + jobs, deadline=deadline)
    for row, spec in zip(rows, extra + jobs):
        row['extra'] = bool(spec.get('extra'))
    ratios = compute_ratios(args, rows, pair_results) if args.ratios else {}
    options = ', '.join(f'{k}={v}' for k, v in (('dtype', args.dtype), ('with_cp', args.with_cp),
                                                ('channels_last', args.channels_last), ('compile', args.compile),
                                                ('batch', args.batch_size)))
    header = (f'Measured on {hardware}; torch {torch.__version__}; {options}; warm-up {args.warmup}, '
              f'median of {args.repeats} runs; each run in a fresh process; {time.time() - t0:.0f} s in all; '
              f'load average {load_start} at the start, {_load()} at the end.')
    text = markdown(rows, ratios, header)
    print(text)
    (out_dir / 'benchmark.md').write_text(text)
    write_csv(rows, out_dir / 'benchmark.csv')
    plot(rows, out_dir / 'benchmark.png', header if len(header) < 140 else f'{hardware}; {options}')
    if ratios:
        (out_dir / 'ratios.json').write_text(json.dumps(
            dict(ratios, pairs=[dict(spec=s, result=r) for s, r in pair_results]), indent=1))
    print(f'written: {out_dir}/benchmark.md, benchmark.csv, benchmark.png' + (', ratios.json' if ratios else ''))
    return 0


def _load() -> str:
    """The 1-minute load average (other work on the machine slows every run)."""
    try:
        return f'{os.getloadavg()[0]:.1f}'
    except OSError:
        return '?'


def _cpu_name() -> str:
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return 'unknown'


if __name__ == '__main__':
    sys.exit(main())
