"""The GPU check as one call on a lent machine without network (run by its own python3, which holds torch).

  python3 tools/gpu_device_check.py --bundle .gpu_bundle --out "$OUT"              # on the GPU machine
  python3 tools/gpu_device_check.py --bundle B --out O --device cpu --tiny --deadline-s 3600  # rehearsal

Phases, each under its own time limit and all within --deadline-s: probe the machine (GPU, driver,
nvcc, torch) and print it; install the bundle's wheels (tools/gpu_bundle.py) with --no-deps into a
--target folder put on PYTHONPATH beside the machine's torch, the project from this working tree;
build mmcv's ops for the GPU present from the bundled source with the machine's nvcc (nms and
RoIAlign only unless --full-build); run tools/gpu_check.py, most valuable step first, each step
under its budget. If the build fails, mmcv's Python modules are copied from its source without
the compiled ops (xcit_dense imports mmcv.cnn) and the steps that need no compiled op still run. OUT receives,
rewritten after every phase, summary.json, build.log, check.log, gpu_check.json and gpu_check.md
(five files, flat: what such a machine sends back is at most 8 files). Exits 1 when a phase or a
step failed.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from .bounded import run_bounded

ROOT = Path(__file__).resolve().parents[1]
MMCV_VERSION = (ROOT / 'requirements' / 'mmcv.txt').read_text().split('mmcv==')[1].split()[0]
SUBSET_OPS = 'nms,roi_align'  # all that mmdet's Mask R-CNN calls
# Seconds per check step on the GPU machine, in the check's order (most valuable first); 270 in all.
# This script runs before the stack is installed, so it cannot import the check: the tests hold
# these names to xcit_dense.acceptance.gpu_check's STEPS and NEEDS_NO_COMPILED_OP.
GPU_BUDGETS = dict(ops=20, det_train=100, seg_train=40, launch=40, compile=40, benchmark=30)
STEPS = tuple(GPU_BUDGETS)
NEEDS_NO_COMPILED_OP = ('compile', 'benchmark')
PHASE_LIMITS = dict(install=120, build_subset=180, build_full=420)  # seconds; the probe takes a few


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
    """What the machine holds: GPU and driver (nvidia-smi), nvcc, Python, torch and what it sees."""
    info = dict(python=platform.python_version(), executable=sys.executable, cpus=os.cpu_count(),
                disk_free_gb=round(shutil.disk_usage('/tmp').free / 2 ** 30, 1))
    smi = run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total,compute_cap', '--format=csv,noheader'],
              30, env) if shutil.which('nvidia-smi') else None
    info['nvidia_smi'] = smi.stdout.strip() if smi and smi.returncode == 0 else None
    nvcc = shutil.which('nvcc') or next((str(p) for p in [Path(env.get('CUDA_HOME', '/usr/local/cuda')) / 'bin/nvcc']
                                         if p.exists()), None)
    info['nvcc'] = run([nvcc, '--version'], 30, env).stdout.strip().splitlines()[-2:] if nvcc else None
    code = ('import json, torch; c = torch.cuda.is_available(); print(json.dumps(dict(torch=torch.__version__, '
            'cuda=torch.version.cuda, cuda_available=c, gpu=torch.cuda.get_device_name(0) if c else None, '
            "capability='%d.%d' % torch.cuda.get_device_capability(0) if c else None)))")
    proc = run([sys.executable, '-c', code], 60, env)
    info['torch'] = json.loads(proc.stdout) if proc.returncode == 0 else f'error: {proc.stderr[-500:]}'
    return info


def install_bundle(bundle: Path, site: Path, env: Dict[str, str], limit: float) -> subprocess.CompletedProcess:
    """pip install the bundle's wheels with --no-deps, offline, into site."""
    wheels = sorted(str(p) for p in (bundle / 'wheels').glob('*.whl'))
    return run([sys.executable, '-m', 'pip', 'install', '-q', '--disable-pip-version-check', '--no-index', '--no-deps',
                '--no-compile', '--no-cache-dir', '--upgrade', '--target', str(site), *wheels], limit, env)


def build_mmcv(bundle: Path, work: Path, site: Path, env: Dict[str, str], full: bool, limit: float,
               log: Path) -> Optional[str]:
    """Compile mmcv from the bundled source (the GPU present, else CPU ops) and install it into site;
    None when it worked, else why not."""
    cmd = [sys.executable, str(ROOT / 'tools/build_mmcv.py'), '--version', MMCV_VERSION, '--cache', str(work / 'cache'),
           '--sdist', str(bundle / 'src' / f'mmcv-{MMCV_VERSION}.tar.gz'), '--offline']
    build_env = dict(env, MAX_JOBS=env.get('MAX_JOBS', str(os.cpu_count() or 1)))
    with open(log, 'a') as f:
        proc = run_bounded(cmd + ([] if full else ['--ops', SUBSET_OPS]), limit, cwd=ROOT, env=build_env, stderr=f)
    if proc.returncode == 'timeout':
        return f'the build ran past its {limit:.0f} s'
    wheel = proc.stdout.strip()
    if proc.returncode != 0 or not wheel:
        return f'tools/build_mmcv.py exited {proc.returncode} (see build.log)'
    installed = run([sys.executable, '-m', 'pip', 'install', '-q', '--disable-pip-version-check', '--no-index',
                     '--no-deps', '--no-compile', '--target', str(site), wheel], 120, env)
    if installed.returncode != 0:
        return f'installing {wheel} failed: {installed.stderr[-500:]}'
    imports = run([sys.executable, '-c', 'from mmcv.ops import nms, RoIAlign; import mmdet.models, mmseg.models'],
                  120, env)
    return None if imports.returncode == 0 else f'the built mmcv does not import: {imports.stderr[-800:]}'


def install_mmcv_without_ops(sdist: Path, site: Path) -> Optional[str]:
    """Copy mmcv's Python package from its source archive into site, without compiled ops (mmcv.cnn
    imports, mmcv.ops does not); None when it worked, else why not."""
    try:
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split('/')[0]
            members = [m for m in tar.getmembers() if m.name.startswith(f'{top}/mmcv/')]
            for member in members:
                member.name = member.name[len(top) + 1:]
            tar.extractall(site, members=members, filter='data')
    except (OSError, EOFError, tarfile.TarError) as exc:
        return f'{type(exc).__name__}: {exc}'
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """tools/gpu_device_check.py's command line: every phase; 1 when a phase or a step failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--bundle', type=Path, required=True, help="tools/gpu_bundle.py's output folder")
    parser.add_argument('--out', type=Path, required=True, help='results (at most 8 files come back from $OUT)')
    parser.add_argument('--work', type=Path, default=Path('/tmp/xcit-device-check'), help='scratch folder')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--tiny', action='store_true', help='tiny check steps, no step budgets (a CPU rehearsal)')
    parser.add_argument('--full-build', action='store_true', help='every mmcv op (about 5 min on 16 cores)')
    parser.add_argument('--skip-build', action='store_true', help='no mmcv: only the steps that need none')
    parser.add_argument('--deadline-s', type=float, default=480, help='the whole call, all phases (default 8 min)')
    parser.add_argument('--build-limit-s', type=float, help='cut the build past this (default: 180 s, full 420 s)')
    args = parser.parse_args(argv)
    start = time.monotonic()

    def left() -> float:
        return args.deadline_s - (time.monotonic() - start)

    args.out.mkdir(parents=True, exist_ok=True)
    site, check_dir = args.work / 'site', args.work / 'check'
    shutil.rmtree(check_dir, ignore_errors=True)
    site.mkdir(parents=True, exist_ok=True)
    summary = Summary(args.out)
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get('PYTHONPATH')])))

    t = time.monotonic()
    info = probe(env)
    print(json.dumps(info, indent=1), flush=True)
    summary.add('probe', seconds=round(time.monotonic() - t, 1), probe=info)

    t = time.monotonic()
    proc = install_bundle(args.bundle, site, env, min(PHASE_LIMITS['install'], left()))
    installed = proc.returncode == 0
    summary.add('install', seconds=round(time.monotonic() - t, 1), ok=installed,
                error=None if installed else f'pip exited {proc.returncode}: {proc.stderr[-800:]}')
    if not installed:
        return 1

    t = time.monotonic()
    if args.skip_build:
        build_error = 'skipped (--skip-build)'
    else:
        limit = args.build_limit_s or PHASE_LIMITS['build_full' if args.full_build else 'build_subset']
        build_error = build_mmcv(args.bundle, args.work, site, env, args.full_build, min(limit, left() - 60),
                                 args.out / 'build.log')
    summary.add('build', seconds=round(time.monotonic() - t, 1), ok=build_error is None, error=build_error,
                ops='all' if args.full_build else SUBSET_OPS)
    if build_error is not None:
        copy_error = install_mmcv_without_ops(args.bundle / 'src' / f'mmcv-{MMCV_VERSION}.tar.gz', site)
        summary.add('mmcv_without_ops', ok=copy_error is None, error=copy_error)

    t = time.monotonic()
    steps = list(STEPS) if build_error is None else list(NEEDS_NO_COMPILED_OP)
    cmd = [sys.executable, str(ROOT / 'tools/gpu_check.py'), '--out-dir', str(check_dir), '--device', args.device,
           '--steps', *steps]
    if args.tiny:
        cmd.append('--tiny')
    else:
        cmd += ['--budget', *[f'{s}={GPU_BUDGETS[s]}' for s in steps]]
    check = run(cmd, left(), env, log=args.out / 'check.log')
    for name in ('gpu_check.json', 'gpu_check.md'):
        if (check_dir / name).is_file():
            shutil.copy(check_dir / name, args.out / name)
    summary.add('check', seconds=round(time.monotonic() - t, 1), exit_status=check.returncode, steps=steps,
                total_seconds=round(time.monotonic() - start, 1))
    return 0 if build_error in (None, 'skipped (--skip-build)') and check.returncode == 0 else 1

