"""Find or compile an mmcv wheel with its ops (CPU, or CPU + CUDA) for the installed torch.

Run by tools/install.sh as tools/misc/build_mmcv.py, before the package is installed (standard library
only until ``main`` imports torch): prints the path of the wheel to install on stdout (nothing
when the installed mmcv already fits), everything else on stderr. Wheels are kept under
<cache>/wheels/<key>/, where the key names everything the binary depends on, and reused.
It works around what stops mmcv 2.1.0 from building on torch 2.14: the build must see
torch (no build isolation) and torch's headers need C++20 (from 2.13) where setup.py forces C++17.
--sdist builds from a source archive at hand (no download: a machine without network), --ops
from a subset of the ops (see xcit_launch/mmcv_subset.py), --offline never reaches for PyPI's compiler.

Environment: XCIT_MMCV_CUDA (auto: CUDA ops when a GPU is visible; 1: always; 0: never),
TORCH_CUDA_ARCH_LIST (e.g. "8.0;9.0+PTX"; default: the GPUs present), MAX_JOBS.
CUDA ops are compiled with a system CUDA toolkit (CUDA_HOME, nvcc on PATH or /usr/local/cuda)
when its major version is torch's, else with NVIDIA's PyPI compiler at torch's pinned version,
installed into this virtual environment.
"""
import argparse
import fcntl
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import mmcv_subset
from .cuda_arch import parse_arch_list

PROGRESS = re.compile(r'^\[(\d+)/(\d+)\]\s.*?(\S+\.(?:cpp|cu|cc))\b')
NVCC_RELEASE = re.compile(r'release (\d+)\.(\d+)')
TOOLKIT_PIN = re.compile(r'^cuda-toolkit(?:\[[^\]]*\])?\s*==\s*(\d+\.\d+(?:\.\d+)*)')
SYSTEM_CUDA_DEFAULT = Path('/usr/local/cuda')
# Included by torch's ATen/cuda headers, which mmcv's kernels include: a toolkit without them cannot build.
TORCH_CUDA_HEADERS = ('cuda_runtime_api.h', 'cusparse.h', 'cublas_v2.h', 'cublasLt.h', 'cusolverDn.h')
CXX20_FROM_TORCH = (2, 13)  # torch 2.13's headers warn under C++17, 2.14's refuse it


class BuildError(Exception):
    """The mmcv wheel cannot be found or built; the message says why (``main`` prints it and exits 1)."""


def log(msg: str) -> None:
    """Print one progress line on stderr (stdout carries only the wheel path)."""
    print(f'[build_mmcv] {msg}', file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit to compile with: its root (CUDA_HOME) and release (major, minor)."""
    home: Path
    version: tuple[int, int]


@dataclass(frozen=True)
class Request:
    """What the build must contain: CUDA ops or not, and for which architectures."""
    cuda: bool
    archs: tuple[str, ...] = ()


def resolve_request(mode: str, arch_env: str, gpu_archs: list[str], torch_cuda: Optional[str]) -> Request:
    """Turn XCIT_MMCV_CUDA, TORCH_CUDA_ARCH_LIST and the GPUs present into a build request."""
    if mode not in ('auto', '0', '1'):
        raise ValueError(f"XCIT_MMCV_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == '0' or (mode == 'auto' and not (gpu_archs and torch_cuda)):
        return Request(cuda=False)
    if not torch_cuda:
        raise ValueError('XCIT_MMCV_CUDA=1 but the installed torch is built without CUDA')
    if arch_env.strip():
        return Request(cuda=True, archs=parse_arch_list(arch_env))
    if not gpu_archs:
        raise ValueError("no GPU visible: set TORCH_CUDA_ARCH_LIST (e.g. '8.0;9.0')")
    return Request(cuda=True, archs=parse_arch_list(';'.join(gpu_archs)))


def wheel_tag() -> str:
    """The interpreter and platform tags of the wheels this Python builds, e.g. cp311-cp311-linux_x86_64."""
    py = f'cp{sys.version_info.major}{sys.version_info.minor}'
    return f'{py}-{py}-' + re.sub(r'[^A-Za-z0-9]', '_', sysconfig.get_platform())


def cache_key(mmcv_version: str, tag: str, torch_version: str,
              cuda_version: Optional[tuple[int, int]], archs: tuple[str, ...], ops: tuple[str, ...] = ()) -> str:
    """The cache folder name of a build: mmcv, Python/platform tag, torch, CUDA, architectures and,
    for a build of some ops only, those ops."""
    key = f'mmcv-{mmcv_version}-{tag}-torch{torch_version}'
    ops_part = '-ops_' + '+'.join(ops) if ops else ''
    if cuda_version is None:
        return f'{key}-cpu{ops_part}'
    arch_part = '-'.join('sm_' + a.replace('.', '').replace('+PTX', '+ptx') for a in archs)
    return f'{key}-cu{cuda_version[0]}.{cuda_version[1]}-{arch_part}{ops_part}'


def find_wheel(folder: Path, mmcv_version: str, tag: str) -> Optional[Path]:
    """A finished wheel in folder for this version and tag (temporary names never match)."""
    path = folder / f'mmcv-{mmcv_version}-{tag}.whl'
    return path if path.is_file() else None


def publish(built: Path, folder: Path) -> Path:
    """Copy built into folder under a temporary name, then rename it into place atomically."""
    final = folder / built.name
    fd, tmp = tempfile.mkstemp(prefix=f'.{built.name}.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as dst, open(built, 'rb') as src:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def obtain_wheel(folder: Path, mmcv_version: str, tag: str, build_into: Callable[[Path], Path]) -> Path:
    """Return the cached wheel, or build it under an exclusive lock and publish it atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = find_wheel(folder, mmcv_version, tag)
    if wheel:
        log(f'reusing the mmcv wheel built before: {wheel}')
        return wheel
    with open(folder / '.lock', 'w') as lock:
        if not _try_lock(lock):
            log(f'another install is building into {folder}: waiting for it')
            fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = find_wheel(folder, mmcv_version, tag)
        if wheel:
            log(f'reusing the mmcv wheel another install has just built: {wheel}')
            return wheel
        with tempfile.TemporaryDirectory(prefix='mmcv-wheel-') as staging:
            wheel = publish(build_into(Path(staging)), folder)
    log(f'wheel: {wheel}')
    return wheel


def _try_lock(lock) -> bool:
    """Take the exclusive lock if it is free; False when another process holds it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def nvcc_version(nvcc: Path) -> Optional[tuple[int, int]]:
    """The release (major, minor) that `nvcc --version` reports, None when it does not run."""
    try:
        out = subprocess.run([str(nvcc), '--version'], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = NVCC_RELEASE.search(out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def nvcc_root(nvcc: Path) -> Path:
    """The toolkit an nvcc belongs to, as nvcc itself reports it (a wrapper script may sit elsewhere)."""
    try:
        out = subprocess.run([str(nvcc), '--dryrun', '-c', '-x', 'cu', os.devnull, '-o', os.devnull],
                             capture_output=True, text=True, timeout=60)
        m = re.search(r'^#\$ _HERE_=(.+)$', out.stdout + out.stderr, re.MULTILINE)
    except (OSError, subprocess.TimeoutExpired):
        m = None
    return Path(m.group(1).strip()).parent if m else nvcc.parent.parent


def find_system_toolkit(env: dict, default: Path = SYSTEM_CUDA_DEFAULT) -> Optional[Path]:
    """The system toolkit's root, looked up as torch does: CUDA_HOME/CUDA_PATH, nvcc on PATH, default."""
    home = env.get('CUDA_HOME') or env.get('CUDA_PATH')
    if home:
        return Path(home)
    nvcc = shutil.which('nvcc', path=env.get('PATH', ''))
    if nvcc:
        return nvcc_root(Path(nvcc))
    return default if (default / 'bin' / 'nvcc').exists() else None


def cuda_lib_dir(home: Path) -> str:
    """The library folder torch's extension builder links from: lib64, or lib when only it exists."""
    return 'lib' if not (home / 'lib64').exists() and (home / 'lib').exists() else 'lib64'


def toolkit_missing(home: Path) -> list[str]:
    """What a toolkit at home lacks for the build, as paths under it (empty: it has all of it)."""
    wanted = [f'include/{h}' for h in TORCH_CUDA_HEADERS] + [f'{cuda_lib_dir(home)}/libcudart.so']
    return [path for path in wanted if not (home / path).exists()]


def choose_system_toolkit(torch_cuda: str, env: dict, default: Path = SYSTEM_CUDA_DEFAULT) -> Optional[Toolkit]:
    """A system toolkit that can build against torch (its CUDA major version, its headers), else None, saying why."""
    home = find_system_toolkit(env, default)
    if home is None:
        log('no system CUDA toolkit (CUDA_HOME, nvcc on PATH, /usr/local/cuda)')
        return None
    version = nvcc_version(home / 'bin' / 'nvcc')
    want = tuple(int(x) for x in torch_cuda.split('.')[:2])
    if version is None:
        log(f'the system CUDA toolkit at {home} has no working bin/nvcc')
        return None
    found = f'{version[0]}.{version[1]}'
    if version[0] != want[0]:
        log(f'the system CUDA toolkit at {home} is CUDA {found}, but torch was built with CUDA '
            f'{torch_cuda}: the major versions differ, so it cannot be used')
        return None
    missing = toolkit_missing(home)
    if missing:
        log(f'the system CUDA toolkit at {home} (CUDA {found}) lacks {", ".join(missing)}, which the build '
            'needs (torch\'s CUDA headers include the headers; the link needs libcudart.so), so it cannot be used')
        return None
    if version != want:
        log(f'warning: the system CUDA toolkit at {home} is CUDA {found}, torch was built with '
            f'CUDA {torch_cuda}; minor versions differ, which torch accepts')
    return Toolkit(home, version)


def toolkit_pin(requirements: list[str]) -> Optional[str]:
    """The exact cuda-toolkit version among a distribution's requirements (torch 2.14.1: 13.0.3)."""
    for req in requirements:
        m = TOOLKIT_PIN.match(req)
        if m:
            return m.group(1)
    return None


def pypi_toolkit_home(pin: str) -> Path:
    """Where NVIDIA's PyPI wheels of that version put the toolkit in this environment."""
    return Path(sysconfig.get_paths()['purelib']) / 'nvidia' / f'cu{pin.split(".")[0]}'


def install_pypi_toolkit(pin: str) -> Toolkit:
    """Install nvcc, CCCL and the crt headers at exactly pin into this environment, link what torch needs."""
    log(f'installing NVIDIA\'s CUDA compiler {pin} from PyPI into {sys.prefix}')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check', '-q',
                    f'cuda-toolkit[nvcc,cccl,crt]=={pin}'], check=True, stdout=sys.stderr)
    home = pypi_toolkit_home(pin)
    major = pin.split('.')[0]
    if not (home / 'lib64').exists():
        (home / 'lib64').symlink_to('lib')
    cudart = home / 'lib' / 'libcudart.so'
    if not cudart.exists():
        cudart.symlink_to(f'libcudart.so.{major}')
    version = nvcc_version(home / 'bin' / 'nvcc')
    if version != tuple(int(x) for x in pin.split('.')[:2]):
        raise BuildError(f'{home}/bin/nvcc reports release {version} after installing cuda-toolkit {pin}')
    return Toolkit(home, version)


def build_env(request: Request, toolkit: Optional[Toolkit]) -> dict:
    """The environment of mmcv's setup.py for this request and toolkit."""
    env = dict(os.environ, MMCV_WITH_OPS='1', MAX_JOBS=os.environ.get('MAX_JOBS', str(os.cpu_count() or 1)))
    if not request.cuda:
        return dict(env, FORCE_CUDA='0', CUDA_VISIBLE_DEVICES='')
    return dict(env, FORCE_CUDA='1', CUDA_HOME=str(toolkit.home), TORCH_CUDA_ARCH_LIST=';'.join(request.archs),
                PATH=f'{toolkit.home / "bin"}{os.pathsep}{env.get("PATH", "")}')


def fetch_sdist(version: str, dest: Path) -> Path:
    """Download mmcv's source distribution (never a wheel) into dest."""
    subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
                    '--no-build-isolation', '-q', '-d', str(dest), f'mmcv=={version}'],
                   check=True, stdout=sys.stderr)
    archives = list(dest.glob('mmcv-*.tar.gz'))
    if not archives:
        raise BuildError(f'pip download produced no mmcv source archive in {dest}')
    return archives[0]


def cxx_standard(torch_version: str) -> str:
    """The C++ standard to compile with: C++20 from torch 2.13 on, else setup.py's own C++17."""
    release = tuple(int(x) for x in re.findall(r'\d+', torch_version)[:2])
    return 'c++20' if release >= CXX20_FROM_TORCH else 'c++17'


def patch_cxx_standard(src: Path, standard: str) -> None:
    """Replace the hard-coded -std=c++17 (host and nvcc) by -std=<standard> (nothing for c++17)."""
    setup_py = src / 'setup.py'
    text = setup_py.read_text()
    if '-std=c++17' not in text:
        raise BuildError(f'{setup_py} has no -std=c++17 to patch: unexpected mmcv source')
    setup_py.write_text(text.replace('-std=c++17', f'-std={standard}'))


def write_build_info(src: Path, key: str, torch_version: str, toolkit: Optional[Toolkit],
                     archs: tuple[str, ...], ops: tuple[str, ...] = ()) -> None:
    """Add mmcv/xcit_build_info.py to the source: what the compiled ops are built for."""
    cuda = None if toolkit is None else f'{toolkit.version[0]}.{toolkit.version[1]}'
    (src / 'mmcv' / 'xcit_build_info.py').write_text(
        '"""Written by xcit-dense\'s tools/misc/build_mmcv.py: what this mmcv\'s compiled ops were built for."""\n'
        f'CACHE_KEY = {key!r}\n'
        f'TORCH_VERSION = {torch_version!r}\n'
        f'CUDA_VERSION = {cuda!r}  # None: CPU ops only\n'
        f'CUDA_ARCH_LIST = {archs!r}  # TORCH_CUDA_ARCH_LIST entries, e.g. (\'8.0\', \'9.0+PTX\')\n'
        f'OPS = {ops!r}  # (): every op; else only these (tools/misc/build_mmcv.py --ops)\n')


def build(src: Path, out: Path, env: dict, log_path: Path) -> None:
    """Run bdist_wheel, printing one line per compiled file; the full log goes to log_path."""
    cmd = [sys.executable, 'setup.py', 'bdist_wheel', '-d', str(out)]
    log(f'compiling mmcv ops with MAX_JOBS={env["MAX_JOBS"]} FORCE_CUDA={env["FORCE_CUDA"]} '
        f'CUDA_HOME={env.get("CUDA_HOME", "-") if env["FORCE_CUDA"] == "1" else "-"} '
        f'TORCH_CUDA_ARCH_LIST={env.get("TORCH_CUDA_ARCH_LIST", "-") if env["FORCE_CUDA"] == "1" else "-"}; '
        f'full log: {log_path}')
    start = time.monotonic()
    with open(log_path, 'w') as log_file:
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            log_file.write(line)
            m = PROGRESS.match(line)
            if m:
                done, total, name = m.groups()
                mins = (time.monotonic() - start) / 60
                log(f'[{done}/{total}] {mins:5.1f} min  {Path(name).name}')
        rc = proc.wait()
    if rc != 0:
        lines = open(log_path).readlines()
        errors = [line for line in lines if re.search(r'\berror\b|^FAILED:', line)][:20]
        shown = ''.join(errors or lines[-40:])
        raise BuildError(f'the build failed (exit {rc}); {"errors" if errors else "last lines"} '
                         f'in {log_path}:\n{shown}')
    log(f'built in {(time.monotonic() - start) / 60:.1f} min')


def build_from_sdist(version: str, staging: Path, request: Request, toolkit: Optional[Toolkit],
                     key: str, torch_version: str, log_path: Path, sdist: Optional[Path] = None,
                     ops: tuple[str, ...] = ()) -> Path:
    """Download (unless sdist is given), patch and compile mmcv in a temporary folder (only ``ops``
    when some are named); return the wheel left in staging."""
    env = build_env(request, toolkit)
    with tempfile.TemporaryDirectory(prefix='mmcv-build-') as tmp:
        tmp = Path(tmp)
        archive = sdist or fetch_sdist(version, tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter='data')
        src = tmp / f'mmcv-{version}'
        if not (src / 'setup.py').is_file():
            raise BuildError(f'{archive} holds no mmcv-{version}/setup.py')
        standard = cxx_standard(torch_version)
        log(f'compiling as {standard} for torch {torch_version}')
        patch_cxx_standard(src, standard)
        if ops:
            sources = mmcv_subset.cut_source(src, ops)
            log(f'only the ops {", ".join(ops)}: {len(sources)} source files')
        write_build_info(src, key, torch_version, toolkit, request.archs, ops)
        build(src, staging, env, log_path)
    wheels = list(staging.glob('*.whl'))
    if not wheels:
        raise BuildError('the build finished without producing a wheel')
    if wheels[0].name != f'mmcv-{version}-{wheel_tag()}.whl':
        raise BuildError(f'the build produced {wheels[0].name}, not mmcv-{version}-{wheel_tag()}.whl')
    return wheels[0]


def installed_mismatch(version: str, request: Request, ops: tuple[str, ...] = ()) -> Optional[str]:
    """Why the installed mmcv does not fit the request and ops (None when it does)."""
    try:
        import mmcv
        from mmcv.ops import nms  # noqa: F401  (fails when the compiled ops are missing)
    except Exception as exc:  # noqa: BLE001  (any import failure means: install it)
        return f'mmcv with compiled ops does not import ({type(exc).__name__}: {exc})'
    if mmcv.__version__ != version:
        return f'mmcv {mmcv.__version__} is installed, {version} is required'
    try:
        from mmcv import xcit_build_info as info
    except ImportError:
        info = None
    built_ops = tuple(getattr(info, 'OPS', ()))
    if built_ops != ops:
        return (f'the installed mmcv holds the ops {", ".join(built_ops) or "all"}, '
                f'{", ".join(ops) or "all"} requested')
    if not request.cuda:
        return None
    if info is None:
        return 'the installed mmcv was not built by tools/misc/build_mmcv.py: its CUDA architectures are unknown'
    if info.CUDA_VERSION is None or tuple(info.CUDA_ARCH_LIST) != request.archs:
        built = ';'.join(info.CUDA_ARCH_LIST) or 'CPU only'
        return f'the installed mmcv is built for {built}, {";".join(request.archs)} is requested'
    return None


def gpu_archs() -> list[str]:
    """The compute capabilities of the visible GPUs, e.g. ['8.0', '9.0']."""
    import torch
    if not torch.cuda.is_available():
        return []
    return sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})


def main(argv: Optional[list[str]] = None) -> None:
    """tools/misc/build_mmcv.py's command line: print the wheel to install, or check the installed mmcv;
    a BuildError ends it with its message and status 1."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--version', required=True, help='mmcv version to build')
    parser.add_argument('--cache', required=True, type=Path, help='cache root; wheels go to <cache>/wheels/<key>/')
    parser.add_argument('--check', action='store_true',
                        help='only check that the installed mmcv fits the request; exit 1 if not')
    parser.add_argument('--sdist', type=Path, help="mmcv's source archive to build (default: download it)")
    parser.add_argument('--ops', default=(), type=mmcv_subset.parse_ops,
                        help=f'build only these ops (comma-separated, of: {", ".join(mmcv_subset.OPS)}); '
                             'the others raise when called')
    parser.add_argument('--offline', action='store_true',
                        help="download nothing: needs --sdist, and a system CUDA toolkit for CUDA ops")
    args = parser.parse_args(argv)
    try:
        wheel = wheel_to_install(args)
    except BuildError as exc:
        sys.exit(f'[build_mmcv] {exc}')
    if wheel is not None:
        print(wheel)


def wheel_to_install(args: argparse.Namespace) -> Optional[Path]:
    """The wheel that gives ``main``'s arguments what they ask for (cached or built now); None when the
    installed mmcv fits. Raises BuildError (with --check: when the installed mmcv does not fit)."""
    if args.offline and not args.sdist:
        raise BuildError('--offline needs --sdist')
    try:
        import torch
    except ImportError:
        raise BuildError('torch must be installed before mmcv is built') from None
    try:
        request = resolve_request(os.environ.get('XCIT_MMCV_CUDA', 'auto'),
                                  os.environ.get('TORCH_CUDA_ARCH_LIST', ''), gpu_archs(), torch.version.cuda)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    ops = args.ops or ()
    mismatch = installed_mismatch(args.version, request, ops)
    if args.check:
        if mismatch:
            raise BuildError(f'after installing: {mismatch}')
        return None
    if mismatch is None:
        log(f'mmcv {args.version} with compiled ops for {";".join(request.archs) or "CPU"} is already installed')
        return None
    log(mismatch)

    torch_version = torch.__version__.split('+')[0]
    tag = wheel_tag()
    wheels = args.cache / 'wheels'
    toolkit = pin = None
    if request.cuda:
        toolkit = choose_system_toolkit(torch.version.cuda, os.environ)
        if toolkit:
            log(f'using the system CUDA toolkit at {toolkit.home} (CUDA {toolkit.version[0]}.{toolkit.version[1]})')
        elif args.offline:
            raise BuildError('--offline: no usable system CUDA toolkit (see above), and NVIDIA\'s PyPI '
                             'compiler cannot be downloaded')
        else:
            pin = toolkit_pin(importlib.metadata.requires('torch') or [])
            if pin is None:
                raise BuildError('the installed torch pins no cuda-toolkit version: install a CUDA '
                                 f'toolkit {torch.version.cuda} and set CUDA_HOME')
            log(f'using NVIDIA\'s PyPI CUDA compiler {pin} (torch\'s pin) in this virtual environment')
        cuda_version = toolkit.version if toolkit else tuple(int(x) for x in pin.split('.')[:2])
    else:
        cuda_version = None
    key = cache_key(args.version, tag, torch_version, cuda_version, request.archs, ops)

    def build_into(staging: Path) -> Path:
        """Compile into staging (installing the PyPI compiler first when it is the one chosen)."""
        tk = toolkit or (install_pypi_toolkit(pin) if pin else None)
        return build_from_sdist(args.version, staging, request, tk, key, torch_version,
                                wheels / key / 'build.log', args.sdist, ops)

    return obtain_wheel(wheels / key, args.version, tag, build_into)
