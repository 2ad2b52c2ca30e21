"""Every private name of another package that the toolkit uses is listed, with its reason, in
``dev/private-names.toml``, and every listed name is still used: a change of those packages'
internals then breaks a named, reasoned place, never one nobody knew of.

The guard is inverted: it does not block a fixed list of names (the old test blocked a list of
MMEngine's loop and Runner internals that resuming once relied on); it finds every private name of
another package (torch, mmengine, pickle, ... any module that is not ``xcit_dense``, ``xcit_launch``
or ``xcit_mmcv_ext``) and fails on the names the list lacks. A name is private when one of its
links starts with ``_`` and is not a dunder. Read from the source (``ast``) of the three packages:

- an import of a private name or from a private module (``from torch._dynamo.callback import ...``,
  ``import torch._functorch.config``);
- an attribute chain that starts at a name bound by an import of another package and has a private
  link (``torch._dynamo.exc``, ``dist.distributed_c10d._get_default_store``), ``getattr`` and the
  like with a private constant name on such a chain included;
- a private attribute on an object whose type is another package's class, where the source tells
  it: a parameter annotated with that class, a name assigned from a call of that class;
- in a toolkit class whose bases include another package's class: a private method or attribute
  defined that overrides one of that class's (``RPNHead._bbox_post_process``), and a private
  ``self.``/``cls.``/``super().`` attribute that the other package's class defines (in its class
  or set on ``self`` in its source). Those classes are imported (the toolkit's modules are not):
  their MRO and source say what they define.

Names are keyed by their owning package and the dotted name, a class by its ``__module__`` and
``__qualname__`` (so that how it was imported does not matter), ``torch.ops.NS.`` by ``NS``; the
key stops after the first link past the last private one that is not a module or a class
(``pickle._Unpickler.dispatch``, not ``...dispatch.items``).

Not counted, and so not in the list: the toolkit's own private names (``self._x`` of its own
classes, its ``_helpers``), dunders, names in strings. In particular the pickle globals that
``io/checked_unpickler.py`` refuses or allows (``'torch._utils._rebuild_tensor_v2'`` and the like in
its tables) are not uses: they are names a checkpoint file may name, which the reader checks before
anything is built, not names the toolkit calls; where the reader does call such a function, it
calls it by an attribute or import that this check finds and the list holds.

Kept from the old test: no MMEngine loop method is replaced on an object (``loop.run_epoch = ...``),
and the process-group module (``process_group.py``) imports nothing of resume."""
import ast
import functools
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

import pytest
from helpers import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, the same reader, installed with mmengine there
    import tomli as tomllib

pytestmark = pytest.mark.quick

OWN = ('xcit_dense', 'xcit_launch', 'xcit_mmcv_ext')
ALLOW_LIST = ROOT / 'dev' / 'private-names.toml'
LOOP_METHODS = frozenset({'run', 'run_epoch', 'run_iter'})  # never replaced on an object
ATTR_FUNCTIONS = frozenset({'getattr', 'hasattr', 'setattr', 'delattr'})
MISSING = object()


class Use(NamedTuple):
    """One use of another package's private name: the line and the key (the dotted name)."""
    line: int
    name: str


def is_private(link: str) -> bool:
    """A link starting with ``_`` that is not a dunder."""
    return link.startswith('_') and not (link.startswith('__') and link.endswith('__'))


def is_own(dotted: str) -> bool:
    return dotted.split('.')[0] in OWN


def owner(key: str) -> str:
    """The package a key belongs to: its first link, ``NS`` for ``torch.ops.NS.``."""
    parts = key.split('.')
    return parts[2] if parts[:2] == ['torch', 'ops'] and len(parts) > 3 else parts[0]


@functools.lru_cache(maxsize=None)
def resolve(dotted: str) -> Any:
    """The object a dotted name of another package names, imported; MISSING where it cannot be had."""
    parts = dotted.split('.')
    for count in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:count]))
        except ImportError:
            continue
        for link in parts[count:]:
            obj = getattr(obj, link, MISSING)
            if obj is MISSING:
                return MISSING
        return obj
    return MISSING


def key_of(dotted: str) -> str:
    """The key of a used dotted name: classes by where they are defined, cut after the first link
    past the last private one that is neither a module nor a class."""
    parts = dotted.split('.')
    last_private = max((i for i, link in enumerate(parts) if is_private(link)), default=len(parts) - 1)
    key = parts[:1]
    for i in range(1, len(parts)):
        key.append(parts[i])
        obj = resolve('.'.join(parts[:i + 1]))
        if obj is MISSING:
            return '.'.join(key + parts[i + 1:])
        if isinstance(obj, type):
            key = f'{obj.__module__}.{obj.__qualname__}'.split('.')
        elif i >= last_private and not inspect.ismodule(obj):
            break
    return '.'.join(key)


class Source:
    """One module of the toolkit: its tree and what each imported name is bound to."""

    def __init__(self, module: str, text: str, is_package: bool = False):
        self.module = module
        self.tree = ast.parse(text)
        self.package = module if is_package else module.rpartition('.')[0]
        self.bindings: Dict[str, str] = {}
        self.parents: Dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bindings[alias.asname] = alias.name
                    else:
                        top = alias.name.split('.')[0]
                        self.bindings[top] = top
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name != '*':
                        self.bindings[alias.asname or alias.name] = f'{self.imported_module(node)}.{alias.name}'

    def imported_module(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ''
        return importlib.util.resolve_name('.' * node.level + (node.module or ''), self.package)

    def dotted(self, node: ast.AST) -> Optional[str]:
        """The dotted name an expression names through this module's imports, None where it is no
        such chain."""
        links: List[str] = []
        while isinstance(node, ast.Attribute):
            links.append(node.attr)
            node = node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
            try:
                return self.dotted(ast.parse(node.value, mode='eval').body)
            except SyntaxError:
                return None
        if not isinstance(node, ast.Name) or node.id not in self.bindings:
            return None
        return '.'.join([self.bindings[node.id]] + links[::-1])


class Toolkit:
    """The toolkit's modules, read once, and how its classes' bases resolve."""

    def __init__(self, sources: Dict[str, Tuple[Path, Source]]):
        self.sources = sources

    def find_class(self, dotted: str, depth: int = 0) -> Optional[Tuple[Source, ast.ClassDef]]:
        """The toolkit class a dotted name names, following re-exports."""
        module, _, name = dotted.rpartition('.')
        if module not in self.sources or depth > 10:
            return None
        source = self.sources[module][1]
        for node in source.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return source, node
        bound = source.bindings.get(name)
        return self.find_class(bound, depth + 1) if bound and is_own(bound) else None

    def ancestor_names(self, source: Source, cls: ast.ClassDef, depth: int = 0) -> Set[str]:
        """The names the toolkit's classes among a class's ancestors define in their bodies."""
        names: Set[str] = set()
        for base in cls.bases:
            dotted = source.dotted(base)
            if dotted is None and isinstance(base, ast.Name):
                dotted = f'{source.module}.{base.id}'
            own = self.find_class(dotted) if dotted and is_own(dotted) and depth < 10 else None
            if own:
                names |= {target.id if isinstance(target, ast.Name) else target.name
                          for item in own[1].body
                          for target in ([item] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                                         else getattr(item, 'targets', [getattr(item, 'target', None)]))
                          if isinstance(target, (ast.Name, ast.FunctionDef, ast.AsyncFunctionDef))}
                names |= self.ancestor_names(*own, depth=depth + 1)
        return names

    def foreign_classes(self, source: Source, cls: ast.ClassDef, depth: int = 0) -> List[type]:
        """Every class of another package in the MRO of a toolkit class, in MRO order."""
        found: List[type] = []
        for base in cls.bases:
            dotted = source.dotted(base)
            if dotted is None and isinstance(base, ast.Name):
                dotted = f'{source.module}.{base.id}'
            if dotted is None:
                continue
            if is_own(dotted):
                own = self.find_class(dotted)
                if own and depth < 10:
                    found += self.foreign_classes(*own, depth=depth + 1)
            else:
                obj = resolve(dotted)
                if isinstance(obj, type):
                    found += list(obj.__mro__)
        return list(dict.fromkeys(found))


@functools.lru_cache(maxsize=None)
def self_attributes(cls: type) -> frozenset:
    """The attributes a class's own source sets on ``self``; empty where it has no Python source."""
    try:
        tree = ast.parse(inspect.cleandoc('\n' + inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    return frozenset(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id == 'self'
                     and isinstance(node.ctx, ast.Store))


def defining_class(classes: List[type], name: str) -> Optional[type]:
    """The first of ``classes`` that defines ``name``, in its class or on ``self`` in its source."""
    for cls in classes:
        if name in vars(cls) or name in self_attributes(cls):
            return cls
    return None


def imported_classes(source: Source) -> List[type]:
    """The MROs of the classes of other packages that a module imports, in the order of their names."""
    classes = [resolve(dotted) for dotted in sorted(source.bindings.values()) if not is_own(dotted)]
    return [c for cls in classes if isinstance(cls, type) for c in cls.__mro__]


def class_uses(toolkit: Toolkit, source: Source, cls: ast.ClassDef) -> Iterator[Use]:
    """Private names of another package's class that a toolkit class overrides or touches: of its
    bases, or, for a mixin (``super()`` reaching past the toolkit's classes), of the class it is
    mixed into, found among the classes its module imports."""
    classes = [c for c in toolkit.foreign_classes(source, cls) if c is not object]
    own = toolkit.ancestor_names(source, cls)

    def found(line: int, name: str) -> Iterator[Use]:
        base = defining_class(classes, name) if is_private(name) else None
        if base is not None:
            yield Use(line, key_of(f'{base.__module__}.{base.__qualname__}.{name}'))

    def found_past_mixin(line: int, name: str) -> Iterator[Use]:
        base = defining_class(imported_classes(source), name)
        yield Use(line, key_of(f'{base.__module__}.{base.__qualname__}.{name}') if base else f'?.{name}')

    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from found(item.lineno, item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            for target in (item.targets if isinstance(item, ast.Assign) else [item.target]):
                if isinstance(target, ast.Name):
                    yield from found(item.lineno, target.id)
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        first = method.args.args[0].arg
        for node in ast.walk(method):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id == first and classes:
                yield from found(node.lineno, node.attr)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == 'super':
                if defining_class(classes, node.attr) or not is_private(node.attr) or node.attr in own:
                    yield from found(node.lineno, node.attr)
                else:  # past the toolkit's classes and their bases: a mixin's, overriding where it is the method's
                    lines = [node.lineno] + ([method.lineno] if node.attr == method.name else [])
                    for line in lines:
                        yield from found_past_mixin(line, node.attr)


def typed_names(source: Source, function: ast.AST) -> Dict[str, List[type]]:
    """The names in a function whose type is another package's class: parameters annotated with
    it, names assigned from a call of it, names an ``isinstance`` call tests against it."""
    def foreign_class(node: ast.AST) -> Any:
        dotted = source.dotted(node)
        return resolve(dotted) if dotted and not is_own(dotted) else MISSING

    typed: Dict[str, List[type]] = {}
    args = function.args
    for arg in args.posonlyargs + args.args + args.kwonlyargs:
        cls = foreign_class(arg.annotation) if arg.annotation else MISSING
        if isinstance(cls, type):
            typed.setdefault(arg.arg, []).append(cls)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            cls = foreign_class(node.value.func)
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'isinstance'
              and len(node.args) == 2 and isinstance(node.args[0], ast.Name)):
            cls, names = foreign_class(node.args[1]), [node.args[0].id]
        else:
            continue
        if isinstance(cls, type):
            for name in names:
                typed.setdefault(name, []).insert(0, cls)
    return typed


def typed_key(classes: List[type], name: str) -> str:
    """The key of a private attribute read on an object of one of ``classes`` (the narrowest
    first): the class that defines it, else the narrowest."""
    cls = defining_class([c for narrow in classes for c in narrow.__mro__], name) or classes[0]
    return key_of(f'{cls.__module__}.{cls.__qualname__}.{name}')


def private_uses(source: Source, toolkit: Toolkit) -> Iterator[Use]:
    """Each use of another package's private name in one toolkit module."""
    def chain(line: int, dotted: Optional[str]) -> Iterator[Use]:
        if dotted and not is_own(dotted) and any(is_private(link) for link in dotted.split('.')):
            yield Use(line, key_of(dotted))

    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from chain(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = source.imported_module(node)
            for alias in node.names:
                yield from chain(node.lineno, module if alias.name == '*' else f'{module}.{alias.name}')
        elif isinstance(node, ast.Attribute) and not isinstance(source.parents.get(node), ast.Attribute):
            yield from chain(node.lineno, source.dotted(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCTIONS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            on = source.dotted(node.args[0])
            yield from chain(node.lineno, on and f'{on}.{node.args[1].value}')
        elif isinstance(node, ast.ClassDef):
            yield from class_uses(toolkit, source, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            typed = typed_names(source, node)
            for inner in ast.walk(node) if typed else ():
                if (isinstance(inner, ast.Attribute) and is_private(inner.attr)
                        and isinstance(inner.value, ast.Name) and inner.value.id in typed):
                    yield Use(inner.lineno, typed_key(typed[inner.value.id], inner.attr))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


@functools.lru_cache(maxsize=None)
def toolkit() -> Toolkit:
    """Every module of the three packages, parsed."""
    return Toolkit({module_name(path): (path, Source(module_name(path), path.read_text(), path.name == '__init__.py'))
                    for package in OWN for path in sorted((ROOT / package).rglob('*.py'))})


@functools.lru_cache(maxsize=None)
def found_uses() -> Dict[str, List[str]]:
    """Each key used, with the places (``file:line``) that use it."""
    places: Dict[str, List[str]] = {}
    kit = toolkit()
    for path, source in kit.sources.values():
        for use in dict.fromkeys(private_uses(source, kit)):
            places.setdefault(use.name, []).append(f'{path.relative_to(ROOT)}:{use.line}')
    return places


def allow_list() -> Dict[str, Dict[str, str]]:
    """The listed keys, each with its entry; the table it is under must be its owning package."""
    with ALLOW_LIST.open('rb') as f:
        tables = tomllib.load(f)
    listed = {}
    for package, entries in tables.items():
        for key, entry in entries.items():
            assert owner(key) == package, f'{key} is listed under [{package}], not [{owner(key)}]'
            assert set(entry) == {'reason', 'checked'} and all(entry.values()), f'{key}: {entry}'
            listed[key] = entry
    return listed


def test_every_private_name_used_is_listed():
    unlisted = {key: places for key, places in found_uses().items() if key not in allow_list()}
    assert not unlisted, f'private names of other packages, not in {ALLOW_LIST.relative_to(ROOT)}:\n' + '\n'.join(
        f'{place}: {key}' for key, places in sorted(unlisted.items()) for place in places)


def test_every_listed_name_is_used():
    unused = sorted(set(allow_list()) - set(found_uses()))
    assert not unused, f'listed in {ALLOW_LIST.relative_to(ROOT)}, no longer used: {unused}'


def test_the_check_finds_each_kind_of_use():
    sources = {
        'xcit_dense.demo': '\n'.join([
            'import torch',
            'import torch._dynamo',                                       # 2: a private module
            'from torch.nn.modules.batchnorm import _BatchNorm',          # 3: a private name
            'from pickle import _Unpickler as U',                         # 4: a private name, renamed
            'from mmengine.runner.checkpoint import CheckpointLoader',
            'from mmdet.models.dense_heads import RPNHead',
            'from .own import Head',
            'x = torch.serialization._load',                              # 8: a chain
            'y = getattr(torch._utils, "_element_size")',                 # 9: a chain and getattr
            'z = CheckpointLoader._schemes',                              # 10: a private class attribute
            'class Mine(RPNHead):',
            '    _own = 1',
            '    def _bbox_post_process(self, results):',                 # 13: an override
            '        self._mine = self._own',
            '        return super()._bbox_post_process(results)',         # 15: super()
            'class Deeper(Head):',
            '    def _bbox_post_process(self, results):',                 # 17: through an own base
            '        return self._helper()',
            'def f(loader: CheckpointLoader):',
            '    return loader._schemes',                                 # 20: an annotated parameter
            'def _helper():',
            '    return torch.cuda.is_available()',
            'def g(layer: torch.nn.Module, x):',
            '    if isinstance(layer, torch.nn.Conv2d):',
            '        return layer._conv_forward(x, None, None)',          # 25: narrowed by isinstance
            '    loader = CheckpointLoader()',
            '    return loader._schemes, layer.__class__',                # 27: assigned from a call
            'from mmengine.infer import BaseInferencer',
            'class Mixin:',
            '    def _load_weights_to_model(self, model, checkpoint, cfg):',  # 30: a mixin's override
            '        return super()._load_weights_to_model(model, checkpoint, cfg)',  # 31
            'class Own:',
            '    def _hook(self):',
            '        return 1',
            'class Sub(Own):',
            '    def _hook(self):',
            '        return super()._hook()']),
        'xcit_dense.own': '\n'.join([
            'from mmdet.models.dense_heads import RPNHead',
            'class Head(RPNHead):',
            '    def _helper(self):',
            '        return self._bbox_post_process']),                   # 4: self. of a base's name
    }
    kit = Toolkit({module: (Path(module), Source(module, text)) for module, text in sources.items()})
    uses = sorted(set(private_uses(kit.sources['xcit_dense.demo'][1], kit)))
    post_process = 'mmdet.models.dense_heads.rpn_head.RPNHead._bbox_post_process'
    assert uses == [
        Use(2, 'torch._dynamo'), Use(3, 'torch.nn.modules.batchnorm._BatchNorm'), Use(4, 'pickle._Unpickler'),
        Use(8, 'torch.serialization._load'), Use(9, 'torch._utils'), Use(9, 'torch._utils._element_size'),
        Use(10, 'mmengine.runner.checkpoint.CheckpointLoader._schemes'), Use(13, post_process),
        Use(15, post_process), Use(17, post_process),
        Use(20, 'mmengine.runner.checkpoint.CheckpointLoader._schemes'),
        Use(25, 'torch.nn.modules.conv.Conv2d._conv_forward'),
        Use(27, 'mmengine.runner.checkpoint.CheckpointLoader._schemes'),
        Use(30, 'mmengine.infer.infer.BaseInferencer._load_weights_to_model'),
        Use(31, 'mmengine.infer.infer.BaseInferencer._load_weights_to_model')]
    assert set(private_uses(kit.sources['xcit_dense.own'][1], kit)) == {Use(4, post_process)}


# MMEngine's loop and Runner internals that resuming once relied on: on ANY object (a hook's ``runner``
# is often unannotated, so the typed rules above cannot see it), never read, written, deleted, imported
# or overridden
MMENGINE_INTERNALS = frozenset({
    '_InfiniteDataloaderIterator', '_epoch', '_iter', '_max_epochs', '_max_iters', '_iterator', '_dataloader',
    '_decide_current_val_interval', '_randomness_cfg', '_has_loaded', '_log_env', '_load_checkpoint_to_model',
    '_load_checkpoint', '_seed', '_launcher', '_world_size', '_train_loop', '_train_dataloader', '_load_from',
    '_resume', '_cfg_dict'})


def internals_uses(tree: ast.AST) -> Iterator[Tuple[int, str]]:
    """(line, what) for each use of a name in MMENGINE_INTERNALS, on whatever object."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, f'imports {a.name}') for a in node.names if a.name in MMENGINE_INTERNALS)
        elif isinstance(node, ast.Attribute) and node.attr in MMENGINE_INTERNALS:
            yield node.lineno, f'uses .{node.attr}'
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in MMENGINE_INTERNALS:
            yield node.lineno, f'overrides {node.name}'


def test_no_mmengine_loop_or_runner_internal_is_touched_on_any_object():
    found = [f'{path.relative_to(ROOT)}:{line}: {what}' for path, source in toolkit().sources.values()
             for line, what in internals_uses(source.tree)]
    assert not found, '\n'.join(found)
    planted = ast.parse('x = runner._train_loop\nloop._epoch += 1\nclass R:\n    def _log_env(self): pass\n')
    assert [line for line, _ in internals_uses(planted)] == [1, 2, 4]


def test_no_loop_method_is_replaced():
    found = [f'{path.relative_to(ROOT)}:{node.lineno}: replaces .{node.attr}'
             for path, source in toolkit().sources.values() for node in ast.walk(source.tree)
             if isinstance(node, ast.Attribute) and node.attr in LOOP_METHODS and not isinstance(node.ctx, ast.Load)]
    assert not found, '\n'.join(found)


def test_the_process_group_module_imports_nothing_of_resume():
    paths = sorted((ROOT / 'xcit_dense').rglob('process_group.py'))
    assert len(paths) == 1, paths  # the process-group module, wherever it lives
    tree = ast.parse(paths[0].read_text())
    imported = [alias.name if isinstance(node, ast.Import) else f'{"." * node.level}{node.module or ""}:{alias.name}'
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names]
    assert not [name for name in imported if 'resume' in name], imported
