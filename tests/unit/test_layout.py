"""The layout: no two modules share a file name (a name says which module is meant); the tools the shell
scripts run exist where they name them."""
import re
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


def test_every_tool_the_shell_scripts_run_exists():
    """The shell scripts (install, launchers, quick start) name the tools they run by path: a moved tool
    whose script was not updated fails only on the path that runs it (XCIT_MMCV=compiled, say)."""
    named = {(script.name, path) for script in sorted((ROOT / 'tools').rglob('*.sh'))
             for path in re.findall(r'tools/[\w/]+\.(?:py|sh)', script.read_text())}
    assert named, 'no tool paths found in tools/*.sh'
    missing = sorted(f'{script}: {path}' for script, path in named if not (ROOT / path).is_file())
    assert not missing, missing
