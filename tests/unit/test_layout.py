"""The package's layout: no two modules share a file name, so that a name says which module is meant."""
from collections import defaultdict

from helpers import ROOT

PACKAGES = ('xcit_dense', 'xcit_launch', 'gpu_check')


def test_no_two_modules_share_a_name():
    paths = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob('*.py')):
            if path.name != '__init__.py':
                paths[path.name].append(path.relative_to(ROOT).as_posix())
    assert paths, f'no modules found under {PACKAGES}'
    shared = {name: where for name, where in paths.items() if len(where) > 1}
    assert not shared, f'modules sharing a name (rename one by what it holds): {shared}'
