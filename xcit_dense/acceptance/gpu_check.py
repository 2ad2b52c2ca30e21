"""The prepared GPU check of a machine (``tools/gpu_check.py``): results in OUT_DIR/gpu_check.{json,md},
exit status 1 when a step failed.

Six steps, most valuable first, each written to ``gpu_check.json`` and ``gpu_check.md`` as soon
as it is measured (a check cut short keeps what it measured): the installed mmcv ops against the
golden outputs of compiled mmcv 2.1.0 (``ops_goldens.py``);
a training iteration of Mask R-CNN (XCiT-S12/16 and mmdet's Swin-T) and of UperNet XCiT-S12/16 in
fp32, fp16 (dynamic loss scaling) and bf16; a one-process run through ``tools/dist_train.sh``;
``torch.compile`` of the backbone; the benchmark (written after each backbone). Each step may have
a time budget, past which it is cut and recorded as such. A step fails when it raises and when its
results say so (see ``step_failures``). ``tiny=True`` runs every step at tiny sizes, on a CPU too.
"""
import argparse
import csv
import importlib
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from xcit_launch.bounded import run_bounded

from . import ops_goldens
from benchmarks.measure import Timer, random_samples
from ..engine import check_cuda_ops
from ..tasks import task_of_model

ROOT = Path(__file__).resolve().parents[2]
PRECISIONS = {'fp32': None, 'fp16': torch.float16, 'bf16': torch.bfloat16}
# Known to fail, and why: mmcv's CPU RoIAlign has no half kernel ("expected scalar type Float but found Half").
CPU_DET_SKIP = {'fp16': "not run: mmcv's CPU RoIAlign has no half-precision kernel"}
SWIN_T_MASK_RCNN = 'swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'  # in mmdet's installed configs
LAUNCH_TIMEOUT_S = 600  # far below NCCL's 30-minute collective timeout
STEPS = ('ops', 'det_train', 'seg_train', 'launch', 'compile', 'benchmark')  # most valuable first
NEEDS_NO_COMPILED_OP = ('compile', 'benchmark')  # what still runs where mmcv's ops failed to build


class StepBudgetExceeded(BaseException):
    """Raised inside a step when its time budget has run out (a BaseException: no step swallows it)."""


class Report:
    """The check's results, rewritten to disk after every step."""

    def __init__(self, out_dir: Path, header: dict):
        self.out_dir = out_dir
        self.data = dict(header=header, steps={})
        out_dir.mkdir(parents=True, exist_ok=True)

    def add(self, step: str, result: dict) -> None:
        """Record one step's result and write both files at once (atomically)."""
        self.data['steps'][step] = result
        for name, text in (('gpu_check.json', json.dumps(self.data, indent=2, default=float)),
                           ('gpu_check.md', self.markdown())):
            tmp = self.out_dir / f'.{name}.tmp'
            tmp.write_text(text)
            os.replace(tmp, self.out_dir / name)

    def markdown(self) -> str:
        """The results as markdown tables, one section per step."""
        head = self.data['header']
        lines = [f"# GPU check: {head['device_name']}", '',
                 f"torch {head['torch']}, CUDA {head['cuda']}, mmcv {head['mmcv']}, tiny: {head['tiny']}", '']
        for step, result in self.data['steps'].items():
            lines += [f'## {step}', '']
            if result.get('failed'):
                lines += [f'FAILED: {reason}' for reason in result['failed']] + ['']
            if 'error' in result:
                lines += [f"error: {result['error']}", '']
                continue
            rows = result.get('rows', [])
            if rows:
                keys = list(dict.fromkeys(k for row in rows for k in row))
                lines += ['| ' + ' | '.join(keys) + ' |', '|' + '---|' * len(keys)]
                lines += ['| ' + ' | '.join(_fmt(row.get(k)) for k in keys) + ' |' for row in rows]
                lines.append('')
            lines += [f'- {k}: {_fmt(v)}' for k, v in result.items() if k not in ('rows', 'failed')] + ['']
        return '\n'.join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f'{value:.4g}'
    return '' if value is None else str(value)


def header(device: torch.device, tiny: bool) -> dict:
    """What the check ran on (mmcv None where it is not installed: only steps without it can run)."""
    try:
        import mmcv
        mmcv_version = mmcv.__version__
    except ImportError:
        mmcv_version = None
    cuda = device.type == 'cuda'
    return dict(device=str(device), tiny=tiny, torch=torch.__version__, cuda=torch.version.cuda,
                mmcv=mmcv_version,
                device_name=torch.cuda.get_device_name(device) if cuda else 'CPU',
                capability='%d.%d' % torch.cuda.get_device_capability(device) if cuda else None,
                time=time.strftime('%Y-%m-%d %H:%M:%S'))


# 1. compiled ops --------------------------------------------------------------------------

def check_ops(device: torch.device) -> dict:
    """The installed mmcv ops on ``device`` against compiled mmcv 2.1.0's golden outputs (ops_goldens.py)."""
    return ops_goldens.compare(ops_goldens.load_goldens(), device)


# 2.-3. training iterations ---------------------------------------------------------------

def _train_model(config: str, device: torch.device, tiny: bool):
    from xcit_dense.builder import build_model
    options = {'model.backbone.init_cfg': None}
    if tiny and 'xcit' in config:
        options.update({'model.backbone.depth': 4, 'model.backbone.embed_dims': 64,
                        'model.backbone.num_heads': 4, 'model.backbone.out_indices': (0, 1, 2, 3)})
        if 'upernet' in config:
            options.update({'model.decode_head.in_channels': [64] * 4, 'model.decode_head.channels': 32,
                            'model.auxiliary_head.in_channels': 64, 'model.auxiliary_head.channels': 16})
        else:  # and few proposals and RoIs: a CPU spends its time there otherwise
            options.update({'model.neck.in_channels': [64] * 4,
                            'model.train_cfg.rpn_proposal.nms_pre': 200,
                            'model.train_cfg.rpn_proposal.max_per_img': 100,
                            'model.train_cfg.rcnn.sampler.num': 64})
    torch.manual_seed(0)
    model = build_model(config, options, init=False)
    return model.to(device).train()


def train_iterations(config: str, size: Tuple[int, int], batch: int, device: torch.device,
                     tiny: bool, iters: int, warmup: int, skip: Optional[Dict[str, str]] = None) -> List[dict]:
    """Seconds per iteration (median after warm-up), peak allocated memory and the first
    iteration's losses of SGD training steps in each precision, from the same weights; the
    precisions in ``skip`` are not run, their rows say why."""
    rows = []
    fp32_loss = None
    for precision, dtype in PRECISIONS.items():
        if precision in (skip or {}):
            rows.append(dict(precision=precision, skipped=skip[precision]))
            continue
        model = _train_model(config, device, tiny)
        inputs, samples = random_samples(task_of_model(model), batch, size)
        inputs, samples = inputs.to(device), [s.to(device) for s in samples]
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
        scaler = torch.amp.GradScaler(device.type, enabled=precision == 'fp16')
        timer, losses, times = Timer(device), None, []
        if device.type == 'cuda':
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        try:
            for i in range(warmup + iters):
                def step() -> Dict[str, float]:
                    optimizer.zero_grad(set_to_none=True)
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        parsed, log_vars = model.parse_losses(model.loss(inputs, samples))
                    scaler.scale(parsed).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    return {k: float(v) for k, v in log_vars.items()}
                holder = {}
                seconds = timer(lambda: holder.update(step()))
                losses = losses or holder
                if i >= warmup:
                    times.append(seconds)
        except RuntimeError as exc:  # e.g. an unsupported precision on this device
            rows.append(dict(precision=precision, error=str(exc).splitlines()[0]))
            continue
        if precision == 'fp32':
            fp32_loss = losses['loss']
        rel = None if fp32_loss is None else abs(losses['loss'] - fp32_loss) / max(abs(fp32_loss), 1e-12)
        rows.append(dict(precision=precision, s_per_iter=statistics.median(times),
                         peak_alloc_gb=(torch.cuda.max_memory_allocated(device) / 2 ** 30
                                        if device.type == 'cuda' else None),
                         loss=losses['loss'], loss_rel_to_fp32=rel,
                         losses=', '.join(f'{k}={v:.4f}' for k, v in losses.items() if k != 'loss')))
        del model, optimizer
    return rows


# 4. the benchmark -------------------------------------------------------------------------

def benchmark_plan(tiny: bool) -> Tuple[List[str], List[str], str]:
    """The backbones, resolutions and mode the benchmark step measures."""
    if tiny:
        return ['xcit_t12_p16', 'xcit_t12_p8'], ['64'], 'infer'
    return ['xcit_s12_p16', 'swin_t', 'xcit_s12_p8', 'vit_s16', 'r50'], ['512', '1024', '1600'], 'both'


def run_benchmark_tool(device: torch.device, tiny: bool, out_dir: Path,
                       on_rows: Callable[[List[dict]], None] = lambda rows: None,
                       deadline: float = math.inf) -> dict:
    """tools/benchmark.py on ``device``, one command per backbone (each run in fresh processes),
    within the time left before ``deadline`` (time.monotonic()); ``on_rows`` gets the rows so far
    after each backbone, so that a step cut short keeps what it measured."""
    models, resolutions, mode = benchmark_plan(tiny)
    rows: List[dict] = []
    for model in models:
        left = deadline - time.monotonic()
        if left < 5:
            rows += [dict(model=model, resolution=r, mode=mode, status='skipped', note='step budget spent')
                     for r in resolutions]
            continue
        bench_dir = out_dir / 'benchmark' / model
        cmd = [sys.executable, str(ROOT / 'tools/benchmark.py'), '--backbones', model, '--resolutions',
               *resolutions, '--mode', mode, '--device', device.type, '--out-dir', str(bench_dir)]
        if math.isfinite(left):
            cmd += ['--budget-s', str(int(left))]
        if tiny:
            cmd += ['--repeats', '1', '--warmup', '0', '--threads', '1']
        proc = run_bounded(cmd, timeout=min(left, 3600))
        if proc.returncode != 0 or not (bench_dir / 'benchmark.csv').is_file():
            rows.append(dict(model=model, mode=mode, status='error',
                             note=f'tools/benchmark.py exited {proc.returncode}: {proc.stderr[-300:]}'))
        else:
            with open(bench_dir / 'benchmark.csv') as f:
                rows += [dict(model=r['model'], resolution=r['resolution'], mode=r['mode'], status=r['status'],
                              time_ms=float(r['time_ms'] or 'nan'), peak_mem_mb=float(r['peak_mem_mb'] or 'nan'),
                              note=r.get('note', '')) for r in csv.DictReader(f)]
        on_rows(rows)
    return dict(rows=rows, tables=str(out_dir / 'benchmark'))


# 5. torch.compile ---------------------------------------------------------------------------

def compile_backbone(device: torch.device, tiny: bool, repeats: int) -> dict:
    """Speed-up of ``torch.compile`` on the XCiT backbone's inference and its largest difference
    (tiny: the aot_eager backend, which traces the same graphs without inductor's C++ build)."""
    import xcit_dense
    torch.manual_seed(0)
    cfg = (dict(arch='tiny_12', depth=4, embed_dims=64, num_heads=4, out_indices=(0, 1, 2, 3)) if tiny
           else dict(arch='small_12'))
    model = xcit_dense.XCiT(**cfg).to(device).eval()
    size = 64 if tiny else 1024
    x = torch.randn(1, 3, size, size, device=device)
    backend = 'aot_eager' if tiny else 'inductor'
    compiled = torch.compile(model, backend=backend)
    timer = Timer(device)
    with torch.no_grad():
        eager_out, compiled_out = model(x), compiled(x)  # the compiled call here compiles
        eager = statistics.median(timer(lambda: model(x)) for _ in range(repeats))
        fast = statistics.median(timer(lambda: compiled(x)) for _ in range(repeats))
    diff = max((a - b).abs().max().item() for a, b in zip(eager_out, compiled_out))
    return dict(backend=backend, resolution=size, eager_ms=eager * 1e3, compiled_ms=fast * 1e3, speedup=eager / fast,
                max_abs_diff=diff)


# 6. a launched run ---------------------------------------------------------------------------

def launch_run(device: torch.device, work: Path) -> dict:
    """A one-process run of a few iterations through tools/dist_train.sh: backend and SyncBN."""
    from xcit_dense.datasets.synthetic import write_segmentation_set
    data = work / 'data'
    for split, count in (('training', 4), ('validation', 2)):
        write_segmentation_set(data, split, count, size=(64, 64), seed=0 if split == 'training' else 1)
    config = work / 'launch_check.py'
    config.write_text(
        f"_base_ = [{str(ROOT / 'configs/demo/upernet_xcit_tiny_12_p16_demo.py')!r}]\n"
        "sync = dict(type='SyncBN', requires_grad=True)\n"
        "model = dict(data_preprocessor=dict(size=(64, 64)), backbone=dict(norm_cfg=sync),\n"
        "             decode_head=dict(norm_cfg=sync), auxiliary_head=dict(norm_cfg=sync))\n"
        f"train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,\n"
        f"                        dataset=dict(data_root={str(data)!r}))\n"
        f"val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,\n"
        f"                      dataset=dict(data_root={str(data)!r}))\n"
        "test_dataloader = val_dataloader\n"
        "train_cfg = dict(max_iters=3, val_interval=3)\n"
        "default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=3))\n")
    env = dict(os.environ, PORT=str(_free_port()), PYTHON=sys.executable)
    proc = run_bounded(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '1', '--work-dir', str(work / 'run')],
                       timeout=LAUNCH_TIMEOUT_S, env=env)
    out = proc.stdout + proc.stderr
    plan = re.search(r'Run plan: [^\n]*', out)
    return dict(exit_status=proc.returncode, plan=plan.group(0) if plan else None,
                backend=(re.search(r'backend (\w+)', plan.group(0)).group(1) if plan else None),
                syncbn_kept='SyncBN replaced by BN' not in out,
                expected_backend='nccl' if device.type == 'cuda' else 'gloo',
                output_tail=out[-1500:] if proc.returncode != 0 else None)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# the whole check ------------------------------------------------------------------------------

def step_failures(step: str, result: dict) -> List[str]:
    """Why a step's results say it failed (empty: it passed): an exception or a cut, rows with an
    error (a precision the device refused, a benchmark run that broke), ops that disagree, a
    launched run that did not exit 0 or ran on another backend than the device's."""
    reasons = [f"error: {result['error']}"] if 'error' in result else []
    for row in result.get('rows', []):
        label = ' '.join(str(row[k]) for k in ('op', 'model', 'precision', 'resolution', 'mode') if k in row)
        if 'error' in row:
            reasons.append(f"{label}: {row['error']}")
        elif row.get('status') == 'error':
            reasons.append(f"{label}: {row.get('note', 'error')}")
    if step == 'ops' and 'rows' in result:
        reasons += [f'{failure} (against the goldens)' for failure in ops_goldens.failures(result)]
    if step == 'ops' and result.get('all_ok') is False and not reasons:
        reasons.append('all_ok is False')
    if step == 'launch' and 'error' not in result:
        if result.get('exit_status') != 0:
            reasons.append(f"the launched run exited {result.get('exit_status')}")
        if result.get('backend') != result.get('expected_backend'):
            reasons.append(f"backend {result.get('backend')}, {result.get('expected_backend')} expected")
    return reasons


def run_check(device: torch.device, tiny: bool, out_dir: Path, steps: Optional[List[str]] = None,
              log: Callable[[str], None] = lambda line: print(line, flush=True),
              budgets: Optional[Dict[str, float]] = None) -> dict:
    """Run the chosen steps (all by default, in ``STEPS`` order), writing each result as soon as it
    is measured; a step over its budget (seconds, ``budgets``) is cut; a failing step is recorded
    with its reasons (``failed``) and the next one runs."""
    report = Report(out_dir, header(device, tiny))
    budgets = budgets or {}
    iters, warmup = (1, 0) if tiny else (5, 3)
    det_size, seg_size = ((96, 64), (64, 64)) if tiny else ((800, 1333), (512, 512))
    det = str(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py')
    seg = str(ROOT / 'configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py')
    swin = None if tiny else str(Path(importlib.import_module('mmdet').__file__).parent / '.mim/configs' / SWIN_T_MASK_RCNN)

    def benchmark(deadline: float) -> dict:
        def progress(rows: List[dict]) -> None:
            report.add('benchmark', dict(rows=list(rows), partial=True))
            log(f'[gpu_check] benchmark: {len(rows)} rows written')
        return run_benchmark_tool(device, tiny, out_dir, progress, deadline)

    plan = {
        'ops': lambda deadline: check_ops(device),
        'det_train': lambda deadline: dict(rows=[
            dict(model=name, **row)
            for name, cfg in (('Mask R-CNN XCiT-S12/16', det), ('Mask R-CNN Swin-T (mmdet)', swin)) if cfg
            for row in train_iterations(cfg, det_size, 2, device, tiny, iters, warmup,
                                        CPU_DET_SKIP if device.type == 'cpu' else None)], size=det_size),
        'seg_train': lambda deadline: dict(rows=[dict(model='UperNet XCiT-S12/16', **row) for row in
                                                 train_iterations(seg, seg_size, 2, device, tiny, iters, warmup)],
                                           size=seg_size),
        'launch': lambda deadline: _with_tmp(lambda tmp: launch_run(device, tmp)),
        'compile': lambda deadline: compile_backbone(device, tiny, repeats=3 if tiny else 10),
        'benchmark': benchmark,
    }
    for step in steps or list(STEPS):
        start = time.monotonic()
        budget = budgets.get(step)
        log(f'[gpu_check] {step} ...' + (f' (budget {budget:g} s)' if budget else ''))
        try:
            with _budget(budget):
                result = plan[step](start + budget if budget else math.inf)
        except StepBudgetExceeded:
            result = dict(error=f'cut: over its budget of {budget:g} s', cut=True)
        except Exception as exc:  # noqa: BLE001  (a step's failure is a result; the others go on)
            result = dict(error=f'{type(exc).__name__}: {exc}', traceback=traceback.format_exc(limit=5))
        result['seconds'] = time.monotonic() - start
        result['failed'] = step_failures(step, result)
        report.add(step, result)
        log(f"[gpu_check] {step}: {'FAILED: ' + '; '.join(result['failed']) if result['failed'] else 'passed'} "
            f"({result['seconds']:.0f} s)")
    return report.data


def failed_steps(data: dict) -> List[str]:
    """The steps of a check's results that failed."""
    return [step for step, result in data['steps'].items() if result.get('failed')]


class _budget:
    """Raise StepBudgetExceeded in the main thread once ``seconds`` have passed (None: no limit).

    A step stuck inside one long C call is interrupted when that call returns to Python; the
    subprocesses of the steps have their own timeouts (run_bounded). A cut never lands inside an
    import: it waits for the import to end, since a module cut half-way cannot be imported again
    (torch's operators and mmengine's registries refuse a second registration of the same name)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds

    def __enter__(self) -> None:
        if self.seconds:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc) -> None:
        if self.seconds:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)

    @staticmethod
    def _expire(signum, frame) -> None:
        if _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, IMPORT_RETRY_S)
            return
        raise StepBudgetExceeded()


IMPORT_RETRY_S = 0.05  # how soon a cut that came during an import is tried again


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are among its callers)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith('<frozen importlib'):
            return True
        frame = frame.f_back
    return False


def _with_tmp(fn: Callable[[Path], dict]) -> dict:
    with tempfile.TemporaryDirectory(prefix='gpu-check-') as tmp:
        return fn(Path(tmp))


def parse_budgets(items: List[str]) -> Dict[str, float]:
    """--budget STEP=SECONDS ... as a dict; SystemExit naming a bad item."""
    budgets = {}
    for item in items:
        step, _, seconds = item.partition('=')
        try:
            if step not in STEPS or float(seconds) <= 0:
                raise ValueError
        except ValueError:
            sys.exit(f'error: --budget {item!r}: expected STEP=SECONDS with STEP one of {", ".join(STEPS)}')
        budgets[step] = float(seconds)
    return budgets


def main(argv: Optional[List[str]] = None) -> int:
    """tools/gpu_check.py's command line: run the check; return its exit status (1 when a step failed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out-dir', type=Path, required=True)
    parser.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    parser.add_argument('--tiny', action='store_true', help='tiny models and sizes (for a CPU, or a quick look)')
    parser.add_argument('--steps', nargs='+', choices=STEPS, help='only these steps (default: all)')
    parser.add_argument('--budget', nargs='+', default=[], metavar='STEP=SECONDS',
                        help='cut a step past this many seconds (it then fails)')
    args = parser.parse_args(argv)
    budgets = parse_budgets(args.budget)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        sys.exit('error: no CUDA device is visible: run on a GPU machine, or pass --device cpu --tiny')
    if device.type == 'cuda':
        try:
            check_cuda_ops()
        except RuntimeError as exc:
            sys.exit(f'error: {exc}')
    data = run_check(device, args.tiny, args.out_dir, args.steps, budgets=budgets)
    failed = failed_steps(data)
    print(f'[gpu_check] results: {args.out_dir / "gpu_check.md"}')
    if failed:
        print(f'error: steps failed: {", ".join(failed)}', file=sys.stderr)
    return 1 if failed else 0
