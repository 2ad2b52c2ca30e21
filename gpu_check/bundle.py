"""Gather, here where the network is, what a lent GPU machine (no network) lacks for the GPU check.

  python tools/misc/gpu_bundle.py                       # .gpu_bundle/ (git-ignored), for Python 3.12
  python tools/misc/gpu_bundle.py --python-version 3.11 --out /tmp/bundle311   # a rehearsal on this Python

Into OUT: wheels/ holds the wheels of requirements/gpu_bundle.txt for that Python (the stack with
mmcv-lite, whose mmcv._ext the toolkit's xcit_mmcv_ext serves: nothing is compiled there; installed
there with --no-deps: mmcv and mmengine ask for opencv-python, the machine has
opencv-python-headless), manifest.json their sizes and hashes. It then checks that every
requirement of a bundled wheel is bundled at a fitting version or among what the machine has
(MACHINE_HAS), and that pip resolves the bundle offline for that Python, as the machine's install will.
Exits 1, naming them, when either check fails.
"""
import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import List, Optional

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / 'requirements' / 'gpu_bundle.txt'
# What the lent machine's image holds that the bundled packages require (its python3 has them:
# /work/.library/device/KINDS.md lists them); opencv-python-headless stands for opencv-python.
MACHINE_HAS = frozenset({'numpy', 'matplotlib', 'scipy', 'pyyaml', 'rich', 'tqdm', 'six', 'packaging',
                         'pillow', 'regex', 'opencv-python', 'torch', 'torchvision', 'timm', 'nvidia-ml-py'})
PLATFORMS = ('manylinux_2_28_x86_64', 'manylinux_2_27_x86_64', 'manylinux_2_24_x86_64',
             'manylinux_2_17_x86_64', 'manylinux2014_x86_64', 'manylinux1_x86_64')


def download_wheels(dest: Path, python_version: str) -> None:
    """pip download every pinned wheel of requirements/gpu_bundle.txt for that CPython on x86-64 Linux."""
    cmd = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '-q', '--no-deps',
           '--only-binary=:all:', '--python-version', python_version, '--implementation', 'cp',
           *[arg for platform in PLATFORMS for arg in ('--platform', platform)], '-d', str(dest),
           '-r', str(REQUIREMENTS)]
    subprocess.run(cmd, check=True, stdout=sys.stderr, timeout=900)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The Requires-Dist entries of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith('.dist-info/METADATA'))
        lines = zf.read(meta).decode().splitlines()
    return [Requirement(line.split(':', 1)[1].strip()) for line in lines if line.startswith('Requires-Dist:')]


def unmet_requirements(wheels: list[Path], python_version: str) -> list[str]:
    """What a bundled wheel requires (for that Python, no extras) that neither the bundle, at a
    version it allows, nor the machine provides; one line each."""
    bundled = {canonicalize_name(parse_wheel_filename(w.name)[0]): parse_wheel_filename(w.name)[1] for w in wheels}
    env = {'python_version': python_version, 'python_full_version': f'{python_version}.0', 'extra': ''}
    unmet = []
    for wheel in wheels:
        for req in wheel_requirements(wheel):
            name = canonicalize_name(req.name)
            if req.marker and not req.marker.evaluate(env):
                continue
            if name in bundled:
                if not req.specifier.contains(bundled[name], prereleases=True):
                    unmet.append(f'{wheel.name} requires {req}, the bundle has {name} {bundled[name]}')
            elif name not in MACHINE_HAS:
                unmet.append(f'{wheel.name} requires {req}: neither bundled nor on the machine')
    return unmet


def offline_resolution(wheel_dir: Path, python_version: str) -> subprocess.CompletedProcess:
    """``pip install --dry-run --no-index`` of the bundle for that Python into a target folder, as on the machine."""
    with tempfile.TemporaryDirectory(prefix='gpu-bundle-target-') as target:
        return subprocess.run(
            [sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check', '--dry-run', '--no-index',
             '--no-deps', '--find-links', str(wheel_dir), '--python-version', python_version,
             '--only-binary=:all:', '--target', target, '-r', str(REQUIREMENTS)],
            capture_output=True, text=True, timeout=300)


def write_manifest(out: Path, python_version: str) -> dict:
    """manifest.json: each bundled file's size and sha256, and the bundle's total size."""
    files = sorted(p for p in out.rglob('*') if p.is_file() and p.name != 'manifest.json')
    entries = {str(p.relative_to(out)): dict(bytes=p.stat().st_size,
                                             sha256=hashlib.sha256(p.read_bytes()).hexdigest()) for p in files}
    manifest = dict(python_version=python_version, files=entries,
                    total_bytes=sum(e['bytes'] for e in entries.values()))
    (out / 'manifest.json').write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: Optional[List[str]] = None) -> None:
    """tools/misc/gpu_bundle.py's command line: gather the bundle, exit 1 naming what it lacks."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', type=Path, default=ROOT / '.gpu_bundle')
    parser.add_argument('--python-version', default='3.12', help="the GPU machine's Python (default 3.12)")
    args = parser.parse_args(argv)
    wheel_dir = args.out / 'wheels'
    wheel_dir.mkdir(parents=True, exist_ok=True)
    download_wheels(wheel_dir, args.python_version)
    wheels = sorted(wheel_dir.glob('*.whl'))
    manifest = write_manifest(args.out, args.python_version)
    print(f'[gpu_bundle] {len(wheels)} wheels in {args.out}: '
          f'{manifest["total_bytes"] / 2 ** 20:.1f} MiB')
    problems = unmet_requirements(wheels, args.python_version)
    proc = offline_resolution(wheel_dir, args.python_version)
    if proc.returncode:
        problems.append(f'pip does not resolve the bundle offline for Python {args.python_version}:\n'
                        f'{proc.stderr[-2000:]}')
    if problems:
        sys.exit('[gpu_bundle] error:\n  ' + '\n  '.join(problems))
    print(f'[gpu_bundle] every requirement is bundled or on the machine; pip resolves it offline for '
          f'Python {args.python_version}')

