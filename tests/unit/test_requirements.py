"""The installed distribution's requirements (what ``pip install .`` resolves against the user's
environment): ranges with a lower and an upper bound, never a pin, that the tested versions satisfy."""
import importlib.metadata

import pytest
from helpers import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

STACK = {'torch', 'torchvision', 'mmengine', 'mmdet', 'mmsegmentation', 'timm'}


def ci_versions() -> dict:
    """requirements/constraints.txt: the exact set CI tests (tools/install.sh installs with it)."""
    text = (ROOT / 'requirements' / 'constraints.txt').read_text()
    lines = [line.split('#')[0].strip() for line in text.splitlines()]
    pins = [Requirement(line) for line in lines if line]
    return {canonicalize_name(pin.name): Version(next(iter(pin.specifier)).version) for pin in pins}


@pytest.mark.quick
def test_install_requires_are_bounded_ranges_that_the_tested_versions_satisfy():
    """Read back from the installed metadata. Planted: an exact pin (pip would replace the user's
    torch), a range without an upper bound, a bound the tested version falls outside, or mmcv
    required (pip would replace a compiled mmcv)."""
    requires = [Requirement(line) for line in importlib.metadata.requires('xcit-dense') or []]
    runtime = [req for req in requires if not req.marker or 'extra' not in str(req.marker)]
    tested = ci_versions()
    names = {canonicalize_name(req.name) for req in runtime}
    assert STACK <= names and not {'mmcv', 'mmcv-lite'} & names, names
    assert names <= set(tested), names - set(tested)
    for req in runtime:
        operators = {spec.operator for spec in req.specifier}
        assert operators & {'>=', '>'} and operators & {'<', '<='} and not operators & {'==', '===', '~='}, req
        name = canonicalize_name(req.name)
        assert req.specifier.contains(tested[name]), (req, tested[name])
        assert req.specifier.contains(Version(importlib.metadata.version(req.name))), req
