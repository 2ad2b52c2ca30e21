"""What importing the toolkit changes in a process (nothing but its registries), what its entry points
and the opt-in ``xcit_dense.checked_loading`` install, and checkpoints read from an object store through
MMEngine's file backend and the checked reader."""
import contextlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import ROOT, GetattrExploit
from mmengine.fileio import LocalBackend, io as mmengine_io
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.checkpoint_schemes import install_checked_schemes
from xcit_launch import entry_point
from xcit_launch.known_warnings import KNOWN_WARNINGS

# what the snapshot compares, before and after `import xcit_dense` (and every toolkit module but the opt-in one)
SNAPSHOT = '''
import json, os, pkgutil, sys, warnings, importlib
def umask():
    with open('/proc/self/status') as status:
        return next(line.split()[1] for line in status if line.startswith('Umask:'))
def snapshot():
    import torch.serialization
    from mmengine.runner.checkpoint import CheckpointLoader
    return {'safe_globals': sorted(map(str, torch.serialization.get_safe_globals())),
            'schemes': {p: f'{l.__module__}.{l.__qualname__}' for p, l in CheckpointLoader._schemes.items()},
            'environ': dict(os.environ), 'filters': [repr(f) for f in warnings.filters], 'umask': umask()}
# the third-party modules the toolkit imports, first: their own import-time effects are not the toolkit's
for name in ('cv2', 'torch', 'torch._dynamo', 'torchvision', 'timm', 'mmengine.runner', 'mmengine.fileio', 'mmcv.ops',
             'mmcv.transforms', 'mmdet.models', 'mmdet.datasets', 'mmdet.evaluation', 'mmseg.models',
             'mmseg.datasets', 'mmseg.evaluation', 'pycocotools.coco', 'faster_coco_eval'):
    importlib.import_module(name)
before = snapshot()
import xcit_dense, xcit_launch, xcit_mmcv_ext
for package in (xcit_dense, xcit_launch, xcit_mmcv_ext):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):
        if module.name != 'xcit_dense.checked_loading':
            importlib.import_module(module.name)
after = snapshot()
print(json.dumps({key: [before[key], after[key]] for key in before if before[key] != after[key]}))
'''


@pytest.mark.slow
def test_importing_every_toolkit_module_changes_no_scheme_environment_filter_or_umask():
    """A user's own mmdet run that imports the toolkit (custom_imports: xcit_dense) keeps MMEngine's
    checkpoint schemes (its s3:// and petrel:// readers), its environment, its warning filters and its
    umask. Planted: any of the old import-time effects (schemes replaced, OPENCV_IO_MAX_IMAGE_PIXELS
    set, known warnings silenced) back in a module's import."""
    env = {k: v for k, v in os.environ.items() if k != entry_point.OPENCV_LIMIT_VAR}
    proc = subprocess.run([sys.executable, '-c', SNAPSHOT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {}


@pytest.mark.quick
def test_an_entry_point_sets_the_opencv_limit_and_the_known_filters_only(monkeypatch):
    """Planted: a limit that overrides the user's, or the filters not installed."""
    monkeypatch.setattr(warnings, 'filters', list(warnings.filters))
    monkeypatch.delenv(entry_point.OPENCV_LIMIT_VAR, raising=False)
    monkeypatch.setitem(sys.modules, 'cv2', None)
    monkeypatch.delitem(sys.modules, 'cv2')
    entry_point.prepare_process()
    assert os.environ[entry_point.OPENCV_LIMIT_VAR] == str(entry_point.DEFAULT_MAX_PIXELS)
    category, message = KNOWN_WARNINGS[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(message + ' (known)', category)
        warnings.warn('another warning', UserWarning)
    assert [str(w.message) for w in caught] == ['another warning']
    monkeypatch.setenv(entry_point.OPENCV_LIMIT_VAR, '1000')
    entry_point.prepare_process()
    assert os.environ[entry_point.OPENCV_LIMIT_VAR] == '1000'


class BucketStandIn(LocalBackend):
    """A local stand-in for an object store: ``s3://bucket/key`` is the file ``<root>/bucket/key``,
    fetched to a temporary copy as MMEngine's PetrelBackend fetches it."""

    root = Path()

    def _local(self, filepath) -> Path:
        return self.root / str(filepath).split('://', 1)[1]

    def get(self, filepath) -> bytes:
        return self._local(filepath).read_bytes()

    @contextlib.contextmanager
    def get_local_path(self, filepath):
        copy = self.root / 'fetched.pth'
        copy.write_bytes(self.get(filepath))
        try:
            yield str(copy)
        finally:
            copy.unlink()


@pytest.fixture
def s3_bucket(tmp_path, monkeypatch) -> Path:
    """``s3://`` served by the stand-in (MMEngine's backend tables restored after), and the checked
    schemes installed (CheckpointLoader's table restored after)."""
    monkeypatch.setattr(BucketStandIn, 'root', tmp_path)
    monkeypatch.setitem(mmengine_io.prefix_to_backends, 's3', BucketStandIn)
    monkeypatch.setattr(mmengine_io, 'backend_instances', {})
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))
    install_checked_schemes()
    (tmp_path / 'bucket').mkdir()
    return tmp_path / 'bucket'


@pytest.mark.quick
def test_a_checkpoint_in_an_object_store_is_fetched_then_read_checked(s3_bucket, tmp_path):
    """Through MMEngine's file backend for s3:// (here a local stand-in), then the checked reader: a
    checkpoint loads, one with a payload is refused and runs nothing. Planted: the remote store
    refused outright, or read by MMEngine's own reader (bare torch.load)."""
    torch.save({'state_dict': {'w': torch.arange(3.0)}, 'meta': {'iter': 4}}, s3_bucket / 'model.pth')
    loaded = _load_checkpoint('s3://bucket/model.pth')
    assert torch.equal(loaded['state_dict']['w'], torch.arange(3.0)) and loaded['meta'] == {'iter': 4}
    assert _load_checkpoint('cluster:s3://bucket/model.pth')['meta'] == {'iter': 4}
    torch.save({'state_dict': {}, 'meta': GetattrExploit(str(tmp_path / 'pwned'))}, s3_bucket / 'evil.pth')
    with pytest.raises(CheckpointError, match='refused'):
        _load_checkpoint('s3://bucket/evil.pth')
    assert not (tmp_path / 'pwned').exists() and not (tmp_path / 'fetched.pth').exists()
    with pytest.raises(CheckpointError, match=r'pavi://model: checkpoints are not read from this scheme'):
        _load_checkpoint('pavi://model')


@pytest.mark.quick
def test_a_scheme_another_package_registered_goes_through_its_file_backend_or_is_refused(s3_bucket, monkeypatch):
    """A prefix registered by another package before the install is routed too: served by a file
    backend, read checked; else refused naming it. Planted: another package's reader left in place."""
    def bare_reader(filename, map_location=None):
        return torch.load(filename, weights_only=False)
    CheckpointLoader.register_scheme('mystore://', bare_reader, force=True)
    CheckpointLoader.register_scheme('cloud://', bare_reader, force=True)
    monkeypatch.setitem(mmengine_io.prefix_to_backends, 'mystore', BucketStandIn)
    install_checked_schemes()
    torch.save({'state_dict': {'w': torch.ones(2)}}, s3_bucket / 'm.pth')
    assert torch.equal(_load_checkpoint('mystore://bucket/m.pth')['state_dict']['w'], torch.ones(2))
    with pytest.raises(CheckpointError, match=r'cloud://bucket/m.pth: no MMEngine file backend serves'):
        _load_checkpoint('cloud://bucket/m.pth')
