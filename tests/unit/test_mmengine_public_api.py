"""The toolkit uses MMEngine through its public API: no module of xcit_dense/ or xcit_launch/ imports
or touches the private names that resuming once relied on (a change of MMEngine's internals would
break resume without a word), and engine/distributed/process_group.py imports nothing of resume.

Read from the source (``ast``): an import of a listed name, an attribute of that name read, written or
deleted on any object, a method of that name defined (an override), and a loop method replaced on
an object (``loop.run_epoch = ...``)."""
import ast
from typing import Iterator, Tuple

import pytest
from helpers import ROOT

pytestmark = pytest.mark.quick

PACKAGES = ('xcit_dense', 'xcit_launch')
# MMEngine's private names: its loops' and Runner's internals, and its private functions
PRIVATE = frozenset({
    '_InfiniteDataloaderIterator', '_epoch', '_iter', '_max_epochs', '_max_iters', '_iterator', '_dataloader',
    '_decide_current_val_interval', '_randomness_cfg', '_has_loaded', '_log_env', '_load_checkpoint_to_model',
    '_load_checkpoint', '_seed', '_launcher', '_world_size', '_train_loop', '_train_dataloader', '_load_from',
    '_resume', '_cfg_dict'})
LOOP_METHODS = frozenset({'run', 'run_epoch', 'run_iter'})  # never replaced on an object


def private_uses(source: str) -> Iterator[Tuple[int, str]]:
    """(line, what) for each use of a listed name in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in PRIVATE:
                    yield node.lineno, f'imports {alias.name}'
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE:
                yield node.lineno, f'uses .{node.attr}'
            elif node.attr in LOOP_METHODS and not isinstance(node.ctx, ast.Load):
                yield node.lineno, f'replaces .{node.attr}'
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in PRIVATE:
            yield node.lineno, f'overrides {node.name}'


def test_no_private_mmengine_name_is_used():
    found = [f'{path.relative_to(ROOT)}:{line}: {what}'
             for package in PACKAGES for path in sorted((ROOT / package).rglob('*.py'))
             for line, what in private_uses(path.read_text())]
    assert not found, '\n'.join(found)


def test_the_check_finds_each_kind_of_use():
    source = '\n'.join(['from mmengine.runner.loops import _InfiniteDataloaderIterator', 'x = runner._randomness_cfg',
                        'loop._epoch += 1', 'del loop.run_epoch', 'loop.run_epoch = lambda: None',
                        'class R:', '    def _log_env(self): pass', 'loop.run_epoch()'])
    assert [line for line, _ in private_uses(source)] == [1, 2, 3, 4, 5, 7]


def test_dist_imports_nothing_of_resume():
    tree = ast.parse((ROOT / 'xcit_dense/engine/distributed/process_group.py').read_text())
    imported = [alias.name if isinstance(node, ast.Import) else f'{"." * node.level}{node.module or ""}:{alias.name}'
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names]
    assert not [name for name in imported if 'resume' in name], imported
