"""No run state in module globals of ``xcit_dense/``: a run's state lives in its context
(``engine.distributed.run_context``), and only ``engine/distributed/process_wide.py`` holds what a
signal handler needs (its docstring says why).

The rule, read from the source (``ast``):

1. no ``global`` statement anywhere;
2. a module-level name is never changed after import: no function or method (of its module, or of
   another that imports the name or the module) assigns or deletes an item or attribute of it,
   augments one, rebinds ``module.NAME``, or calls one of its in-place methods (``MUTATORS``); a
   function's own parameters and locals of the same name are not the module's. Building a table
   at import time (at module level) is fine;
3. a module-level value made by a call is one of ``FACTORIES``, each with its reason: constants
   (compiled patterns, struct layouts, frozen dataclasses, another package's function), context
   variables (set and reset within a block, per thread), the unpickler's opcode table built at import.
   A lock used only as a constant would be listed there too; an entry no module calls fails the test.

Allowed without a listing: constants and tables that nothing changes (rule 2 checks that), the
registries of other packages (MMEngine's, by decorators), ``functools`` caches of pure functions
(decorators), and anything of ``process_wide.py``, whose objects may be changed from any module.
"""
import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from helpers import ROOT

PROCESS_WIDE = 'xcit_dense/engine/distributed/process_wide.py'
MUTATORS = {'append', 'extend', 'insert', 'pop', 'popitem', 'remove', 'clear', 'update', 'setdefault', 'add',
            'discard', 'sort', 'reverse', 'appendleft', 'extendleft', 'difference_update', 'intersection_update',
            'symmetric_difference_update', '__setitem__', '__delitem__', 'set'}
FACTORIES = {  # the calls a module-level value may come from (the called name as written), and why
    're.compile': 'a compiled pattern: immutable',
    'struct.Struct': 'a binary layout: immutable',
    'frozenset': 'immutable',
    'dict': 'a table, checked by rule 2 like a display',
    'Task': 'a frozen dataclass (xcit_dense/tasks.py)',
    'torch.get_rng_state().numel': 'an int',
    'contextvars.ContextVar': 'set and reset within a block (a token), per thread and task',
    '_Dispatch': "the checked unpickler's opcode table, built once at import",
    'getattr': "another package's function, looked up once at import",
}


def modules(root: Path) -> Dict[str, Path]:
    return {'.'.join(path.relative_to(root).with_suffix('').parts): path
            for path in sorted((root / 'xcit_dense').rglob('*.py'))}


def top_level(statements: List[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's statements outside functions and classes (those under ``if``, ``try``, ``with`` too)."""
    for node in statements:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from top_level(node.body + getattr(node, 'orelse', []) + getattr(node, 'finalbody', [])
                                 + [s for handler in getattr(node, 'handlers', []) for s in handler.body])


def module_names(tree: ast.Module) -> Dict[str, ast.expr]:
    """The names a module binds at its top level (not in functions or classes), with their values."""
    names = {}
    for node in top_level(tree.body):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None else []
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    names[name.id] = node.value
    return names


def functions(tree: ast.AST, outer: Set[str] = frozenset()) -> Iterator[Tuple[ast.AST, Set[str]]]:
    """Each function and lambda under ``tree``, with the names local to it and to the functions around it."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
            local |= {inner.id for inner in body_nodes(node)
                      if isinstance(inner, ast.Name) and isinstance(inner.ctx, (ast.Store, ast.Del))}
            yield node, local | outer
            yield from functions(node, local | outer)
        else:
            yield from functions(node, outer)


def body_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, without those of the functions and classes defined in it."""
    stack = list(function.body) if isinstance(function.body, list) else [function.body]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def changes(tree: ast.Module, module: str, globals_of: Dict[str, Set[str]]) -> List[str]:
    """Rule 2: where a function of ``tree`` changes a module-level name (its module's or another's)."""
    own = set(globals_of[module])
    imported_names: Dict[str, str] = {}  # a name imported from a project module -> that module
    imported_modules: Dict[str, str] = {}  # an alias of a project module -> the module
    package = module.split('.')[:-1] if not module.endswith('__init__') else module.split('.')
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = '.'.join(package[:len(package) - node.level + 1] + [node.module or '']).strip('.') \
                if node.level else node.module or ''
            for alias in node.names:
                if f'{base}.{alias.name}' in globals_of:
                    imported_modules[alias.asname or alias.name] = f'{base}.{alias.name}'
                elif base in globals_of and alias.name in globals_of[base]:
                    imported_names[alias.asname or alias.name] = base
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in globals_of and alias.asname:
                    imported_modules[alias.asname] = alias.name
    found = []

    def owner(expr: ast.expr, local: Set[str]):
        """The module whose top-level name ``expr`` is (a Name or ``module.NAME``), else None."""
        if isinstance(expr, ast.Name) and expr.id not in local:
            return module if expr.id in own else imported_names.get(expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id not in local:
            target = imported_modules.get(expr.value.id)
            return target if target and expr.attr in globals_of[target] else None
        return None

    for function, local in functions(tree):
        for node in body_nodes(function):
            changed = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    if isinstance(target, (ast.Subscript, ast.Attribute)):
                        changed += [target.value, target]  # X[...] / X.attr, and module.X itself
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                changed.append(node.func.value)
            for expr in changed:
                where = owner(expr, local)
                if where:
                    found.append(f'{module}:{node.lineno}: {ast.unparse(node)[:80]} (a global of {where})')
    return found


def offences(root: Path) -> Tuple[List[str], Set[str]]:
    """What breaks the rule under ``root``/xcit_dense, and the factories called there."""
    parsed = {name: ast.parse(path.read_text(), str(path)) for name, path in modules(root).items()}
    process_wide = PROCESS_WIDE[:-3].replace('/', '.')
    globals_of: Dict[str, Set[str]] = {}
    for name, tree in parsed.items():
        values = module_names(tree)
        # a context variable's set() is per context (rule 3 lists it); process_wide's objects may change
        globals_of[name] = set() if name == process_wide else {
            n for n, value in values.items()
            if not (isinstance(value, ast.Call) and ast.unparse(value.func) == 'contextvars.ContextVar')}
    found, called = [], set()
    for name, tree in parsed.items():
        found += [f'{name}:{node.lineno}: global {", ".join(node.names)}'
                  for node in ast.walk(tree) if isinstance(node, ast.Global)]
        found += changes(tree, name, globals_of)
        for target, value in module_names(tree).items():
            branches = [value]
            while branches:  # a value chosen by `or` or `if` is each of its branches
                value = branches.pop()
                if isinstance(value, ast.BoolOp):
                    branches += value.values
                elif isinstance(value, ast.IfExp):
                    branches += [value.body, value.orelse]
                elif isinstance(value, ast.Call) and name != process_wide:
                    called.add(ast.unparse(value.func))
                    if ast.unparse(value.func) not in FACTORIES:
                        found.append(f'{name}:{value.lineno}: {target} = {ast.unparse(value)[:60]} (not in FACTORIES)')
    return found, called


def test_no_module_holds_run_state():
    found, called = offences(ROOT)
    assert not found, '\n'.join(found)
    assert set(FACTORIES) <= called, f'FACTORIES no module calls any more: {set(FACTORIES) - called}'


def test_planted_run_state_is_found(tmp_path):
    """Each way of keeping run state in a module is found; a table built at import, a local of the same
    name, a context variable and process_wide's objects are not."""
    files = {
        'xcit_dense/__init__.py': '',
        'xcit_dense/a.py': ('import contextvars\nfrom typing import List\n'
                            'HOSTS: List[str] = []\nTABLE = {}\nTABLE.update(x=1)\nFLAG = contextvars.ContextVar("f")\n'
                            'WATCH = Watch()\nCOUNT = 0\n'
                            'def note(hosts):\n    HOSTS[:] = hosts\n    FLAG.set(1)\n'
                            'def bump():\n    global COUNT\n    COUNT += 1\n'
                            'def local(TABLE):\n    TABLE["x"] = 2\n'),
        'xcit_dense/b.py': ('from . import a\nfrom .a import TABLE\n'
                            'def grow():\n    TABLE.setdefault("y", 3)\n'
                            'def swap():\n    a.HOSTS = []\n'
                            'def inner():\n    def f():\n        a.TABLE.clear()\n    return f\n'),
        'xcit_dense/engine/__init__.py': '', 'xcit_dense/engine/distributed/__init__.py': '',
        'xcit_dense/engine/distributed/process_wide.py': 'class P:\n    signal = 0\nPROCESS = P()\n',
        'xcit_dense/c.py': ('from .engine.distributed.process_wide import PROCESS\n'
                            'def note(signum):\n    PROCESS.signal = signum\n'),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found, _ = offences(tmp_path)
    assert {line.split(' (')[0] for line in found} == {
        'xcit_dense.a:10: HOSTS[:] = hosts', 'xcit_dense.a:13: global COUNT', 'xcit_dense.a:7: WATCH = Watch()',
        "xcit_dense.b:4: TABLE.setdefault('y', 3)", 'xcit_dense.b:6: a.HOSTS = []', 'xcit_dense.b:9: a.TABLE.clear()',
    } and len(found) == 6, found
