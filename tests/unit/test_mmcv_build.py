"""The mmcv build tooling without compiling: cache keys, toolkit choice, the cache's lock and
atomic publish, the build request, and the run-time check of the GPU against the built architectures."""
import hashlib
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from xcit_dense.engine.distributed import cuda_ops
from xcit_launch import mmcv_build as build_mmcv

TAG = 'cp311-cp311-linux_x86_64'


# ---- cache key ---------------------------------------------------------------------------------

def test_cache_key_names_everything_the_binary_depends_on():
    key = build_mmcv.cache_key
    base = dict(mmcv_version='2.1.0', tag=TAG, torch_version='2.14.1', cuda_version=(13, 0), archs=('8.0', '9.0'))
    assert key(**base) == 'mmcv-2.1.0-cp311-cp311-linux_x86_64-torch2.14.1-cu13.0-sm_80-sm_90'
    assert key(**dict(base, cuda_version=None, archs=())) == 'mmcv-2.1.0-cp311-cp311-linux_x86_64-torch2.14.1-cpu'
    assert key(**base, ops=('nms', 'roi_align')).endswith('-sm_80-sm_90-ops_nms+roi_align')
    variants = [dict(base, ops=('nms',)), dict(base, ops=('nms', 'roi_align')), dict(base, mmcv_version='2.1.1'),
                dict(base, tag='cp310-cp310-linux_x86_64'),
                dict(base, tag='cp311-cp311-linux_aarch64'), dict(base, torch_version='2.13.0'),
                dict(base, cuda_version=(13, 1)), dict(base, cuda_version=(12, 8)), dict(base, archs=('9.0',)),
                dict(base, archs=('8.0', '9.0+PTX')), dict(base, archs=('8.6', '9.0')),
                dict(base, cuda_version=None, archs=())]
    keys = {key(**v) for v in variants} | {key(**base)}
    assert len(keys) == len(variants) + 1
    assert all('/' not in k and ' ' not in k and ';' not in k for k in keys)


def test_arch_list_is_normalised_so_equal_requests_share_a_key():
    assert build_mmcv.parse_arch_list('9.0;8.0') == ('8.0', '9.0')
    assert build_mmcv.parse_arch_list(' 9.0+PTX, 8.0 8.0;12.0 ') == ('8.0', '9.0+PTX', '12.0')
    for bad in ('sm_80', '8', 'Ampere', '9.0a', ''):
        with pytest.raises(ValueError, match=r'TORCH_CUDA_ARCH_LIST (entry .* is not of the form|is empty)'):
            build_mmcv.parse_arch_list(bad)


# ---- build request -----------------------------------------------------------------------------

def test_build_request_from_environment_and_gpus():
    resolve = build_mmcv.resolve_request
    assert resolve('auto', '8.0;9.0', [], '13.0') == build_mmcv.Request(cuda=False)
    assert resolve('auto', '', ['8.6'], '13.0') == build_mmcv.Request(cuda=True, archs=('8.6',))
    assert resolve('auto', '', ['8.6'], None) == build_mmcv.Request(cuda=False)
    assert resolve('0', '9.0', ['9.0'], '13.0') == build_mmcv.Request(cuda=False)
    assert resolve('1', '9.0;8.0', [], '13.0') == build_mmcv.Request(cuda=True, archs=('8.0', '9.0'))
    assert resolve('1', '', ['9.0', '8.0'], '13.0') == build_mmcv.Request(cuda=True, archs=('8.0', '9.0'))
    with pytest.raises(ValueError, match='TORCH_CUDA_ARCH_LIST'):
        resolve('1', '', [], '13.0')
    with pytest.raises(ValueError, match='without CUDA'):
        resolve('1', '9.0', [], None)
    with pytest.raises(ValueError, match='auto, 0 or 1'):
        resolve('yes', '', [], '13.0')


# ---- toolkit choice ----------------------------------------------------------------------------

def fake_nvcc(folder: Path, release: str, here: Path = None, headers: bool = True, cudart: str = 'lib64') -> Path:
    """An nvcc script printing a version (and, for --dryrun, the folder it says it lives in),
    in a toolkit with (or without) the headers torch's CUDA headers include, and libcudart.so in
    lib64 (a system toolkit's layout), lib, or nowhere (None)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / 'include').mkdir(exist_ok=True)
    for header in build_mmcv.TORCH_CUDA_HEADERS if headers else ():
        (folder.parent / 'include' / header).write_text('')
    if cudart:
        (folder.parent / cudart).mkdir(exist_ok=True)
        (folder.parent / cudart / 'libcudart.so.13').write_text('')
        (folder.parent / cudart / 'libcudart.so').symlink_to('libcudart.so.13')
    nvcc = folder / 'nvcc'
    dryrun = f'case "$1" in --dryrun) echo "#\\$ _HERE_={here}" >&2 ;; esac\n' if here else ''
    nvcc.write_text(f'#!/bin/sh\n{dryrun}echo "Cuda compilation tools, release {release}, V{release}.88"\n')
    nvcc.chmod(0o755)
    return nvcc


def test_compatible_system_nvcc_on_path_is_used(tmp_path, capsys):
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.0')
    env = {'PATH': str(tmp_path / 'cuda' / 'bin')}
    toolkit = build_mmcv.choose_system_toolkit('13.0', env, default=tmp_path / 'none')
    assert toolkit == build_mmcv.Toolkit(tmp_path / 'cuda', (13, 0))
    assert 'warning' not in capsys.readouterr().err


def test_system_nvcc_of_another_minor_version_is_used_with_a_warning(tmp_path, capsys):
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.1')
    toolkit = build_mmcv.choose_system_toolkit('13.0', {'PATH': str(tmp_path / 'cuda' / 'bin')},
                                               default=tmp_path / 'none')
    assert toolkit is not None and toolkit.version == (13, 1)
    err = capsys.readouterr().err
    assert 'warning' in err and '13.1' in err and '13.0' in err


def test_incompatible_system_nvcc_is_refused_naming_both_versions(tmp_path, capsys):
    fake_nvcc(tmp_path / 'cuda' / 'bin', '12.4')
    toolkit = build_mmcv.choose_system_toolkit('13.0', {'PATH': str(tmp_path / 'cuda' / 'bin')},
                                               default=tmp_path / 'none')
    assert toolkit is None
    err = capsys.readouterr().err
    assert 'CUDA 12.4' in err and 'CUDA 13.0' in err


def test_system_toolkit_without_the_library_headers_torch_includes_is_refused(tmp_path, capsys):
    """An nvcc-only toolkit (compiler, runtime, CCCL) cannot compile against torch's ATen/cuda headers."""
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.0', headers=False)
    (tmp_path / 'cuda' / 'include' / 'cuda_runtime_api.h').write_text('')
    assert build_mmcv.choose_system_toolkit('13.0', {'PATH': str(tmp_path / 'cuda' / 'bin')},
                                            default=tmp_path / 'none') is None
    assert ('lacks include/cusparse.h, include/cublas_v2.h, include/cublasLt.h, include/cusolverDn.h'
            in capsys.readouterr().err)


def test_a_full_system_toolkit_is_accepted(tmp_path, capsys):
    """/usr/local/cuda's layout: bin/nvcc, include/ with the library headers, lib64/libcudart.so."""
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.0')
    toolkit = build_mmcv.choose_system_toolkit('13.0', {'CUDA_HOME': str(tmp_path / 'cuda')}, default=tmp_path / 'x')
    assert toolkit == build_mmcv.Toolkit(tmp_path / 'cuda', (13, 0))
    assert build_mmcv.toolkit_missing(tmp_path / 'cuda') == []
    assert 'lacks' not in capsys.readouterr().err


@pytest.mark.parametrize('layout, missing', [
    (None, 'lib64/libcudart.so'),   # the link step needs the unversioned library
    ('lib', None),                  # lib alone (NVIDIA's PyPI layout, linked): torch links from lib then
])
def test_a_toolkit_without_libcudart_so_is_refused_naming_it(tmp_path, capsys, layout, missing):
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.0', cudart=layout)
    toolkit = build_mmcv.choose_system_toolkit('13.0', {'CUDA_HOME': str(tmp_path / 'cuda')}, default=tmp_path / 'x')
    err = capsys.readouterr().err
    if missing:
        assert toolkit is None and f'lacks {missing}, which the build needs' in err and 'libcudart.so' in err
    else:
        assert toolkit is not None and 'lacks' not in err


def test_a_versioned_libcudart_alone_is_not_enough(tmp_path):
    fake_nvcc(tmp_path / 'cuda' / 'bin', '13.0', cudart='lib64')
    (tmp_path / 'cuda' / 'lib64' / 'libcudart.so').unlink()
    assert build_mmcv.toolkit_missing(tmp_path / 'cuda') == ['lib64/libcudart.so']


@pytest.mark.parametrize('torch_version, standard', [
    ('2.11.0', 'c++17'), ('2.11.0+cu130', 'c++17'), ('2.12.1', 'c++17'), ('2.13.0', 'c++20'),
    ('2.14.1', 'c++20'), ('3.0.0', 'c++20')])
def test_cxx_standard_follows_torch(torch_version, standard):
    assert build_mmcv.cxx_standard(torch_version) == standard


def test_the_standard_is_written_into_setup_py(tmp_path):
    (tmp_path / 'setup.py').write_text("cxx = ['-std=c++17']\nnvcc = ['-std=c++17']\n")
    build_mmcv.patch_cxx_standard(tmp_path, 'c++20')
    assert (tmp_path / 'setup.py').read_text() == "cxx = ['-std=c++20']\nnvcc = ['-std=c++20']\n"


def test_no_system_nvcc_means_no_system_toolkit(tmp_path, capsys):
    (tmp_path / 'empty').mkdir()
    assert build_mmcv.choose_system_toolkit('13.0', {'PATH': str(tmp_path / 'empty')},
                                            default=tmp_path / 'none') is None
    assert 'no system CUDA toolkit' in capsys.readouterr().err


def test_cuda_home_wins_over_path_and_default(tmp_path):
    fake_nvcc(tmp_path / 'home' / 'bin', '13.0')
    fake_nvcc(tmp_path / 'onpath' / 'bin', '12.4')
    fake_nvcc(tmp_path / 'default' / 'bin', '12.4')
    env = {'CUDA_HOME': str(tmp_path / 'home'), 'PATH': str(tmp_path / 'onpath' / 'bin')}
    assert build_mmcv.choose_system_toolkit('13.0', env, default=tmp_path / 'default').home == tmp_path / 'home'
    assert build_mmcv.find_system_toolkit({'PATH': ''}, default=tmp_path / 'default') == tmp_path / 'default'


def test_nvcc_wrapper_script_leads_to_its_real_toolkit(tmp_path):
    """/usr/local/bin/nvcc wrapping /usr/local/cuda-13.0/bin/nvcc: the toolkit is the latter."""
    real = tmp_path / 'cuda-13.0'
    fake_nvcc(tmp_path / 'wrappers', '13.0', here=real / 'bin')
    assert build_mmcv.find_system_toolkit({'PATH': str(tmp_path / 'wrappers')}, default=tmp_path / 'x') == real


def test_pypi_compiler_version_is_torchs_pin():
    requires = ['filelock', 'cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == "Linux"',
                'cuda-bindings<14,>=13.0.3; platform_system == "Linux"']
    assert build_mmcv.toolkit_pin(requires) == '13.0.3'
    assert build_mmcv.toolkit_pin(['nvidia-cuda-runtime-cu12==12.4.127']) is None
    assert build_mmcv.pypi_toolkit_home('13.0.3').parts[-2:] == ('nvidia', 'cu13')


# ---- cache lock and atomic publish -------------------------------------------------------------

WHEEL_NAME = f'mmcv-2.1.0-{TAG}.whl'
PAYLOAD = os.urandom(48 << 20)


def _first_install(folder: str, builds_log: str, building, second_waits, scans) -> None:
    """The install that builds: its fake build goes on only once the second install has found the lock
    held and the watcher has looked at the cache twice meanwhile (events and a counter, no sleep)."""
    def fake_build(staging: Path) -> Path:
        with open(builds_log, 'a') as f:
            f.write(f'{os.getpid()}\n')
        seen = scans.value
        building.set()
        assert second_waits.wait(60), 'the second install never met the lock'
        while scans.value < seen + 2:
            time.sleep(0.001)  # polling the watcher's counter: the order comes from the counter
        (staging / WHEEL_NAME).write_bytes(PAYLOAD)
        return staging / WHEEL_NAME

    build_mmcv.obtain_wheel(Path(folder), '2.1.0', TAG, fake_build)


def _second_install(folder: str, builds_log: str, building, second_waits) -> None:
    """The install started while the first one builds: it must wait for the lock, then reuse the wheel."""
    def fake_build(staging: Path) -> Path:
        with open(builds_log, 'a') as f:
            f.write(f'{os.getpid()}\n')
        (staging / WHEEL_NAME).write_bytes(PAYLOAD)
        return staging / WHEEL_NAME

    log = build_mmcv.log

    def noted(message: str) -> None:
        if 'another install is building' in message:
            second_waits.set()
        log(message)
    build_mmcv.log = noted  # this forked process's module only
    assert building.wait(60), 'the first install never started building'
    build_mmcv.obtain_wheel(Path(folder), '2.1.0', TAG, fake_build)


def _watcher(folder: str, seen: str, stop, scans) -> None:
    """A third process looking at the cache meanwhile: it must never find an incomplete wheel. Its last
    look comes after both installs have ended."""
    sizes = set()
    while True:
        done = stop.is_set()
        wheel = build_mmcv.find_wheel(Path(folder), '2.1.0', TAG)
        if wheel:
            sizes.add(wheel.stat().st_size)
        with scans.get_lock():
            scans.value += 1
        if done:
            break
    Path(seen).write_text(' '.join(map(str, sorted(sizes))))


def test_two_concurrent_installs_publish_one_complete_wheel(tmp_path):
    """The second install meets the first one's lock while it builds (an event says so, rather than a
    head start in seconds), waits, and reuses its wheel; a watcher never sees a partial one."""
    folder = tmp_path / 'wheels' / 'key'
    builds = tmp_path / 'builds.log'
    ctx = multiprocessing.get_context('fork')
    building, second_waits, stop = ctx.Event(), ctx.Event(), ctx.Event()
    scans = ctx.Value('l', 0)
    folder.mkdir(parents=True)
    installs = [ctx.Process(target=_first_install, args=(str(folder), str(builds), building, second_waits, scans)),
                ctx.Process(target=_second_install, args=(str(folder), str(builds), building, second_waits))]
    watcher = ctx.Process(target=_watcher, args=(str(folder), str(tmp_path / 'seen'), stop, scans))
    for p in [watcher, *installs]:
        p.start()
    try:
        for p in installs:
            p.join(120)
            assert p.exitcode == 0
        stop.set()
        watcher.join(120)
        assert watcher.exitcode == 0
    finally:
        for p in [watcher, *installs]:
            if p.is_alive():
                p.kill()
                p.join()
    assert second_waits.is_set(), 'the installs did not overlap'
    assert len(builds.read_text().split()) == 1, 'both installs compiled: the lock did not serialise them'
    assert sorted(p.name for p in folder.iterdir()) == ['.lock', WHEEL_NAME]
    assert hashlib.sha256((folder / WHEEL_NAME).read_bytes()).digest() == hashlib.sha256(PAYLOAD).digest()
    assert (tmp_path / 'seen').read_text() == str(len(PAYLOAD)), 'a partial wheel was visible in the cache'


def test_a_build_error_is_raised_and_main_makes_it_the_exit_message(tmp_path, monkeypatch):
    """The helpers raise BuildError (a caller gets an exception); main, run by tools/misc/build_mmcv.py,
    exits with '[build_mmcv] <message>'."""
    src = tmp_path / 'mmcv-2.1.0'
    src.mkdir()
    (src / 'setup.py').write_text('extra_compile_args = []\n')
    with pytest.raises(build_mmcv.BuildError, match=r'setup.py has no -std=c\+\+17 to patch'):
        build_mmcv.patch_cxx_standard(src, 'c++20')
    with pytest.raises(SystemExit, match=r'^\[build_mmcv\] --offline needs --sdist$'):
        build_mmcv.main(['--version', '2.1.0', '--cache', str(tmp_path), '--offline'])
    monkeypatch.setenv('XCIT_MMCV_CUDA', 'sometimes')
    with pytest.raises(SystemExit, match=r"^\[build_mmcv\] XCIT_MMCV_CUDA must be auto, 0 or 1, got 'sometimes'$"):
        build_mmcv.main(['--version', '2.1.0', '--cache', str(tmp_path)])


def test_failed_build_leaves_nothing_to_reuse(tmp_path):
    def failing_build(staging: Path) -> Path:
        (staging / WHEEL_NAME).write_bytes(b'half')
        raise SystemExit('compiler error')

    with pytest.raises(SystemExit, match='^compiler error$'):
        build_mmcv.obtain_wheel(tmp_path / 'key', '2.1.0', TAG, failing_build)
    assert build_mmcv.find_wheel(tmp_path / 'key', '2.1.0', TAG) is None
    assert [p.name for p in (tmp_path / 'key').iterdir()] == ['.lock']


# ---- what the wheel records, and whether the installed mmcv fits ---------------------------------

def fake_mmcv(site: Path, build_info: str = None) -> None:
    """A stand-in mmcv 2.1.0 package with compiled ops and, optionally, a build info module."""
    (site / 'mmcv' / 'ops').mkdir(parents=True)
    (site / 'mmcv' / '__init__.py').write_text("__version__ = '2.1.0'\n")
    (site / 'mmcv' / 'ops' / '__init__.py').write_text('def nms(): pass\n')
    if build_info is not None:
        (site / 'mmcv' / 'xcit_build_info.py').write_text(build_info)


def installed_mismatch_in(site: Path, request, ops: tuple = ()) -> str:
    """installed_mismatch() run in a fresh interpreter that imports mmcv from site."""
    code = ('from xcit_launch import mmcv_build as b\n'
            f'print(b.installed_mismatch("2.1.0", b.Request(cuda={request.cuda}, archs={request.archs!r}), {ops!r}))\n')
    path = os.pathsep.join([str(site), str(ROOT)])  # the fake mmcv, and this checkout's xcit_launch
    return subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONPATH=path),
                          capture_output=True, text=True, check=True).stdout.strip()


def test_build_info_written_into_the_source_decides_whether_to_rebuild(tmp_path):
    src = tmp_path / 'src'
    fake_mmcv(src)
    toolkit = build_mmcv.Toolkit(Path('/cuda'), (13, 0))
    build_mmcv.write_build_info(src, 'the-key', '2.14.1', toolkit, ('8.0', '9.0'))
    info = {}
    exec((src / 'mmcv' / 'xcit_build_info.py').read_text(), info)
    assert (info['CUDA_VERSION'], info['CUDA_ARCH_LIST'], info['CACHE_KEY']) == ('13.0', ('8.0', '9.0'), 'the-key')

    cuda_8_9 = build_mmcv.Request(cuda=True, archs=('8.0', '9.0'))
    assert installed_mismatch_in(src, cuda_8_9) == 'None'
    assert 'built for 8.0;9.0, 9.0 is requested' in installed_mismatch_in(src, build_mmcv.Request(True, ('9.0',)))
    assert installed_mismatch_in(src, build_mmcv.Request(cuda=False)) == 'None'

    cpu = tmp_path / 'cpu'
    fake_mmcv(cpu)
    build_mmcv.write_build_info(cpu, 'cpu-key', '2.14.1', None, ())
    assert 'built for CPU only' in installed_mismatch_in(cpu, cuda_8_9)
    old = tmp_path / 'old'
    fake_mmcv(old)  # a CPU wheel from before build info existed: fine for CPU, rebuilt for CUDA
    assert installed_mismatch_in(old, build_mmcv.Request(cuda=False)) == 'None'
    assert 'architectures are unknown' in installed_mismatch_in(old, cuda_8_9)


# ---- run-time check ----------------------------------------------------------------------------

@pytest.mark.parametrize('capability, archs, runs', [
    ((8, 0), ['8.0'], True),
    ((8, 6), ['8.0'], True),           # same major, newer minor: the sm_80 cubin runs
    ((8, 0), ['8.6'], False),          # older minor: it does not
    ((9, 0), ['8.0', '9.0'], True),
    ((9, 0), ['8.0'], False),          # a cubin never runs on another major
    ((9, 0), ['8.0+PTX'], True),       # PTX is compiled for newer GPUs by the driver
    ((12, 0), ['8.0', '9.0+PTX'], True),
    ((8, 6), ['9.0+PTX'], False),      # but not for older ones
    ((12, 0), ['8.0', '9.0'], False),
])
def test_arch_compatibility_rule(capability, archs, runs):
    assert any(cuda_ops.arch_runs_on(a, capability) for a in archs) is runs
    assert (cuda_ops.arch_mismatch_message(capability, 'GPU', archs) is None) is runs


def test_mismatch_message_names_the_gpu_the_build_and_the_fix():
    msg = cuda_ops.arch_mismatch_message((8, 6), 'NVIDIA GeForce RTX 3090', ['8.0+PTX', '9.0'][1:])
    assert msg == ("this GPU is sm_86 (NVIDIA GeForce RTX 3090), but the installed mmcv's CUDA ops were "
                   'built for sm_90: reinstall with XCIT_MMCV=compiled XCIT_MMCV_CUDA=1 '
                   'TORCH_CUDA_ARCH_LIST="9.0;8.6" bash tools/install.sh')


REAL_CHECK_GPU_USABLE = cuda_ops.check_gpu_usable


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend GPUs of a given capability are visible (the current one ``current``), mmcv built with
    given build info, and the plain allocation on a GPU passing; returns the GPUs allocated on."""
    allocated = []

    def install(capability, cuda_version, archs, count=1, current=0):
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        monkeypatch.setattr(torch.cuda, 'device_count', lambda: count)
        monkeypatch.setattr(torch.cuda, 'current_device', lambda: current)
        monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda i=None: capability)
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda i=None: 'NVIDIA Fake GPU')
        monkeypatch.setattr(cuda_ops, 'check_gpu_usable', allocated.append)
        info = types.ModuleType('mmcv.xcit_build_info')
        info.CUDA_VERSION, info.CUDA_ARCH_LIST = cuda_version, archs
        monkeypatch.setitem(sys.modules, 'mmcv.xcit_build_info', info)
        return allocated
    return install


def test_runtime_check_refuses_a_gpu_outside_the_build(fake_gpu):
    fake_gpu((8, 6), '13.0', ('8.0+PTX', '9.0')[1:])
    with pytest.raises(RuntimeError, match=r'this GPU is sm_86 \(NVIDIA Fake GPU\).*built for sm_90'):
        cuda_ops.check_cuda_ops()


def test_runtime_check_passes_a_gpu_inside_the_build(fake_gpu):
    fake_gpu((9, 0), '13.0', ('8.0', '9.0'))
    assert cuda_ops.check_cuda_ops() is None


def test_runtime_check_refuses_a_cpu_only_mmcv_on_a_gpu_node(fake_gpu):
    fake_gpu((8, 6), None, ())
    with pytest.raises(RuntimeError, match=r'GPU 0 \(NVIDIA Fake GPU\) is present, but .*built without CUDA ops: '
                                           r'reinstall with XCIT_MMCV=compiled XCIT_MMCV_CUDA=1 bash tools/install.sh'):
        cuda_ops.check_cuda_ops()


def test_runtime_check_runs_torchvisions_cuda_ops_on_its_own_gpu_only(fake_gpu, monkeypatch):
    """mmcv-lite: the check allocates on, and runs torchvision's nms and roi_align on, the process's
    current GPU of 8 (here a fake one, where the ops fail), naming the GPU, torchvision and the fix."""
    allocated = fake_gpu((9, 0), '13.0', ('9.0',), count=8, current=3)
    monkeypatch.setattr(cuda_ops, 'mmcv_cuda_archs', lambda: None)
    monkeypatch.setattr(cuda_ops, 'serves_mmcv_ext', lambda: True)
    probed = []
    real = cuda_ops.check_torchvision_cuda_ops
    monkeypatch.setattr(cuda_ops, 'check_torchvision_cuda_ops', lambda index: probed.append(index) or real(index))
    with pytest.raises(RuntimeError, match=r"GPU 3 \(NVIDIA Fake GPU\) cannot run torchvision .*'s CUDA ops, "
                                           r"which serve mmcv._ext's nms and roi_align.*bash tools/install.sh"):
        cuda_ops.check_cuda_ops()
    assert allocated == [3] and probed == [3]
    monkeypatch.setattr(cuda_ops, 'serves_mmcv_ext', lambda: False)  # a compiled mmcv of unknown build
    assert cuda_ops.check_cuda_ops() is None


def test_a_gpu_that_cannot_allocate_is_told_apart_from_the_ops(fake_gpu, monkeypatch):
    """The plain allocation fails first (exclusive mode, here a stand-in): the message names host,
    rank and GPU, and the ops are never tried (their install advice would be wrong)."""
    fake_gpu((9, 0), '13.0', ('9.0',), count=8, current=5)
    monkeypatch.setattr(cuda_ops, 'check_gpu_usable', REAL_CHECK_GPU_USABLE)  # the fixture's stand-in undone
    busy = RuntimeError('CUDA error: all CUDA-capable devices are busy or unavailable')
    touched = []
    monkeypatch.setattr(torch, 'empty', lambda *a, device=None, **k: touched.append(device) or _raise(busy))
    monkeypatch.setattr(cuda_ops, 'mmcv_cuda_archs', lambda: None)
    monkeypatch.setattr(cuda_ops, 'serves_mmcv_ext', lambda: True)
    monkeypatch.setattr(cuda_ops, 'check_torchvision_cuda_ops', lambda index: pytest.fail('ops tried'))
    monkeypatch.setenv('RANK', '13')
    with pytest.raises(cuda_ops.GpuUnusable, match=rf'GPU 5 of host {re.escape(socket.gethostname())} cannot be '
                                                   r'used by rank 13: CUDA error: all CUDA-capable devices are busy'):
        cuda_ops.check_cuda_ops()
    assert touched == [torch.device('cuda', 5)]


def _raise(error):
    raise error


def test_runtime_check_ignores_machines_without_gpu(fake_gpu, monkeypatch):
    allocated = fake_gpu((8, 6), None, ())
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert cuda_ops.check_cuda_ops() is None
    fake_gpu((8, 6), '13.0', ('9.0',))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert cuda_ops.check_cuda_ops() is None and allocated == []


# ---- a build of some ops only ------------------------------------------------------------------

mmcv_subset = build_mmcv.mmcv_subset

# Shaped like mmcv 2.1.0's files (cut down): what the subset keeps of them, and the rest it drops.
CUDABIND = '''#include "pytorch_cpp_helper.hpp"
#include "pytorch_device_registry.hpp"

void DeformConvForwardCUDAKernelLauncher(Tensor input);

void deform_conv_forward_cuda(Tensor input) {
  DeformConvForwardCUDAKernelLauncher(input);
}

void deform_conv_forward_impl(Tensor input);
REGISTER_DEVICE_IMPL(deform_conv_forward_impl, CUDA,
                     deform_conv_forward_cuda);

Tensor NMSCUDAKernelLauncher(Tensor boxes, Tensor scores, float iou_threshold,
                             int offset);

Tensor nms_cuda(Tensor boxes, Tensor scores, float iou_threshold, int offset) {
  return NMSCUDAKernelLauncher(boxes, scores, iou_threshold, offset);
}

Tensor nms_impl(Tensor boxes, Tensor scores, float iou_threshold, int offset);
REGISTER_DEVICE_IMPL(nms_impl, CUDA, nms_cuda);

void ROIAlignForwardCUDAKernelLauncher(Tensor input);

void roi_align_forward_cuda(Tensor input) { ROIAlignForwardCUDAKernelLauncher(input); }

void roi_align_forward_impl(Tensor input);
void roi_align_backward_impl(Tensor grad);
REGISTER_DEVICE_IMPL(roi_align_forward_impl, CUDA, roi_align_forward_cuda);
REGISTER_DEVICE_IMPL(roi_align_backward_impl, CUDA, roi_align_backward_cuda);

void RoIAlignRotatedForwardCUDAKernelLauncher(Tensor input);
void roi_align_rotated_forward_impl(Tensor input);
REGISTER_DEVICE_IMPL(roi_align_rotated_forward_impl, CUDA, roi_align_rotated_forward_cuda);
'''
PYBIND = '''#include <torch/extension.h>

Tensor nms(Tensor boxes, Tensor scores, float iou_threshold, int offset);
void deform_conv_forward(Tensor input);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("deform_conv_forward", &deform_conv_forward, "deform forward",
        py::arg("input"));
  m.def("get_compiler_version", &get_compiler_version, "get_compiler_version");
  m.def("nms", &nms, "nms (CPU/CUDA) ", py::arg("boxes"), py::arg("scores"),
        py::arg("iou_threshold"), py::arg("offset"));
  m.def("nms_rotated", &nms_rotated, "NMS for rotated boxes", py::arg("dets"));
  m.def("roi_align_forward", &roi_align_forward, "roi_align forward",
        py::arg("input"));
}
'''
EXT_LOADER = '''import importlib

if True:

    def load_ext(name, funcs):
        ext = importlib.import_module('mmcv.' + name)
        for fun in funcs:
            assert hasattr(ext, fun), f'{fun} miss in module {name}'
        return ext
'''


def fake_mmcv_source(src: Path) -> None:
    """An mmcv source tree with the files the subset cut reads, writes and deletes."""
    csrc = src / 'mmcv' / 'ops' / 'csrc' / 'pytorch'
    for folder in (csrc / 'cpu', csrc / 'cuda', src / 'mmcv' / 'utils'):
        folder.mkdir(parents=True)
    for name in ('nms.cpp', 'roi_align.cpp', 'deform_conv.cpp', 'info.cpp', 'nms_rotated.cpp',
                 'cpu/nms.cpp', 'cpu/roi_align.cpp', 'cpu/deform_conv.cpp', 'cpu/roi_align_rotated.cpp',
                 'cuda/nms_cuda.cu', 'cuda/roi_align_cuda.cu', 'cuda/deform_conv_cuda.cu',
                 'cuda/roi_align_rotated_cuda.cu'):
        (csrc / name).write_text('// source\n')
    (csrc / 'pybind.cpp').write_text(PYBIND)
    (csrc / 'cuda' / 'cudabind.cpp').write_text(CUDABIND)
    (src / 'mmcv' / '__init__.py').write_text('')
    (src / 'mmcv' / 'utils' / '__init__.py').write_text('')
    (src / 'mmcv' / 'utils' / 'ext_loader.py').write_text(EXT_LOADER)


def test_the_subset_keeps_only_its_ops_files_bindings_and_registrations(tmp_path):
    fake_mmcv_source(tmp_path)
    left = mmcv_subset.cut_source(tmp_path, ('nms', 'roi_align'))
    csrc = tmp_path / 'mmcv' / 'ops' / 'csrc' / 'pytorch'
    assert sorted(str(p.relative_to(csrc)) for p in left) == [
        'cpu/nms.cpp', 'cpu/roi_align.cpp', 'cuda/cudabind.cpp', 'cuda/nms_cuda.cu', 'cuda/roi_align_cuda.cu',
        'info.cpp', 'nms.cpp', 'pybind.cpp', 'roi_align.cpp']
    cudabind = (csrc / 'cuda' / 'cudabind.cpp').read_text()
    assert cudabind.startswith('#include "pytorch_cpp_helper.hpp"\n#include "pytorch_device_registry.hpp"\n')
    assert 'REGISTER_DEVICE_IMPL(nms_impl, CUDA, nms_cuda);' in cudabind and 'Tensor nms_cuda(' in cudabind
    assert 'REGISTER_DEVICE_IMPL(roi_align_backward_impl' in cudabind and 'roi_align_forward_cuda(Tensor' in cudabind
    assert 'deform' not in cudabind.lower() and 'rotated' not in cudabind.lower()
    pybind = (csrc / 'pybind.cpp').read_text()
    defined = re.findall(r'm\.def\("(\w+)"', pybind)
    assert defined == ['get_compiler_version', 'nms', 'roi_align_forward']
    assert 'void deform_conv_forward(Tensor input);' in pybind and pybind.endswith('}\n')


def test_an_op_left_out_raises_a_clear_error_when_called_and_the_rest_work(tmp_path):
    fake_mmcv_source(tmp_path)
    mmcv_subset.cut_source(tmp_path, ('nms', 'roi_align'))
    (tmp_path / 'mmcv' / '_ext.py').write_text('def nms(*args):\n    return "kept"\n')
    code = ('from mmcv.utils.ext_loader import load_ext\n'
            'ext = load_ext("_ext", ["nms", "deform_conv_forward"])\n'
            'print(ext.nms())\n'
            'ext.deform_conv_forward(1)\n')
    proc = subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                          capture_output=True, text=True)
    assert proc.stdout == 'kept\n'
    assert ("NotImplementedError: mmcv's compiled op function 'deform_conv_forward' was left out of this build, "
            "which holds the ops nms, roi_align only") in proc.stderr


def test_the_ops_to_build_are_checked():
    assert mmcv_subset.parse_ops('roi_align, nms,nms') == ('nms', 'roi_align')
    for bad in ('', 'nms,deform_conv', ','):
        with pytest.raises(ValueError, match='--ops must name some of nms, roi_align'):
            mmcv_subset.parse_ops(bad)


def test_a_subset_build_is_rebuilt_when_every_op_is_asked_for(tmp_path):
    site = tmp_path / 'site'
    fake_mmcv(site)
    build_mmcv.write_build_info(site, 'key', '2.11.0', None, (), ('nms', 'roi_align'))
    cpu = build_mmcv.Request(cuda=False)
    assert 'holds the ops nms, roi_align, all requested' in installed_mismatch_in(site, cpu)
    assert installed_mismatch_in(site, cpu, ('nms', 'roi_align')) == 'None'
