"""Compile an mmcv wheel with its ops against the installed torch, showing progress.

Called by tools/install.sh; the wheel lands in --out and is reused by later installs.
It works around what stops mmcv 2.1.0 from building on torch 2.14: the build must see
torch (no build isolation) and torch's headers need C++20 where setup.py forces C++17.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PROGRESS = re.compile(r'^\[(\d+)/(\d+)\]\s.*?(\S+\.(?:cpp|cu|cc))\b')


def fetch_sdist(version: str, dest: Path) -> Path:
    """Download mmcv's source distribution (never a wheel) into dest."""
    subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
                    '--no-build-isolation', '-q', '-d', str(dest), f'mmcv=={version}'],
                   check=True)
    archives = list(dest.glob('mmcv-*.tar.gz'))
    if not archives:
        sys.exit(f'[build_mmcv] pip download produced no mmcv source archive in {dest}')
    return archives[0]


def patch_cxx_standard(src: Path) -> None:
    """Replace the hard-coded -std=c++17 (host and nvcc) by -std=c++20."""
    setup_py = src / 'setup.py'
    text = setup_py.read_text()
    if '-std=c++17' not in text:
        sys.exit(f'[build_mmcv] {setup_py} has no -std=c++17 to patch: unexpected mmcv source')
    setup_py.write_text(text.replace('-std=c++17', '-std=c++20'))


def build(src: Path, out: Path, log_path: Path) -> None:
    """Run bdist_wheel, printing one line per compiled file; the full log goes to log_path."""
    env = dict(os.environ, MMCV_WITH_OPS='1', MAX_JOBS=os.environ.get('MAX_JOBS', str(os.cpu_count() or 1)))
    cmd = [sys.executable, 'setup.py', 'bdist_wheel', '-d', str(out)]
    print(f'[build_mmcv] compiling mmcv ops with MAX_JOBS={env["MAX_JOBS"]} '
          f'FORCE_CUDA={env.get("FORCE_CUDA", "0")} '
          f'TORCH_CUDA_ARCH_LIST={env.get("TORCH_CUDA_ARCH_LIST", "-")}; '
          f'full log: {log_path}', flush=True)
    start = time.monotonic()
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log.write(line)
            m = PROGRESS.match(line)
            if m:
                done, total, name = m.groups()
                mins = (time.monotonic() - start) / 60
                print(f'[build_mmcv] [{done}/{total}] {mins:5.1f} min  {Path(name).name}', flush=True)
        rc = proc.wait()
    if rc != 0:
        tail = ''.join(open(log_path).readlines()[-40:])
        sys.exit(f'[build_mmcv] the build failed (exit {rc}); last lines of {log_path}:\n{tail}')
    print(f'[build_mmcv] built in {(time.monotonic() - start) / 60:.1f} min', flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--version', required=True, help='mmcv version to build')
    parser.add_argument('--out', required=True, type=Path, help='folder for the finished wheel')
    args = parser.parse_args()
    try:
        import torch  # noqa: F401  (the ops are compiled against it)
    except ImportError:
        sys.exit('[build_mmcv] torch must be installed before mmcv is built')
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix='mmcv-build-') as tmp:
        tmp = Path(tmp)
        archive = fetch_sdist(args.version, tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter='data')
        src = tmp / f'mmcv-{args.version}'
        patch_cxx_standard(src)
        staging = tmp / 'dist'
        build(src, staging, args.out / 'build.log')
        wheels = list(staging.glob('*.whl'))
        if not wheels:
            sys.exit('[build_mmcv] the build finished without producing a wheel')
        # Move into place last, so an interrupted build never leaves a wheel to reuse.
        shutil.move(str(wheels[0]), args.out / wheels[0].name)
        print(f'[build_mmcv] wheel: {args.out / wheels[0].name}', flush=True)


if __name__ == '__main__':
    main()
