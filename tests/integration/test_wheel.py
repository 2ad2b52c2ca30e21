"""A plain (non-editable) install: the wheel that `pip install .` builds imports and trains without
the checkout. It is installed into a fresh environment that sees the stack of the test environment
(a path entry to its site-packages, so torch is not downloaded again) but not its editable install
of this project; a tiny config is trained from another folder with the installed tools/train.py, then
published and read back by the installed tools (the recipes: the installed .mim/configs)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import ROOT, tiny_seg_config

COPY_IGNORED = ('.git', '.venv', 'build', '*.egg-info', '__pycache__', 'work_dirs', 'data', '.gpu_bundle')


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` without the test run's PYTHONPATH (which may name the checkout: pip would see this project
    installed already, and the installed copy would import the checkout's)."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=env, **kwargs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def site_packages(python: Path) -> Path:
    return Path(run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])']).stdout.strip())


@pytest.mark.slow  # building and installing the wheel, then a launched training
def test_the_wheel_imports_and_trains_without_the_checkout(tmp_path, seg_data):
    source = tmp_path / 'source'  # a copy: building writes build/ and *.egg-info/ beside setup.py
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*COPY_IGNORED))
    wheels = tmp_path / 'wheels'
    run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q', '-w', wheels, source])
    [wheel] = wheels.glob('xcit_dense-*.whl')
    env_dir = tmp_path / 'env'
    run([sys.executable, '-m', 'venv', '--without-pip', env_dir])
    python = env_dir / 'bin' / 'python'
    site = site_packages(python)
    # the stack's folder as a plain path entry: its .pth files (this project's editable install) are not run
    (site / 'stack.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    run([sys.executable, '-m', 'pip', '--python', python, 'install', '--no-deps', '--no-index', '-q', wheel])

    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    probe = ('import importlib.util, json, sys, mmcv.ops, xcit_dense, xcit_launch, xcit_mmcv_ext\n'
             'print(json.dumps(dict(package=xcit_dense.__file__, benchmarks=importlib.util.find_spec("benchmarks")'
             ' is not None, ext=sys.modules["mmcv._ext"].__name__)))')
    found = json.loads(run([python, '-c', probe], cwd=elsewhere).stdout.strip().splitlines()[-1])
    assert Path(found['package']).is_relative_to(site), found  # the installed copy, not the checkout
    assert not found['benchmarks'], 'the measurement code is not installed'

    mim = site / 'xcit_dense' / '.mim'
    config = tiny_seg_config(tmp_path, seg_data)
    config.write_text(config.read_text().replace(str(ROOT / 'configs'), str(mim / 'configs')))
    assert str(ROOT) not in config.read_text().replace(str(tmp_path), '')
    proc = run([python, mim / 'tools' / 'train.py', config, '--work-dir', 'work'], cwd=elsewhere)
    log = proc.stdout + proc.stderr
    assert not [name for name in ('xcit_dense', 'xcit_launch', 'xcit_mmcv_ext', 'configs', 'tools')
                if f'{ROOT / name}/' in log], 'the run used the checkout'
    assert 'Iter(train) [4/4]' in log
    assert (elsewhere / 'work' / 'iter_4.pth').is_file()
    assert (elsewhere / 'work' / 'last_checkpoint').read_text().strip().endswith('iter_4.pth')

    # published from the install: the recipe is found, and read back, under the installed .mim/configs
    run([python, mim / 'tools' / 'model_converters' / 'publish_model.py', elsewhere / 'work' / 'iter_4.pth',
         'published', '--config', config], cwd=elsewhere)
    (folder,) = (elsewhere / 'published').iterdir()
    recipe = json.loads((folder / 'model.json').read_text())['recipe']
    assert recipe == 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py'
    proc = run([python, mim / 'tools' / 'infer.py', folder, seg_data / 'images' / 'validation', '--out-dir', 'pictures',
                '--device', 'cpu'], cwd=elsewhere)
    assert '4 of 4 images done' in proc.stdout, proc.stdout[-2000:]
