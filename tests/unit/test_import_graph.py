"""No module of the project's packages imports, directly or through others, a module that imports it back.

The graph is read from the source (``ast``), not from an import: every ``import`` and ``from ... import``
counts, at module level and inside functions alike (a function-level import only defers a circle to
the first call). An import of ``a.b.c`` is an edge to ``a.b.c`` alone: Python runs the packages'
``__init__`` first whatever is imported, and an ``__init__`` that imports its submodules to register
them is no circle. An ``__init__`` is a node like any other where it is imported by name
(``from xcit_dense.models import XCiT`` is an edge to ``xcit_dense.models``), with its own imports as
its edges, so a submodule that imports its package's re-exports back is found.
"""
import ast
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

from helpers import ROOT

PACKAGES = ('xcit_dense', 'xcit_launch', 'xcit_mmcv_ext')
Graph = Dict[str, Dict[str, int]]  # module -> {module it imports: line of the first such import}


def modules_of(root: Path, packages: Sequence[str]) -> Dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob('*.py')):
            parts = list(path.relative_to(root).with_suffix('').parts)
            found['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return found


def imported(name: str, path: Path, modules: Dict[str, Path]) -> Iterator[Tuple[str, int]]:
    """The project modules ``name`` imports, with their lines: ``from m import x`` is an edge to the
    submodule ``m.x`` where there is one, else to ``m``."""
    package = name.split('.') if path.name == '__init__.py' else name.split('.')[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                base = '.'.join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                yield (f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base), node.lineno


def import_graph(root: Path, packages: Sequence[str]) -> Graph:
    modules = modules_of(root, packages)
    graph: Graph = {name: {} for name in modules}
    for name, path in modules.items():
        for target, line in imported(name, path, modules):
            if target in modules and target != name:
                graph[name].setdefault(target, line)
    return graph


def circles(graph: Graph) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def describe(graph: Graph, group: List[str]) -> str:
    return '; '.join(f'{a} imports {b} (line {graph[a][b]})' for a in group for b in graph[a] if b in group)


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph(ROOT, PACKAGES)
    assert 'xcit_dense.io.checkpoint' in graph['xcit_dense.io.weights']  # relative imports are resolved
    # absolute ones, across the packages
    assert 'xcit_launch.netif' in graph['xcit_dense.engine.distributed.process_group']
    found = circles(graph)
    assert not found, '\n'.join(describe(graph, group) for group in found)


def test_a_planted_circle_is_found(tmp_path):
    """A circle through a function-level import and one through a package's re-export are found; a
    package's __init__ importing its submodules, which import each other one way, is none."""
    files = {'pkg/__init__.py': 'from . import a, sub\n',
             'pkg/a.py': 'from .b import helper\n',
             'pkg/b.py': 'def helper():\n    from pkg import a\n    return a\n',
             'pkg/sub/__init__.py': 'from .c import C\nfrom .d import D\n',
             'pkg/sub/c.py': 'from pkg.a import helper\nclass C: ...\n',
             'pkg/sub/d.py': 'from .c import C\nclass D(C): ...\n'}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ['pkg'])
    assert circles(graph) == [['pkg.a', 'pkg.b']], graph
    assert 'pkg.b imports pkg.a (line 2)' in describe(graph, ['pkg.a', 'pkg.b'])
    (tmp_path / 'pkg/sub/c.py').write_text('from pkg.sub import D\nclass C: ...\n')  # its package's re-export
    assert circles(import_graph(tmp_path, ['pkg'])) == [['pkg.a', 'pkg.b'], ['pkg.sub', 'pkg.sub.c', 'pkg.sub.d']]


def folders(graph: Graph) -> Graph:
    """The graph between folders: the engine's packages (``xcit_dense.engine.training``) and the other
    top-level parts of each package (``xcit_dense.io``, ``xcit_dense.builder``), each module's edges
    merged into its folder's. A package's ``__init__`` re-exporting its submodules is no edge."""
    def folder(name: str) -> str:
        parts = name.split('.')
        return '.'.join(parts[:3] if parts[:2] == ['xcit_dense', 'engine'] else parts[:2])
    merged: Graph = {}
    for name, targets in graph.items():
        edges = merged.setdefault(folder(name), {})
        for target, line in targets.items():
            if folder(target) != folder(name) and not folder(name).startswith(folder(target) + '.'):
                edges.setdefault(folder(target), line)
    return merged


# the engine's packages in the order they may import each other: each only those before it
ENGINE_ORDER = ('distributed', 'telemetry', 'training', 'planning')


def test_folders_import_each_other_one_way_and_the_engine_by_concern():
    """No folder imports, through others, a folder that imports it back (engine -> analysis -> builder
    -> engine was such a loop); the engine's packages import only those before them in ENGINE_ORDER."""
    graph = folders(import_graph(ROOT, PACKAGES))
    found = circles(graph)
    assert not found, '\n'.join(describe(graph, group) for group in found)
    engine = {f'xcit_dense.engine.{name}': rank for rank, name in enumerate(ENGINE_ORDER)}
    assert set(engine) <= set(graph), sorted(graph)
    backwards = [f'{a} imports {b}' for a in engine for b in graph[a] if b in engine and engine[b] > engine[a]]
    assert not backwards, backwards


def test_a_planted_folder_loop_is_found(tmp_path):
    files = {'xcit_dense/__init__.py': '', 'xcit_dense/builder.py': 'from .engine.training import compile\n',
             'xcit_dense/engine/__init__.py': '', 'xcit_dense/engine/training/__init__.py': '',
             'xcit_dense/engine/training/compile.py': '', 'xcit_dense/engine/planning/__init__.py': '',
             'xcit_dense/engine/planning/run_config.py': 'from ...builder import load_config\n'}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = folders(import_graph(tmp_path, ['xcit_dense']))
    assert circles(graph) == []  # planning -> builder -> training: one way
    (tmp_path / 'xcit_dense/engine/training/compile.py').write_text('from ..planning import run_config\n')
    assert circles(folders(import_graph(tmp_path, ['xcit_dense']))) == [
        ['xcit_dense.builder', 'xcit_dense.engine.planning', 'xcit_dense.engine.training']]
