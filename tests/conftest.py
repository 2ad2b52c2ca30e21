"""Shared fixtures (tiny XCiT models, a segmentation set) and session guards: the repository gains
no files, downloads go under the temp dir, and missing capabilities are listed at the end."""
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / 'support'))  # helpers and the tests' scripts

# Importing torchvision (as xcit_dense and mmengine do) imports torch._dynamo, which makes inductor's
# cache folder: this run's own, removed at its end (pytest_unconfigure), instead of
# /tmp/torchinductor_<user>; launched runs inherit it.
INDUCTOR_CACHE = None if 'TORCHINDUCTOR_CACHE_DIR' in os.environ else tempfile.mkdtemp(prefix='xcit-tests-inductor-')
if INDUCTOR_CACHE:
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = INDUCTOR_CACHE

from xcit_launch.entry_point import prepare_process  # noqa: E402

prepare_process()  # the session is an entry point: OpenCV's pixel limit before cv2 loads, the known filters
from helpers import CAPABILITY_MISSING, DAY_SPEED, ROOT, env, hooked_config, repo_state, run, sgd_config, train_cmd  # noqa: E402

import xcit_dense  # noqa: E402,F401  (registers XCiT)

# one thread a pytest-xdist worker (tools/run_tests.sh runs two, one a core), else both cores
torch.set_num_threads(1 if 'PYTEST_XDIST_WORKER' in os.environ else 2)


@pytest.fixture(scope='session', autouse=True)
def torch_hub_in_temp(tmp_path_factory) -> Iterator[Path]:
    """torch.hub (the pretrained weights' cache) in the session's temp dir, for subprocesses too."""
    hub = tmp_path_factory.mktemp('torch_home')
    old_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(hub / 'hub'))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('TORCH_HOME', str(hub))
        yield hub
    torch.hub.set_dir(old_dir)


@pytest.fixture(scope='session', autouse=True)
def temp_files_in_session_dir(tmp_path_factory) -> Iterator[Path]:
    """The temp files of launched runs (torchrun's torchelastic_* folders, multiprocessing's) under
    the session's temp dir, which pytest clears, rather than left in /tmp."""
    tmp = tmp_path_factory.mktemp('tmp')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('TMPDIR', str(tmp))
        yield tmp


@pytest.fixture(autouse=True)
def torch_determinism_restored() -> Iterator[None]:
    """A Runner built in this process with ``randomness.deterministic=True`` switches torch's
    deterministic mode on for the whole process: each test leaves the mode as it found it."""
    mode = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


@pytest.fixture(scope='session', autouse=True)
def repository_stays_clean() -> Iterator[None]:
    """Fail the run if the tests added or changed files in the repository (work_dirs/, configs/, ...)."""
    before = repo_state()
    yield
    after = repo_state()
    if before is not None and after is not None and after - before:
        pytest.fail(f'the tests left files in the repository {ROOT}: {sorted(after - before)}')


def pytest_configure(config) -> None:
    """A SIGTERM (a CI time limit, `timeout`) stops the run like Ctrl-C, so that the fixtures' clean-up
    still runs: clusters, namespaces and launched runs are stopped rather than left behind."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, interrupt)


# `bash tools/run_tests.sh quick` (marker "quick"): unit tests that check an install within 3 minutes
# (the backbone against timm, every config's model, checkpoint reading and its safety, mmcv's ops
# served by xcit_mmcv_ext), none launching a run or training more than a step.
QUICK_MODULES = ('test_backbone.py', 'test_timm_equivalence.py', 'test_presets.py', 'test_configs.py',
                 'test_checkpoint_loading.py', 'test_checkpoint_security.py', 'test_mmcv_ext_nms.py',
                 'test_mmcv_ext_roi_align.py', 'test_roi_extractor.py', 'test_fast_layers.py', 'test_layout.py')
QUICK_LEFT_OUT = ('test_training_step',)  # a training step of each recipe's model: a minute each


def pytest_collection_modifyitems(config, items) -> None:
    """Mark the quick check's tests (QUICK_MODULES)."""
    for item in items:
        if item.path.name in QUICK_MODULES and item.path.parent.name == 'unit' \
                and not item.name.startswith(QUICK_LEFT_OUT):
            item.add_marker(pytest.mark.quick)


def pytest_unconfigure(config) -> None:
    """Remove this run's inductor cache (see INDUCTOR_CACHE)."""
    if INDUCTOR_CACHE:
        shutil.rmtree(INDUCTOR_CACHE, ignore_errors=True)
        os.environ.pop('TORCHINDUCTOR_CACHE_DIR', None)


def pytest_sessionfinish(session) -> None:
    """In a pytest-xdist worker: the day's speed it measured goes to the controller, which prints it."""
    if hasattr(session.config, 'workeroutput'):
        session.config.workeroutput['day_speed'] = dict(session.config.stash.get(DAY_SPEED, {}))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller's side of pytest_sessionfinish: a worker's figures joined to its own."""
    node.config.stash.setdefault(DAY_SPEED, {}).update(getattr(node, 'workeroutput', {}).get('day_speed', {}))


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The day's speed (DAY_SPEED) as the session measured it, then one block naming each missing
    capability, its reason and how many tests it skipped."""
    speed = config.stash.get(DAY_SPEED, {})
    if speed:
        terminalreporter.section("the day's speed", sep='-')
        for name, figure in speed.items():
            terminalreporter.write_line(f'{name}: {figure}')
    skipped = defaultdict(int)
    for report in terminalreporter.stats.get('skipped', []):
        message = report.longrepr[2] if isinstance(report.longrepr, tuple) else ''
        message = message.split('Skipped: ', 1)[-1]
        if message.startswith(CAPABILITY_MISSING):
            skipped[message[len(CAPABILITY_MISSING):].strip()] += 1
    if skipped:
        terminalreporter.section('capabilities missing', sep='!', yellow=True, bold=True)
        for reason, count in sorted(skipped.items()):
            terminalreporter.write_line(f'{reason} ({count} test(s) skipped)')


@pytest.fixture
def tiny_xcit():
    """A 4-block, 64-channel XCiT: small enough for every unit test."""
    def build(**kwargs):
        cfg = dict(arch='tiny_12', embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))
        cfg.update(kwargs)
        return xcit_dense.XCiT(**cfg)
    return build


@pytest.fixture
def offline_hub_cache(tmp_path, monkeypatch) -> Path:
    """huggingface_hub's cache in the test's temp dir, offline: what ``HF_HOME=DIR HF_HUB_OFFLINE=1``
    give when huggingface_hub is imported (it reads them into its ``constants`` then), set here for
    this process and, through the environment, for the processes it starts. Fill it with
    ``helpers.cached_hub_repo``."""
    from huggingface_hub import constants
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf'))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hf' / 'hub'))
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    return tmp_path / 'hf' / 'hub'


@pytest.fixture(scope='session')
def seg_data(tmp_path_factory) -> Path:
    """Eight training and four validation images in the ADE20K layout."""
    from xcit_dense.datasets.synthetic import write_segmentation_set
    root = tmp_path_factory.mktemp('seg_data')
    write_segmentation_set(root, 'training', 8, size=(64, 64), seed=0)
    write_segmentation_set(root, 'validation', 4, size=(64, 64), seed=1)
    return root


@pytest.fixture(scope='session')
def trained_tiny_seg(tmp_path_factory, seg_data) -> Tuple[Path, Path]:
    """hooked_config (tests/support/helpers.py: the tiny config, each rank's weights dumped, each batch's
    images in samples.txt) trained once by tools/train.py for 4 iterations with checkpoints iter_2.pth
    and iter_4.pth, and that config: for the tests that test, infer, resume or refuse on a trained work
    dir (``rewind`` turns a copy back to iteration 2). They take a copy (``tiny_seg_run``), never this one."""
    tmp = tmp_path_factory.mktemp('trained_tiny_seg')
    config = hooked_config(tmp, seg_data, max_iters=4, interval=2, hooks=[dict(type='RecordSamplesHook')])
    proc = run(train_cmd(config, tmp / 'run'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp / 'run' / 'last_checkpoint').read_text().strip() == str(tmp / 'run' / 'iter_4.pth')
    assert sorted(p.name for p in (tmp / 'run').glob('iter_*.pth')) == ['iter_2.pth', 'iter_4.pth']
    return config, tmp / 'run'


@pytest.fixture
def tiny_seg_run(tmp_path, trained_tiny_seg) -> Tuple[Path, Path]:
    """A copy of trained_tiny_seg's work dir for one test (``last_checkpoint`` pointing into the copy)."""
    config, source = trained_tiny_seg
    work_dir = tmp_path / 'run'
    shutil.copytree(source, work_dir)
    pointer = work_dir / 'last_checkpoint'
    pointer.write_text(pointer.read_text().replace(str(source), str(work_dir)))
    assert pointer.read_text().startswith(str(work_dir))
    return config, work_dir


@pytest.fixture(scope='session')
def one_process_reference(tmp_path_factory, seg_data) -> Dict[str, torch.Tensor]:
    """The weights of sgd_config (tests/support/helpers.py) trained by one process, 2 images x accumulation 4:
    the effective batch 8 of the multi-node runs (4 processes), 2 optimizer steps."""
    tmp = tmp_path_factory.mktemp('reference')
    config = sgd_config(tmp, seg_data)
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/train.py'), str(config), '--work-dir', str(tmp / 'run'),
                           '--accumulation', '4'], env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert 'world size 1, 2 images per GPU, accumulation 4, effective batch 8' in log
    assert re.search(r'Iter\(train\) \[8/8\]', log)
    return torch.load(tmp / 'run' / 'rank0.pth', weights_only=True)


@pytest.fixture
def file_server(tmp_path) -> Iterator[Dict]:
    """An HTTP server on loopback serving tmp_path/www; it counts the requests per path."""
    root = tmp_path / 'www'
    root.mkdir()
    hits: Dict[str, int] = {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            hits[self.path] = hits.get(self.path, 0) + 1
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield dict(root=root, hits=hits, url=f'http://127.0.0.1:{server.server_address[1]}')
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
