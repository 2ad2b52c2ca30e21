"""What the tests share: paths, tiny configs, subprocesses that never outlive a test, free ports,
capability checks and a repository-cleanliness snapshot. Test files import this, never each other."""
import concurrent.futures
import contextlib
import copy
import functools
import io
import itertools
import logging
import multiprocessing
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set

import pytest
import torch
from mmengine.config import Config
from mmengine.model import BaseModel

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / 'tests'
SUPPORT = TESTS / 'support'  # this module and the scripts the tests run
CAPABILITY_MISSING = 'capability missing:'
# the day's speed: what a run of this session measured (e.g. a demo's seconds an iteration), by name;
# printed at the end of the session (conftest.py), so that a slow stage tells a slow day from a regression
DAY_SPEED = pytest.StashKey[Dict[str, str]]()


# --- weights and configs ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _parsed(path: str) -> Config:
    return Config.fromfile(path)


def config_copy(path) -> Config:
    """A copy of the config at ``path`` to change at will, parsed once per test process (a recipe's
    parse with its ``_base_`` files takes about a second; a copy, milliseconds)."""
    return copy.deepcopy(_parsed(str(path)))


class ToyModel(BaseModel):
    """One linear layer as an MMEngine model: a Runner built around it starts in a second."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, inputs=None, data_samples=None, mode='tensor'):
        return self.linear(inputs)


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every float parameter and buffer random values, so that no weight goes untested.

    Layer scales get values of order 0.1-0.5 (not the presets' 1e-5), BN statistics are
    non-trivial, so a wrong mapping of any tensor shows in the outputs.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if name.endswith('running_var'):
                tensor.copy_(0.5 + noise.abs())
            elif name.split('.')[-1].startswith('gamma') or name.endswith('temperature'):
                tensor.copy_(0.3 + 0.1 * noise)
            elif name.endswith(('norm1.weight', 'norm2.weight', 'norm3.weight')) or \
                    name.endswith('.1.weight') or name.endswith('bn.weight'):
                tensor.copy_(1.0 + 0.1 * noise)
            else:
                tensor.copy_(0.02 * noise)
    return module


def tiny_seg_config(tmp_path: Path, data_root: Path, **overrides) -> Path:
    """A config that inherits the real Semantic FPN XCiT-T12/16 config, shrunk for a CPU test.

    No random augmentation, dropout, drop path or batch statistics (heads without norm, the
    backbone's BN in eval mode): the loss is then a plain per-image mean.
    """
    classes = ('background', 'rectangle', 'ellipse', 'triangle')
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), dict(type='PackSegInputs')]
    dataset = dict(type='BaseSegDataset', data_root=str(data_root), img_suffix='.jpg', seg_map_suffix='.png',
                   metainfo=dict(classes=classes), pipeline=pipeline)
    cfg = {
        '_base_': [str(ROOT / 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py')],
        'model': dict(
            data_preprocessor=dict(size=(64, 64)),
            backbone=dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3), norm_eval=True,
                          init_cfg=None),
            neck=dict(in_channels=[64] * 4, out_channels=32),
            decode_head=dict(in_channels=[32] * 4, channels=16, num_classes=4, dropout_ratio=0.0,
                             norm_cfg=None)),
        'train_dataloader': dict(
            batch_size=2, num_workers=0, persistent_workers=False,
            sampler=dict(type='InfiniteSampler', shuffle=False),
            dataset=dict(dataset, data_prefix=dict(img_path='images/training',
                                                   seg_map_path='annotations/training'))),
        'val_dataloader': dict(
            num_workers=0, persistent_workers=False,
            dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                                   seg_map_path='annotations/validation'))),
        'test_dataloader': dict(
            num_workers=0, persistent_workers=False,
            dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                                   seg_map_path='annotations/validation'))),
        'train_cfg': dict(max_iters=4, val_interval=4),
        'param_scheduler': [],
        'default_hooks': dict(checkpoint=dict(interval=4), logger=dict(interval=1),
                              visualization=dict(draw=False)),
        'randomness': dict(seed=0, deterministic=True),
        'env_cfg': dict(cudnn_benchmark=False),
    }
    cfg['model'].update(overrides.pop('model', {}))  # the tiny model's keys kept, others added or replaced
    cfg.update(overrides)
    path = tmp_path / 'tiny_sem_fpn.py'
    path.write_text('\n'.join(f'{k} = {v!r}' for k, v in cfg.items()) + '\n')
    return path


HUB_COMMIT = '0123456789abcdef0123456789abcdef01234567'  # the commit of the hub caches the tests lay out


def cached_hub_repo(cache: Path, repo: str, files: Dict[str, Callable[[Path], object]]) -> Path:
    """A model repository laid out in huggingface_hub's cache ``cache`` as huggingface_hub lays it:
    ``models--OWNER--NAME/refs/main`` naming :data:`HUB_COMMIT`, whose ``snapshots/<commit>/`` holds a
    link per file into ``blobs/``; ``files`` maps each file's name to what writes it."""
    folder = cache / ('models--' + repo.replace('/', '--'))
    snapshot = folder / 'snapshots' / HUB_COMMIT
    snapshot.mkdir(parents=True)
    (folder / 'blobs').mkdir()
    (folder / 'refs').mkdir()
    (folder / 'refs' / 'main').write_text(HUB_COMMIT)
    for name, write in files.items():
        blob = folder / 'blobs' / name.replace('.', '-')
        write(blob)
        (snapshot / name).symlink_to(blob)
    return folder


def hooked_config(tmp_path: Path, seg_data: Path, max_iters: int = 4, slow: float = 0.0,
                  interval: Optional[int] = None, hooks: Sequence[dict] = ()) -> Path:
    """The tiny config with the launcher tests' hooks: rank weight dumps, the given ones and, if slow,
    slow iterations."""
    hooks = [dict(type='DumpRankWeightsHook'), *hooks]
    if slow:
        hooks.append(dict(type='SlowIterHook', seconds=slow))
    return tiny_seg_config(
        tmp_path, seg_data,
        custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=hooks,
        train_cfg=dict(max_iters=max_iters, val_interval=max_iters),
        default_hooks=dict(checkpoint=dict(interval=interval or max_iters), logger=dict(interval=1),
                           visualization=dict(draw=False)))


def rewind(work_dir: Path, iteration: int) -> Path:
    """Turn a copy of a trained work dir back to what it held after ``iteration``: later checkpoints and
    the final weight dumps removed, ``last_checkpoint`` pointing at iter_{iteration}.pth, samples.txt cut
    to its batches. Returns that checkpoint."""
    checkpoint = work_dir / f'iter_{iteration}.pth'
    assert checkpoint.is_file(), checkpoint
    for path in [*work_dir.glob('iter_*.pth'), *work_dir.glob('rank*.pth')]:
        if not path.stem.startswith('iter_') or int(path.stem.split('_')[1]) > iteration:
            path.unlink()
    (work_dir / 'last_checkpoint').write_text(str(checkpoint))
    samples = work_dir / 'samples.txt'
    if samples.exists():
        samples.write_text(''.join(samples.read_text().splitlines(keepends=True)[:iteration]))
    return checkpoint



def find_resumable_checkpoint(work_dir) -> Optional[str]:
    """The checkpoint a bare ``--resume`` on ``work_dir`` continues from (None: the work dir holds none)."""
    from xcit_dense.engine.training.resume import read_resumable_checkpoint
    found = read_resumable_checkpoint(str(work_dir))
    return found[0] if found else None

def resumable(iteration: int, **parts) -> dict:
    """The smallest training checkpoint a resume restores (what MMEngine's ``Runner.resume`` reads by
    key: meta's epoch and iter, the message hub, a state dict), ``parts`` added or replaced."""
    hub = dict(log_scalars={}, runtime_info={}, resumed_keys={})
    return dict(dict(meta=dict(epoch=0, iter=iteration), state_dict={'w': torch.ones(2)}, message_hub=hub), **parts)


def pause_hook(tmp_path: Path, after_iter: int) -> dict:
    """A PauseAfterIterHook (tests/support/launch_hooks.py) with its files in tmp_path: the run creates
    ``ready`` after ``after_iter`` and goes on once the test creates ``go``."""
    return dict(type='PauseAfterIterHook', after_iter=after_iter, ready=str(tmp_path / f'paused_at_{after_iter}'),
                go=str(tmp_path / f'go_on_{after_iter}'))


class PickleExploit:
    """Unpickling this opens (creates) `marker` for writing: proof that a load ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


class GetattrExploit:
    """Unpickling this evaluates Python code that creates `marker`, if ``builtins.getattr`` is allowed:
    getattr(getattr, '__self__') is the builtins module, its eval is reached the same way, and torch's
    allow-listed ``_rebuild_from_type_v2(func, ...)`` calls ``func``. Plain torch refuses it."""

    class _Builtins:
        def __reduce__(self):
            return (getattr, (getattr, '__self__'))

    class _Eval:
        def __reduce__(self):
            return (getattr, (GetattrExploit._Builtins(), 'eval'))

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        code = f"open({self.marker!r}, 'w').write('pwned')"
        return (torch._tensor._rebuild_from_type_v2, (GetattrExploit._Eval(), torch.Tensor, (code,), {}))


def hide_payload(checkpoint: Path, marker: Path, out: Path) -> Path:
    """A real training checkpoint with a GetattrExploit in its meta: every weight still loads."""
    state = torch.load(checkpoint, weights_only=False)
    state['meta']['note'] = GetattrExploit(str(marker))
    torch.save(state, out)
    return out


# --- processes ----------------------------------------------------------------------------------

def launch_env(**extra: object) -> Dict[str, str]:
    """The environment of launched runs: tests/support importable (launch_hooks, helpers) and tests/
    (conftest as a plugin), PYTHON and extra set."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SUPPORT), str(TESTS), os.environ.get('PYTHONPATH', '')]),
               PYTHON=sys.executable)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def train_cmd(config: Path, work_dir: Path, *args: str) -> List[str]:
    """tools/train.py on a config, into work_dir."""
    return [sys.executable, str(ROOT / 'tools/train.py'), str(config), '--work-dir', str(work_dir), *args]


def read_log(work_dir: Path) -> str:
    """All the text logs under a work dir, joined."""
    return '\n'.join(p.read_text() for p in work_dir.rglob('*.log'))


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until path exists; fail if the process ends first or the time runs out."""
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f'run ended before {path.name} appeared'
        assert time.time() < deadline, f'{path} did not appear'
        time.sleep(0.1)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group that `proc` leads (torchrun workers included) and reap `proc`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@contextlib.contextmanager
def spawned(cmd: Sequence[str], **kwargs) -> Iterator[subprocess.Popen]:
    """Popen in a session of its own; at exit (a timeout, a failed assert, or done) its group is killed."""
    proc = subprocess.Popen(list(cmd), start_new_session=True, **kwargs)
    try:
        yield proc
    finally:
        kill_group(proc)


def run(cmd: Sequence[str], timeout: float = 600, env: Optional[Dict[str, str]] = None,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in the launch environment, text output captured; on timeout the whole process
    group is killed before TimeoutExpired propagates, so no worker outlives the test."""
    with spawned(cmd, env=env if env is not None else launch_env(), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def _manager_classes(cls: type) -> Iterator[type]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _manager_classes(sub)


@contextlib.contextmanager
def own_runner_instances() -> Iterator[None]:
    """Forget the MMEngine logger, message hub and visualizer instances a run in this process made.

    A Runner names them after its config file and the current second, and ``get_instance`` hands
    back an existing instance of that name: a second run of one config within the same second, in
    the same process, would log into the first run's file and work dir. A tool run in a process of
    its own never meets this; in-process runs of the tests would, on a fast machine."""
    from mmengine.utils import ManagerMixin
    before = {cls: set(cls._instance_dict) for cls in _manager_classes(ManagerMixin)}
    try:
        yield
    finally:
        for cls in _manager_classes(ManagerMixin):
            for name in set(cls._instance_dict) - before.get(cls, set()):
                instance = cls._instance_dict.pop(name)
                for handler in list(getattr(instance, 'handlers', ())):
                    if isinstance(handler, logging.FileHandler):
                        handler.close()
                        instance.removeHandler(handler)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Put back the handlers of SIGTERM, SIGUSR1 and SIGINT that a run in this process replaced
    (PreemptionHook's): the session's own SIGTERM handling (conftest.py) must survive it."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


_IN_PROCESS_RUNS = itertools.count()


def _fresh_current_logger() -> None:
    """Make a new MMEngine logger the current one, its console handler on the stdout now in place.

    What a tool logs before its Runner makes a logger of its own (the resume choice, the batch plan)
    goes to the current logger through ``print_log(logger='current')``. An earlier test's logger wrote
    to the stream that was stdout when it was made, so those lines would be missing from the output."""
    from mmengine.logging import MMLogger
    MMLogger.get_instance(f'in-process-tool-{next(_IN_PROCESS_RUNS)}', logger_name='mmengine')


def run_tool_in_process(tool: str, *args: object, cwd: Path) -> subprocess.CompletedProcess:
    """A tool of tools/ run in this process, as ``python TOOL ARGS`` would run it: an interpreter start
    with the stack's imports takes 6-10 s. For what needs no process of its own: a refusal, bad input,
    or a short training whose outcome is read from its status, output, log and work dir (not one whose
    weights are compared with a launched run's: thread counts differ). Its exit status, what it wrote
    on stdout (the log included), and on stderr what it wrote there followed by its exit message or
    traceback. The signal handlers a run installs (PreemptionHook's) are put back (signal_handlers_kept)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout), \
            contextlib.redirect_stderr(stderr), own_runner_instances(), signal_handlers_kept():
        patch.chdir(cwd)
        patch.setattr(sys, 'argv', [str(ROOT / tool), *map(str, args)])
        _fresh_current_logger()
        try:
            runpy.run_path(str(ROOT / tool), run_name='__main__')
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, (int, type(None))):
                stderr.write(f'{exc.code}\n')
        except Exception:  # as the interpreter would: the traceback, status 1
            stderr.write(traceback.format_exc())
            code = 1
    return subprocess.CompletedProcess([tool, *map(str, args)], code or 0, stdout.getvalue(), stderr.getvalue())


def run_together(*launches: Dict[str, object], timeout: float = 600) -> List[subprocess.CompletedProcess]:
    """Independent launches (a reference run beside the first run of a chain), each given as Popen's
    keyword arguments (``args``, ``env``, ``cwd``), started at once and waited for: on 2 cores one
    interpreter imports the stack while the other does. Their pipes are read at once (one thread
    each), so that none waits on a full pipe. As with ``run``, each process group is killed at the
    end, also on a timeout or a failure."""
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(spawned(
            launch['args'], **{'env': launch_env(), **{k: v for k, v in launch.items() if k != 'args'}},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for launch in launches]
        with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
            outputs = list(pool.map(lambda proc: proc.communicate(timeout=timeout), procs))
    return [subprocess.CompletedProcess(list(launch['args']), proc.returncode, out, err)
            for launch, proc, (out, err) in zip(launches, procs, outputs)]


def rank_processes(target: Callable, args_of: Callable[[int], tuple], method: str = 'spawn', world: int = 2,
                   timeout: float = 300) -> List[object]:
    """Start ``world`` processes ``target(*args_of(rank), results)`` (``method``: 'spawn' for a fresh
    interpreter, 'fork' to share this process's imports) and return what each put on ``results``, in
    the order they came; every process is joined, or killed, also on a timeout or a failure."""
    context = multiprocessing.get_context(method)
    results = context.Queue()
    ranks = [context.Process(target=target, args=(*args_of(rank), results)) for rank in range(world)]
    for process in ranks:
        process.start()
    try:
        return [results.get(timeout=timeout) for _ in ranks]
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def free_ports(count: int, exclude: Iterable[int] = ()) -> List[int]:
    """Distinct TCP ports that were free a moment ago, none of them in `exclude`."""
    ports: List[int] = []
    excluded = set(exclude)
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(('', 0))  # free on every interface, so on loopback too
            port = s.getsockname()[1]
        if port not in ports and port not in excluded:
            ports.append(port)
    return ports


def free_port() -> int:
    """One TCP port that was free a moment ago."""
    return free_ports(1)[0]


# --- capabilities ---------------------------------------------------------------------------------

CAP_CHOWN, CAP_LINUX_IMMUTABLE, CAP_SYS_ADMIN = 0, 9, 21  # bits of /proc/self/status's CapEff


def has_capability(bit: int) -> bool:
    """Whether this process holds the Linux capability `bit` (CapEff in /proc/self/status)."""
    try:
        status = Path('/proc/self/status').read_text()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith('CapEff:')), '0')
    return bool(int(effective, 16) >> bit & 1)


def can_chattr() -> bool:
    """CAP_LINUX_IMMUTABLE, chattr, and a temp file system that supports file attributes."""
    if not (has_capability(CAP_LINUX_IMMUTABLE) and shutil.which('chattr') and shutil.which('lsattr')):
        return False
    return subprocess.run(['lsattr', '-d', tempfile.gettempdir()], capture_output=True).returncode == 0


# whether this machine should provide each capability (then CI=true turns a skip into a failure)
MACHINE_HAS: Dict[str, Callable[[], bool]] = {
    # tools/run_tests.sh installs slurm-wlm and munge as root where apt-get exists
    'slurm': lambda: os.geteuid() == 0 and shutil.which('apt-get') is not None,
    'tmpfs': lambda: has_capability(CAP_SYS_ADMIN),  # mount
    'chattr': can_chattr,
    'netns': lambda: os.geteuid() == 0,  # network namespaces for test hosts (tests/support/netns.py)
    'chown': lambda: os.geteuid() == 0,  # a folder given to another user (CAP_CHOWN)
    # a network interface besides loopback, and openssl (the test https server's certificate): every
    # CI machine has them (a container started with --network none has no interface to route to)
    'ipv4': lambda: True,
    'openssl': lambda: True,
    'cc': lambda: True,  # a C compiler for inductor (compile=True): part of the documented install
}


def require_capability(name: str, available: bool, reason: str) -> None:
    """Skip (listed under 'capabilities missing' in the summary) when `available` is false; under
    CI=true on a machine that should have the capability, fail instead, so that CI never skips it silently."""
    if available:
        return
    if os.environ.get('CI') == 'true' and MACHINE_HAS[name]():
        pytest.fail(f'CI=true on a machine that should have {name}, yet: {reason}')
    pytest.skip(f'{CAPABILITY_MISSING} {name}: {reason}')


# --- the repository stays clean -------------------------------------------------------------------

# written by Python and pytest themselves, never by the code under test
NOISE = ('__pycache__/', '.pyc', '.pytest_cache/')


def repo_state(root: Path = ROOT) -> Optional[Set[str]]:
    """`git status` of root, ignored and untracked files listed one by one (None outside git)."""
    if not shutil.which('git'):
        return None
    proc = subprocess.run(['git', 'status', '--porcelain', '--ignored', '--untracked-files=all', '--', '.',
                           ':(exclude).venv'], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, GIT_OPTIONAL_LOCKS='0'), timeout=120)
    if proc.returncode != 0:
        return None
    return {line for line in proc.stdout.splitlines()
            if not any(n in line for n in NOISE)}


# multi-node runs (tests/cluster/test_scale_out.py, tests/cluster/test_slurm_multinode.py)
SGD = dict(optimizer=dict(_delete_=True, type='SGD', lr=0.05, momentum=0.9, weight_decay=0.0))


def sgd_config(tmp_path: Path, seg_data: Path, hooks: List[dict] = (), steps: int = 2) -> Path:
    """The tiny config under plain SGD (its steps follow the gradient, so a wrongly combined batch
    shows), each rank dumping its weights at the end; a checkpoint after every optimizer step."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return tiny_seg_config(
        tmp_path, seg_data, optim_wrapper=SGD,
        custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=[dict(type='DumpRankWeightsHook'), *hooks],
        train_cfg=dict(max_iters=steps, val_interval=100),
        default_hooks=dict(checkpoint=dict(interval=1), logger=dict(interval=1),
                           visualization=dict(draw=False)))


def env(**extra: object) -> Dict[str, str]:
    """The launch environment with one thread per process (several processes share 2 cores)."""
    return launch_env(OMP_NUM_THREADS=1, **extra)


def report(log: str) -> None:
    """Print the plan and throughput lines (pytest -s shows them)."""
    for line in log.splitlines():
        if any(mark in line for mark in ('Run plan:', 'img_per_s', 'elastic restart', 'Slurm requeue')):
            print(line.split(' - ', 1)[-1][:400])


def rank_weights(work_dir: Path, world: int) -> List[Dict[str, torch.Tensor]]:
    """Every rank's dumped weights, asserted equal across ranks."""
    weights = [torch.load(work_dir / f'rank{r}.pth', weights_only=True) for r in range(world)]
    for r in range(1, world):
        for key in weights[0]:
            assert torch.equal(weights[0][key], weights[r][key]), f'rank {r} differs from rank 0 at {key}'
    return weights


def assert_matches(weights: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor],
                   rtol: float = 1e-5) -> None:
    """The same parameters as ``reference``, each equal to ``rtol`` (the multi-node runs' bar)."""
    assert weights.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(weights[key], value, rtol=rtol, atol=1e-7, msg=key)


@contextlib.contextmanager
def log_records():
    """The records the current MMEngine logger emits inside the block."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()  # where print_log(logger='current') writes
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
