"""tools/gpu_bundle.py and tools/gpu_device_check.py (xcit_launch.gpu_bundle, xcit_launch.device_check)
without network: the requirement check of a bundle, its pins against the stack's, and the device
script's step plan against the check's."""
import zipfile
from pathlib import Path

from helpers import ROOT
from xcit_dense.acceptance import gpu_check
from xcit_launch import device_check, gpu_bundle


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


def test_the_bundle_pins_the_stacks_versions():
    bundle, runtime = _pins(gpu_bundle.REQUIREMENTS), _pins(ROOT / 'requirements' / 'runtime.txt')
    shared = set(bundle) & set(runtime)
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'pycocotools'} <= shared
    assert {name: bundle[name] for name in shared} == {name: runtime[name] for name in shared}
    assert not set(bundle) & gpu_bundle.MACHINE_HAS


def test_the_device_script_runs_the_checks_steps_in_its_order():
    assert device_check.STEPS == gpu_check.STEPS
    assert device_check.NEEDS_NO_COMPILED_OP == gpu_check.NEEDS_NO_COMPILED_OP
    # the whole call in 8 minutes: 30 s for the probe and the install, then the subset build and the steps
    assert 30 + device_check.PHASE_LIMITS['build_subset'] + sum(device_check.GPU_BUDGETS.values()) <= 8 * 60
