"""The library raises, the tools exit: nothing under xcit_dense/ or xcit_launch/ ends the process
(``sys.exit``, ``SystemExit``, ``os._exit``, ``exit``, ``quit``) except the ``main`` functions that
tools/ wrappers run, and the designed ``os._exit`` calls listed here (after a bounded wait that found a
peer gone, a multi-process run ends at once: docs/exit-abort.md). Read from the source with ``ast``.
"""
import ast
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest
from helpers import ROOT, env, free_port

PACKAGES = ('xcit_dense', 'xcit_launch')
# (file, enclosing function): the process ends there by design, without unwinding
DESIGNED_OS_EXITS = {
    # a failed multi-process run: report, end, wait for no peer
    ('xcit_dense/engine/distributed/process_group.py', '_exit_now'),
    ('xcit_dense/engine/distributed/process_group.py', '_step_expired'),  # the step watch found a step past its bound
    ('xcit_dense/engine/distributed/wait_bounds.py', 'StepWatch._run'),  # the step watch's report itself failed
}
EXIT_CALLS = {('sys', 'exit'), ('os', '_exit')}
EXIT_NAMES = {'SystemExit', 'exit', 'quit', '_exit'}  # the builtins, and the functions imported by name

Site = Tuple[str, str, int, str]  # file, enclosing function ('' at module level), line, what


def exits(path: Path, name: str) -> Iterator[Site]:
    """Every way the source at ``path`` (shown as ``name``) ends the process, with its enclosing function."""
    text = path.read_text()
    if 'exit' not in text and 'quit' not in text:  # every name of EXIT_CALLS and EXIT_NAMES holds one
        return
    def visit(node: ast.AST, scope: List[str]) -> Iterator[Site]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, scope + [child.name])
                continue
            where = '.'.join(scope)
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) \
                    and (child.value.id, child.attr) in EXIT_CALLS:
                yield name, where, child.lineno, f'{child.value.id}.{child.attr}'
            elif isinstance(child, ast.Name) and child.id in EXIT_NAMES:
                yield name, where, child.lineno, child.id
            elif isinstance(child, ast.ImportFrom) and child.module in ('sys', 'os'):
                for alias in child.names:
                    if (child.module, alias.name) in EXIT_CALLS:
                        yield name, where, child.lineno, f'from {child.module} import {alias.name}'
            yield from visit(child, scope)
    yield from visit(ast.parse(text, str(path)), [])


def mains_tools_run(root: Path) -> Set[str]:
    """The library files whose ``main`` a tools/ wrapper imports (``from xcit_launch.torchrun import main``)."""
    found = set()
    for tool in sorted((root / 'tools').rglob('*.py')):
        for node in ast.walk(ast.parse(tool.read_text(), str(tool))):
            if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] in PACKAGES \
                    and any(alias.name == 'main' for alias in node.names):
                found.add(node.module.replace('.', '/') + '.py')
    return found


def unexpected_exits(root: Path) -> Tuple[List[Site], Dict[Tuple[str, str], int]]:
    """The exits under the packages that are neither in a tool-run ``main`` nor designed, and how
    many ``os._exit`` calls each designed site holds."""
    mains = mains_tools_run(root)
    unexpected, designed = [], {site: 0 for site in DESIGNED_OS_EXITS}
    for package in PACKAGES:
        for path in sorted((root / package).rglob('*.py')):
            name = path.relative_to(root).as_posix()
            for site in exits(path, name):
                _, where, _, what = site
                if name in mains and where == 'main':
                    continue
                if what == 'os._exit' and (name, where) in designed:
                    designed[name, where] += 1
                    continue
                unexpected.append(site)
    return unexpected, designed


@pytest.mark.quick
def test_the_scan_finds_every_way_to_exit(tmp_path):
    source = tmp_path / 'sample.py'
    source.write_text('import os, sys\nfrom os import _exit\n'
                      'def f():\n    sys.exit(1)\n'
                      'class C:\n    def g(self):\n        raise SystemExit(2)\n'
                      'def h():\n    try:\n        pass\n    except SystemExit:\n        os._exit(3)\n'
                      'exit(4)\nquit()\n'
                      'def fine():\n    raise ValueError(sys.argv)\n')
    assert [(where, line, what) for _, where, line, what in exits(source, 'sample.py')] == [
        ('', 2, 'from os import _exit'), ('f', 4, 'sys.exit'), ('C.g', 7, 'SystemExit'),
        ('h', 11, 'SystemExit'), ('h', 12, 'os._exit'), ('', 13, 'exit'), ('', 14, 'quit')]


@pytest.mark.quick
def test_the_tools_run_these_mains():
    """The scan of tools/ finds the wrappers (a renamed wrapper would silently narrow the exemption)."""
    assert mains_tools_run(ROOT) == {'xcit_launch/torchrun.py', 'xcit_launch/mmcv_build.py',
                                     'xcit_launch/preflight.py', 'xcit_launch/launch_layout.py'}


@pytest.mark.quick
def test_the_library_raises_and_only_the_tools_exit():
    unexpected, designed = unexpected_exits(ROOT)
    assert not unexpected, 'the library ends the process (raise an exception; a tool\'s main turns it ' \
        'into an exit status): ' + '; '.join(f'{name}:{line} in {where or "module"}: {what}'
                                             for name, where, line, what in unexpected)
    assert designed == {site: 1 for site in DESIGNED_OS_EXITS}, \
        f'the designed os._exit calls moved or multiplied (update DESIGNED_OS_EXITS): {designed}'


@pytest.mark.slow  # two launched processes with a process group (about 15 s)
@pytest.mark.parametrize('raised, status, message', [
    ("ToolkitError('the input is wrong')", 1, 'error: the input is wrong'),
    ('Preempted(signal.SIGTERM)', 128 + signal.SIGTERM, None),  # silent, as tools/train.py
])
def test_a_multi_process_run_ends_on_the_toolkits_errors_as_the_tools_do(raised, status, message):
    """Inside ``process_group`` of a real (one-process gloo) group, the toolkit's exceptions end the
    process at once (the designed os._exit) with the tools' message and status, without a traceback."""
    script = ('import signal\n'
              'from xcit_dense.engine.distributed.process_group import process_group\n'
              'from xcit_dense.errors import Preempted, ToolkitError\n'
              'with process_group("pytorch"):\n'
              f'    raise {raised}\n')
    variables = dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR='127.0.0.1', MASTER_PORT=free_port())
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env(**variables))
    assert proc.returncode == status, proc.stderr[-2000:]
    assert 'Traceback' not in proc.stderr and 'Error' not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert (lines[-1] if message else [line for line in lines if 'error' in line]) == (message or []), lines
