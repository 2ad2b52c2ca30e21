"""The benchmark's runs: each configuration in a fresh process under memory and time limits, then the outputs."""
import argparse
import fnmatch
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Tuple

from .catalogue import ROOT
from .measure import RESULT_TAG
from .report import markdown, plot, result_row, write_csv
from .targets import compute_ratios


def _rss_bytes(pid: int) -> int:
    try:
        text = Path(f'/proc/{pid}/status').read_text()
    except OSError:
        return 0
    m = re.search(r'^VmRSS:\s+(\d+)', text, re.M)
    return int(m.group(1)) * 1024 if m else 0


def run_child(spec: dict, timeout: float, max_mem_gb: float) -> dict:
    """Run ``spec`` in a fresh interpreter; a memory or time limit kills it and says so."""
    cmd = [sys.executable, '-m', 'benchmarks.measure', json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])),
               OMP_NUM_THREADS=str(spec['threads']))
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start, peak_rss, killed = time.time(), 0, None
    limit = max_mem_gb * 2 ** 30
    output: List[str] = []
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


def job_spec(args: argparse.Namespace, model: str, res: int, mode: str, **overrides) -> dict:
    """The settings of one run: the command line's, with ``overrides`` on top."""
    spec = dict(model=model, resolution=res, mode=mode, dtype=args.dtype, with_cp=args.with_cp,
                channels_last=args.channels_last, compile=args.compile, batch=args.batch_size,
                repeats=args.repeats, warmup=args.warmup, threads=args.threads, device=args.device,
                slow_s=args.slow_s)
    spec.update(overrides)
    return spec


def run_jobs(args: argparse.Namespace, jobs: List[dict], log: Callable[[str], None] = print,
             deadline: float = math.inf) -> List[dict]:
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
        rows.append(result_row(spec, result))
    return rows


def ratio_jobs(args: argparse.Namespace) -> Tuple[List[dict], List[dict]]:
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
                extra.append(job_spec(args, model, res, 'infer', with_cp=False, extra=True, repeats=1))
    if args.with_cp or ('xcit_s12_p16', args.cp_resolution, 'train') not in have:
        extra.append(job_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', with_cp=False, extra=True,
                              repeats=1))
    extra.append(job_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', with_cp=True, extra=True, repeats=1))
    twins = [m for m in args.backbones if m.startswith('xcit_') and f'timm_{m}' in args.backbones] or ['xcit_s12_p16']
    repeats = max(args.repeats, args.pair_repeats)
    for model in twins:
        for res in args.ratio_resolutions:
            pairs.append(job_spec(args, model, res, 'infer', pair='timm', with_cp=False, repeats=repeats))
    pairs.append(job_spec(args, 'xcit_s12_p16', args.cp_resolution, 'train', pair='cp', with_cp=False))
    return extra, pairs


def run_pairs(args: argparse.Namespace, pairs: List[dict], deadline: float) -> List[Tuple[dict, dict]]:
    """The side-by-side timings, each in a fresh process with twice the time limit, logged as they end."""
    pair_results = []
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
    return pair_results


def run_benchmark(args: argparse.Namespace) -> int:
    """Every run the parsed command line asks for, then benchmark.md (also printed), CSV, plot and ratios.json."""
    import torch
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cpu':
        hardware = f'CPU ({cpu_name()}), {args.threads} thread(s)'
    else:
        hardware = torch.cuda.get_device_name(0)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [job_spec(args, m, r, mode) for m in args.backbones for mode in args.modes
            for r in sorted(args.resolutions)]
    extra, pairs = ratio_jobs(args) if args.ratios else ([], [])
    t0, load_start = time.time(), load_average()
    deadline = t0 + args.budget_s if args.budget_s else math.inf
    pair_results = run_pairs(args, pairs, deadline)  # the side-by-side timings first: they are the targets
    rows = run_jobs(args, extra + jobs, deadline=deadline)
    for row, spec in zip(rows, extra + jobs):
        row['extra'] = bool(spec.get('extra'))
    ratios = compute_ratios(args, rows, pair_results) if args.ratios else {}
    options = ', '.join(f'{k}={v}' for k, v in (('dtype', args.dtype), ('with_cp', args.with_cp),
                                                ('channels_last', args.channels_last), ('compile', args.compile),
                                                ('batch', args.batch_size)))
    header = (f'Measured on {hardware}; torch {torch.__version__}; {options}; warm-up {args.warmup}, '
              f'median of {args.repeats} runs; each run in a fresh process; {time.time() - t0:.0f} s in all; '
              f'load average {load_start} at the start, {load_average()} at the end.')
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


def load_average() -> str:
    """The 1-minute load average (other work on the machine slows every run)."""
    try:
        return f'{os.getloadavg()[0]:.1f}'
    except OSError:
        return '?'


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, for the table's header."""
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return 'unknown'
