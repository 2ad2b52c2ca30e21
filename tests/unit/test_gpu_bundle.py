"""tools/misc/gpu_bundle.py and tools/misc/gpu_device_check.py (gpu_check.bundle, gpu_check.device_check)
without network: the requirement check of a bundle, its pins against the stack's, the .pth files
of a --target install, and the call's time plan."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import ROOT

from gpu_check import bundle as gpu_bundle, device_check, machine_check as check


def fake_wheel(folder: Path, name: str, version: str, requires: list) -> Path:
    """A wheel holding only its METADATA, with these Requires-Dist lines."""
    path = folder / f'{name}-{version}-py3-none-any.whl'
    meta = f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n' + ''.join(
        f'Requires-Dist: {r}\n' for r in requires)
    with zipfile.ZipFile(path, 'w') as zf:
        zf.writestr(f'{name}-{version}.dist-info/METADATA', meta)
    return path


def test_every_requirement_must_be_bundled_at_a_fitting_version_or_on_the_machine(tmp_path):
    wheels = [
        fake_wheel(tmp_path, 'mmdet', '3.3.0', ['mmengine<1.0.0,>=0.7.1', 'numpy', 'terminaltables',
                                                'shapely; python_version < "3.8"']),
        fake_wheel(tmp_path, 'mmengine', '0.10.7', ['opencv-python>=3', 'addict', 'yapf; extra == "all"',
                                                    'tomli; python_version < "3.11"']),
        fake_wheel(tmp_path, 'addict', '2.4.0', []),
    ]
    assert gpu_bundle.unmet_requirements(wheels, '3.12') == [
        'mmdet-3.3.0-py3-none-any.whl requires terminaltables: neither bundled nor on the machine']
    assert gpu_bundle.unmet_requirements(wheels, '3.10') == [
        'mmdet-3.3.0-py3-none-any.whl requires terminaltables: neither bundled nor on the machine',
        'mmengine-0.10.7-py3-none-any.whl requires tomli; python_version < "3.11": neither bundled nor on the machine']
    old = [fake_wheel(tmp_path, 'mmdet', '3.3.0', ['mmengine>=0.11']), wheels[1], wheels[2]]
    assert gpu_bundle.unmet_requirements(old, '3.12') == [
        'mmdet-3.3.0-py3-none-any.whl requires mmengine>=0.11, the bundle has mmengine 0.10.7']


def _pins(path: Path) -> dict:
    lines = [line.split('#')[0].strip() for line in path.read_text().splitlines()]
    return dict(line.split('==') for line in lines if '==' in line)


def test_the_bundle_pins_the_stacks_versions_and_mmcv_lite():
    bundle, runtime = _pins(gpu_bundle.REQUIREMENTS), _pins(ROOT / 'requirements' / 'constraints.txt')
    shared = set(bundle) & set(runtime)
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'pycocotools'} <= shared
    assert {name: bundle[name] for name in shared} == {name: runtime[name] for name in shared}
    assert bundle['mmcv-lite'] == _pins(ROOT / 'requirements' / 'mmcv.txt')['mmcv'] and 'mmcv' not in bundle
    assert not set(bundle) & gpu_bundle.MACHINE_HAS


def _finder_installed(python: str, path: list) -> bool:
    """Whether a fresh interpreter with ``path`` as PYTHONPATH has xcit_mmcv_ext's finder at start."""
    code = "import json, sys; print(json.dumps([type(f).__name__ for f in sys.meta_path]))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, path)))
    proc = subprocess.run([python, '-c', code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return 'MmcvExtFinder' in json.loads(proc.stdout)


def test_a_target_folder_runs_its_pth_files_as_site_packages_would(tmp_path):
    """The base interpreter (no toolkit installed, as on the lent machine) with the --target folder
    and the checkout on PYTHONPATH: the finder is there only with the folder's sitecustomize."""
    python = getattr(sys, '_base_executable', sys.executable)
    site = tmp_path / 'site'
    site.mkdir()
    assert not _finder_installed(python, [site, ROOT])
    device_check.enable_pth_files(site)
    assert _finder_installed(python, [site, ROOT])
    (site / 'sitecustomize.py').unlink()  # the .pth file alone is never read from a path entry
    assert not _finder_installed(python, [site, ROOT])


def test_the_call_fits_its_deadline():
    """Every step but the last has a GPU budget; with the probe's and the install's limits and 20 s
    for the check's own start, they fit the device script's default deadline of 6 minutes (a second
    try within 15 minutes of device time); the last step, compile, gets what is left."""
    assert list(check.GPU_BUDGETS) == list(check.STEP_NAMES[:-1]) and check.STEP_NAMES[-1] == 'compile'
    assert device_check.DEADLINE_S == 6 * 60
    assert sum(device_check.PHASE_LIMITS.values()) + sum(check.GPU_BUDGETS.values()) + 20 <= device_check.DEADLINE_S
