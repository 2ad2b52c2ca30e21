"""The GPU check as one call on a lent machine without network (run by its own python3, which holds torch).

  python3 tools/misc/gpu_device_check.py --bundle .gpu_bundle --out "$OUT"              # on the GPU machine
  python3 tools/misc/gpu_device_check.py --bundle B --out O --device cpu --tiny --deadline-s 2400  # rehearsal

Phases, each under its own time limit and all within --deadline-s: probe the machine (GPU, driver,
torch) and print it; install the bundle's wheels (tools/misc/gpu_bundle.py: the stack with mmcv-lite)
with --no-deps into a --target folder put on PYTHONPATH beside the machine's torch, with the
toolkit's ``xcit_mmcv_ext.pth`` made effective there (``enable_pth_files``), the project from this
working tree; nothing is compiled. Then tools/misc/gpu_check.py, most valuable step first, each step
under its budget (``--tiny``: none), the last (compile) with what is left of the deadline. OUT
receives summary.json (rewritten after every phase), check.log, and gpu_check.json and
gpu_check.md (rewritten after every step): four files, flat (what such a machine sends back is at
most 8 files). Exits 1 when a phase or a step failed.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from .bounded import run_bounded

ROOT = Path(__file__).resolve().parents[1]
PHASE_LIMITS = dict(probe=20, install=50)  # seconds, each phase whole (the install includes its import check)
SMI_LIMIT_S = 8  # of the probe's limit, what nvidia-smi may take
DEADLINE_S = 360  # the whole call: 6 minutes leave a second try within the 15 minutes of device time a check gets
CHECK_EXIT_S = 5  # of the deadline, what the check leaves itself to end


class Summary:
    """summary.json in OUT: one entry per phase, rewritten after each."""

    def __init__(self, out: Path):
        self.out, self.data = out, dict(phases={}, started=time.strftime('%Y-%m-%d %H:%M:%S'))

    def add(self, phase: str, **entry) -> None:
        """Record a phase and rewrite summary.json at once."""
        self.data['phases'][phase] = entry
        tmp = self.out / '.summary.json.tmp'
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.out / 'summary.json')
        print(f'[device_check] {phase}: ' + ', '.join(f'{k}={v}' for k, v in entry.items() if k != 'probe'),
              flush=True)


def run(cmd: List[str], limit: float, env: Optional[Dict[str, str]] = None,
        log: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``run_bounded`` from the repository root, at least 1 s; the output is appended to log when
    given, else captured. returncode is 'timeout' when cut."""
    if log is None:
        return run_bounded(cmd, max(limit, 1), cwd=ROOT, env=env)
    with open(log, 'a') as out:
        return run_bounded(cmd, max(limit, 1), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def probe(env: Dict[str, str]) -> dict:
    """What the machine holds: GPU and driver (nvidia-smi), Python, torch and what it sees."""
    info = dict(python=platform.python_version(), executable=sys.executable, cpus=os.cpu_count(),
                disk_free_gb=round(shutil.disk_usage('/tmp').free / 2 ** 30, 1))
    start = time.monotonic()
    smi = run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total,compute_cap', '--format=csv,noheader'],
              SMI_LIMIT_S, env) if shutil.which('nvidia-smi') else None
    info['nvidia_smi'] = smi.stdout.strip() if smi and smi.returncode == 0 else None
    code = ('import json, torch; c = torch.cuda.is_available(); print(json.dumps(dict(torch=torch.__version__, '
            'cuda=torch.version.cuda, cuda_available=c, gpu=torch.cuda.get_device_name(0) if c else None, '
            "capability='%d.%d' % torch.cuda.get_device_capability(0) if c else None)))")
    proc = run([sys.executable, '-c', code], PHASE_LIMITS['probe'] - (time.monotonic() - start), env)
    info['torch'] = json.loads(proc.stdout) if proc.returncode == 0 else f'error: {proc.stderr[-500:]}'
    return info


def install_bundle(bundle: Path, site: Path, env: Dict[str, str], limit: float) -> subprocess.CompletedProcess:
    """pip install the bundle's wheels with --no-deps, offline, into site."""
    wheels = sorted(str(p) for p in (bundle / 'wheels').glob('*.whl'))
    return run([sys.executable, '-m', 'pip', 'install', '-q', '--disable-pip-version-check', '--no-index', '--no-deps',
                '--no-compile', '--no-cache-dir', '--upgrade', '--target', str(site), *wheels], limit, env)


def enable_pth_files(site: Path) -> None:
    """Make every Python started with ``site`` on PYTHONPATH run site's .pth files, as it would in
    site-packages: the toolkit's ``xcit_mmcv_ext.pth`` (the finder that serves ``mmcv._ext`` beside
    mmcv-lite) in particular. A ``--target`` folder on PYTHONPATH is a plain path entry whose .pth
    files Python never reads; a ``sitecustomize`` module, which Python imports at start from the
    first path entry holding one, runs ``site.addsitedir`` on its own folder instead. The machine's
    Python is a virtual environment without a sitecustomize of its own, so none is shadowed."""
    shutil.copy(ROOT / 'xcit_mmcv_ext' / 'xcit_mmcv_ext.pth', site / 'xcit_mmcv_ext.pth')
    shutil.copy(Path(__file__).with_name('target_sitecustomize.py'), site / 'sitecustomize.py')


def main(argv: Optional[List[str]] = None) -> int:
    """tools/misc/gpu_device_check.py's command line: every phase; 1 when a phase or a step failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--bundle', type=Path, required=True, help="tools/misc/gpu_bundle.py's output folder")
    parser.add_argument('--out', type=Path, required=True, help='results (at most 8 files come back from $OUT)')
    parser.add_argument('--work', type=Path, default=Path('/tmp/xcit-device-check'), help='scratch folder')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--tiny', action='store_true', help='tiny check steps, no step budgets (a CPU rehearsal)')
    parser.add_argument('--steps', nargs='+', help="only these of the check's steps (default: all)")
    parser.add_argument('--deadline-s', type=float, default=DEADLINE_S,
                        help=f'the whole call, all phases (default {DEADLINE_S} s)')
    args = parser.parse_args(argv)
    start = time.monotonic()

    def left() -> float:
        return args.deadline_s - (time.monotonic() - start)

    args.out.mkdir(parents=True, exist_ok=True)
    site = args.work / 'site'
    site.mkdir(parents=True, exist_ok=True)
    summary = Summary(args.out)
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get('PYTHONPATH')])))

    t = time.monotonic()
    info = probe(env)
    print(json.dumps(info, indent=1), flush=True)
    summary.add('probe', seconds=round(time.monotonic() - t, 1), probe=info)

    t = time.monotonic()
    limit = min(PHASE_LIMITS['install'], left())
    proc = install_bundle(args.bundle, site, env, limit)
    installed = proc.returncode == 0
    if installed:
        enable_pth_files(site)
        imports = run([sys.executable, '-c', 'import mmcv.ops, mmdet.models, mmseg.models, xcit_dense'],
                      limit - (time.monotonic() - t), env)
        installed = imports.returncode == 0
        error = None if installed else f'the stack does not import: {imports.stderr[-800:]}'
    else:
        error = f'pip exited {proc.returncode}: {proc.stderr[-800:]}'
    summary.add('install', seconds=round(time.monotonic() - t, 1), ok=installed, error=error)
    if not installed:
        return 1

    t = time.monotonic()
    # the check writes gpu_check.json and .md into OUT itself, after each step: a call cut short keeps them
    cmd = [sys.executable, str(ROOT / 'tools/misc/gpu_check.py'), '--out-dir', str(args.out), '--device', args.device]
    cmd += ['--tiny'] if args.tiny else ['--gpu-budgets']
    cmd += ['--deadline-s', f'{left() - CHECK_EXIT_S:.0f}']  # the last step (compile) gets what is left
    if args.steps:
        cmd += ['--steps', *args.steps]
    check = run(cmd, left(), env, log=args.out / 'check.log')
    summary.add('check', seconds=round(time.monotonic() - t, 1), exit_status=check.returncode,
                killed_after_s=check.killed_after_s, total_seconds=round(time.monotonic() - start, 1))
    return 0 if check.returncode == 0 else 1
