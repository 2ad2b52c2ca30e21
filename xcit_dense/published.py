"""Published models: a folder that ``tools/model_converters/publish_model.py`` writes from a training checkpoint, read
back by ``tools/test.py`` and ``tools/infer.py`` in place of CONFIG CHECKPOINT, with no pickle and no
config code from the folder.

The folder holds ``model.safetensors`` (the model's weights: the EMA average for a run trained with
``--ema``), ``model.json`` (:data:`FORMAT`: the recipe config of this repository the run derives from,
the run's typed overrides of it, the weights' sha256, the toolkit version, the figures' source),
a ``README.md`` model card and, for people to read, the run's config as ``config.py``.

Reading it (:func:`open_published`) builds the config from the named recipe (a file under this
repository's ``configs/``) and the overrides of ``model.json``, each value checked against the type the
recipe has at its place before it is used (:class:`PublishedModelError` names the first bad one), and
checks ``model.safetensors`` against the sha256 in ``model.json``. The folder's ``config.py`` is executed
only with ``trust_config`` for a local folder (``--trust-config``), never for an ``hf-hub:`` name.
"""
import ast
import copy
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config

from .builder import load_config
from .errors import ToolkitError
from .io.averaged_weights import trained_weights
from .io.checkpoint import CheckpointError
from .io.checkpoint_schema import SchemaError, class_names, palette
from .io.download import file_digest
from .io.hub import HubError, is_hub_name, resolve_hub_file
from .io.output_files import refuse_link, write_bytes
from .io.weights import read_checkpoint

FORMAT = 'xcit-dense published model'
FORMAT_VERSION = 1
MODEL_JSON, WEIGHTS, CARD, CONFIG_COPY = 'model.json', 'model.safetensors', 'README.md', 'config.py'
MAX_JSON_BYTES = 1 << 20  # a model.json is a few KiB: a larger one is refused unread
MAX_DEPTH = 8  # nesting of the model overrides
# the model keys the named overrides set (num_classes, mean, std) or that a published model never uses
# (init_cfg: the weights hold every tensor, nothing is initialised from a pretrained file)
NAMED_MODEL_KEYS = ('num_classes', 'mean', 'std', 'init_cfg')
REPO_ROOT = Path(__file__).resolve().parents[1]
# the folder whose configs/ holds the recipes: the checkout, or the .mim copy that a regular install
# (pip install ., a wheel) carries beside the package (setup.py's build_py)
RECIPES_HOME = REPO_ROOT if (REPO_ROOT / 'configs').is_dir() else Path(__file__).resolve().parent / '.mim'


class PublishedModelError(ToolkitError):
    """A published model folder that cannot be written or read as it is: one line naming what is wrong."""


@dataclass
class PublishedModel:
    """What a tool needs of a published model: the config to build, the local weights file (its digest
    checked), the classes and colours to name and draw them with, and the model.json read."""

    config: Config
    weights: str
    dataset_meta: Dict[str, Any]
    description: Dict[str, Any]


# --- the recipe ------------------------------------------------------------------------------------------

def base_files(path: Path) -> List[Path]:
    """The files a config's ``_base_`` names (a string or a list of strings), resolved beside it; read by
    parsing, never executing, the file. A ``_base_`` of another package (``mmseg::...``) is skipped."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == '_base_' for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                raise PublishedModelError(f'{path}: its _base_ is not a literal string or list of strings') from None
            names = [value] if isinstance(value, str) else list(value)
            return [(path.parent / name).resolve() for name in names if isinstance(name, str) and '::' not in name]
    return []


def find_recipe(config: str, configs: Path = RECIPES_HOME / 'configs') -> Tuple[str, str]:
    """(the recipe's path relative to the repository, how it was found): the config itself when it is a
    full config of ``configs/`` (not under ``configs/_base_/``), else the first such file met walking its
    ``_base_`` chain depth first, in the order each file names its bases."""
    configs = configs.resolve()

    def is_recipe(path: Path) -> bool:
        return configs in path.parents and (configs / '_base_') not in path.parents

    start = Path(config).resolve()
    if is_recipe(start):
        return str(start.relative_to(configs.parent)), 'the run\'s config is itself a config of configs/'
    seen = set()

    def walk(path: Path, depth: int) -> Optional[Tuple[Path, int]]:
        seen.add(path)
        for base in base_files(path):
            if not base.is_file() or base in seen:
                continue
            if is_recipe(base):
                return base, depth + 1
            found = walk(base, depth + 1)
            if found:
                return found
        return None

    found = walk(start, 0)
    if found:
        return (str(found[0].relative_to(configs.parent)),
                f'the first config of configs/ (not configs/_base_/) met walking the _base_ chain of '
                f'{Path(config).name} depth first, {found[1]} level(s) up')
    raise PublishedModelError(f'{config} derives from no config of {configs} through its _base_ chain: a published '
                              f'model names the recipe it was trained from (pass the run\'s own config with --config, '
                              f'not the merged copy in its work dir)')


# --- typed overrides ----------------------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """Tuples as lists (what JSON holds), recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _is_scalar(value: Any) -> bool:
    return value is None or type(value) in (bool, int, str) or (type(value) is float and math.isfinite(value))


def _check_new(value: Any, where: str, depth: int = 0) -> None:
    """A value at a key the recipe has not: plain data (numbers, strings, None, lists of them, dicts of
    them), never a ``type`` key, which would name a class to build."""
    if depth > MAX_DEPTH:
        raise PublishedModelError(f'{where}: nested deeper than {MAX_DEPTH}')
    if isinstance(value, dict):
        for key, item in value.items():
            if key == 'type':
                raise PublishedModelError(f'{where}.type: a published model cannot name a class the recipe does not')
            _check_new(item, f'{where}.{key}', depth + 1)
    elif isinstance(value, list):
        if len(value) > 1024 or not all(_is_scalar(v) for v in value):
            raise PublishedModelError(f'{where}: a list of at most 1024 numbers, strings or nulls expected')
    elif not _is_scalar(value) or (type(value) is str and len(value) > 1000):
        raise PublishedModelError(f'{where}: a number, string, boolean or null expected, got {type(value).__name__}')


def _same_kind(value: Any, old: Any, where: str) -> None:
    """``value`` may replace the recipe's ``old``: the same kind of plain value (an integer for a float
    too), None for a dict (a layer left out), a list of scalars of the recipe list's kinds."""
    def kind(v: Any) -> str:
        if type(v) is bool or v is None or type(v) is str:
            return type(v).__name__
        if type(v) in (int, float):
            return 'number'
        if isinstance(v, (list, tuple)):
            return 'list'
        return 'dict' if isinstance(v, dict) else type(v).__name__
    _check_new(value, where)
    if value is None and kind(old) in ('dict', 'NoneType'):
        return
    if kind(value) != kind(old):
        raise PublishedModelError(f'{where}: the recipe has a {kind(old)} there, model.json a {kind(value)}')
    if kind(value) == 'list' and old and value:
        kinds = {kind(v) for v in old}
        if len(kinds) == 1 and {kind(v) for v in value} != kinds:
            raise PublishedModelError(f'{where}: the recipe has a list of {kinds.pop()}s there')


def model_changes(run: dict, recipe: dict, where: str = 'model') -> dict:
    """What the run's model config changes in the recipe's, as plain JSON data: the values that differ,
    keys the recipe has not. The named overrides' keys (:data:`NAMED_MODEL_KEYS`) are left out; a changed
    ``type`` (another class) is refused."""
    out = {}
    for key, value in run.items():
        here = f'{where}.{key}'
        if key in NAMED_MODEL_KEYS:
            continue
        if key not in recipe:
            _check_new(_plain(value), here)
            out[key] = _plain(value)
        elif isinstance(value, dict) and isinstance(recipe[key], dict):
            sub = model_changes(value, recipe[key], here)
            if sub:
                out[key] = sub
        elif _plain(value) != _plain(recipe[key]):
            if key == 'type':
                raise PublishedModelError(f'{here}: the run builds {value}, the recipe {recipe[key]}: not a change a '
                                          f'published model can carry')
            _same_kind(_plain(value), _plain(recipe[key]), here)
            out[key] = _plain(value)
    return out


def apply_model_changes(model: dict, changes: Any, where: str = 'model', depth: int = 0) -> None:
    """Set ``changes`` (model.json's ``overrides.model``) into the recipe's ``model``, each value checked
    against the recipe's at its place (:func:`_same_kind`) first; PublishedModelError names a bad one."""
    if not isinstance(changes, dict) or depth > MAX_DEPTH:
        raise PublishedModelError(f'{where}: an object of changes expected')
    for key, value in changes.items():
        here = f'{where}.{key}'
        if key in NAMED_MODEL_KEYS or key == 'type':
            raise PublishedModelError(f'{here}: not changeable here')
        if key not in model:
            _check_new(value, here)
            model[key] = value
        elif isinstance(value, dict) and isinstance(model[key], dict):
            apply_model_changes(model[key], value, here, depth + 1)
        else:
            _same_kind(value, _plain(model[key]), here)
            model[key] = tuple(value) if isinstance(model[key], tuple) else value


def _numbers(value: Any, where: str, count: int, positive: bool = False) -> List[float]:
    if (not isinstance(value, list) or len(value) != count
            or not all(type(v) in (int, float) and math.isfinite(v) and (v > 0 or not positive) for v in value)):
        raise PublishedModelError(f'{where}: a list of {count} {"positive " if positive else ""}numbers expected')
    return [float(v) for v in value]


def _image_scale(value: Any, where: str) -> Optional[Tuple[int, int]]:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2 or not all(type(v) is int and 0 < v <= 1 << 16 for v in value):
        raise PublishedModelError(f'{where}: [width, height] in pixels or null (no resize) expected')
    return tuple(value)


def _test_pipelines(cfg: Config) -> List[list]:
    pipelines = [cfg.get(key, {}).get('dataset', {}).get('pipeline') for key in ('test_dataloader', 'val_dataloader')]
    return [p for p in [*pipelines, cfg.get('test_pipeline')] if isinstance(p, list)]


def resize_scale(cfg: Config) -> Optional[List[int]]:
    """The ``scale`` of the first Resize of the config's test pipeline; None where it has no Resize."""
    for pipeline in _test_pipelines(cfg)[:1]:
        for step in pipeline:
            if step.get('type') == 'Resize' and step.get('scale') is not None:
                return [int(v) for v in step['scale']]
    return None


def _set_everywhere(node: Any, key: str, value: Any) -> None:
    if isinstance(node, dict):
        for name in node:
            if name == key:
                node[name] = value
            else:
                _set_everywhere(node[name], key, value)
    elif isinstance(node, (list, tuple)):
        for item in node:
            _set_everywhere(item, key, value)


def overrides_of(run: Config, recipe: Config, saved_meta: Dict[str, Any]) -> Dict[str, Any]:
    """The typed overrides that turn the recipe into the run's model: classes, their number and colours
    (the run's test set's; the colours from the checkpoint's dataset_meta where the config names none),
    the test image scale, the pixel mean and std, and the other model values that differ (plain data)."""
    metainfo = dict(run.test_dataloader.dataset.get('metainfo') or {})
    classes = metainfo.get('classes') or saved_meta.get('classes')
    colours = metainfo.get('palette') or saved_meta.get('palette')
    preprocessor = run.model.get('data_preprocessor') or {}
    nums = []
    _collect(run.model.to_dict(), 'num_classes', nums)
    return dict(classes=list(classes) if classes else None,
                num_classes=nums[0] if nums else None,
                palette=[list(map(int, c)) for c in colours] if colours else None,
                image_scale=resize_scale(run),
                mean=[float(v) for v in preprocessor['mean']] if preprocessor.get('mean') else None,
                std=[float(v) for v in preprocessor['std']] if preprocessor.get('std') else None,
                model=model_changes(run.model.to_dict(), recipe.model.to_dict()))


def _collect(node: Any, key: str, found: list) -> None:
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                found.append(value)
            else:
                _collect(value, key, found)


def apply_overrides(cfg: Config, overrides: Any) -> Dict[str, Any]:
    """Set model.json's ``overrides`` into the recipe's config ``cfg``, each value type-checked first;
    returns the dataset_meta (classes, palette) the tools name and draw the classes with."""
    where = 'model.json overrides'
    known = {'classes', 'num_classes', 'palette', 'image_scale', 'mean', 'std', 'model'}
    if not isinstance(overrides, dict) or set(overrides) - known:
        raise PublishedModelError(f'{where}: an object with only {", ".join(sorted(known))} expected')
    meta: Dict[str, Any] = {}
    try:
        if overrides.get('classes') is not None:
            meta['classes'] = class_names(overrides['classes'], f'{where}.classes')
        if overrides.get('palette') is not None:
            meta['palette'] = palette(overrides['palette'], f'{where}.palette')
    except SchemaError as exc:
        raise PublishedModelError(str(exc)) from None
    number = overrides.get('num_classes')
    if number is not None and (type(number) is not int or not 0 < number <= 1 << 16):
        raise PublishedModelError(f'{where}.num_classes: a positive integer expected')
    if number is not None and 'classes' in meta and len(meta['classes']) != number:
        raise PublishedModelError(f'{where}: {len(meta["classes"])} classes named, num_classes {number}')
    scale = _image_scale(overrides.get('image_scale'), f'{where}.image_scale')
    mean = std = None
    if overrides.get('mean') is not None:
        mean = _numbers(overrides['mean'], f'{where}.mean', 3)
    if overrides.get('std') is not None:
        std = _numbers(overrides['std'], f'{where}.std', 3, positive=True)
    model = cfg.model.to_dict()
    apply_model_changes(model, overrides.get('model') or {})
    if number is not None:
        _set_everywhere(model, 'num_classes', number)
    if mean or std:
        preprocessor = model.setdefault('data_preprocessor', {})
        preprocessor.update({k: v for k, v in (('mean', mean), ('std', std)) if v})
    _set_everywhere(model, 'init_cfg', None)  # every weight comes from model.safetensors
    cfg.model = model
    for pipeline in _test_pipelines(cfg):
        for step in list(pipeline):
            if step.get('type') == 'Resize':
                if scale is None:
                    pipeline.remove(step)
                else:
                    step['scale'] = scale
    for key in ('test_dataloader', 'val_dataloader'):
        if meta and isinstance(cfg.get(key), dict) and 'dataset' in cfg[key]:
            cfg[key].dataset.metainfo = dict(meta)
    return meta


# --- writing ------------------------------------------------------------------------------------------------

def last_evaluation(checkpoint: str, step: Optional[int]) -> Tuple[Optional[Dict[str, float]], str]:
    """(metrics, where they come from) of the last evaluation in the work dir of ``checkpoint`` (its
    ``*/vis_data/scalars.json``), when that evaluation was at ``step``, the checkpoint's iteration; else
    (None, why not)."""
    files = sorted(Path(checkpoint).resolve().parent.glob('*/vis_data/scalars.json'))
    for path in reversed(files):
        shown = f'{path.relative_to(path.parents[2])} beside the checkpoint'  # no local path published
        for line in reversed(path.read_text(errors='replace').splitlines()):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or any(k.startswith('loss') or k == 'lr' for k in record):
                continue
            metrics = {k: float(v) for k, v in record.items()
                       if k not in ('step', 'time', 'data_time') and type(v) in (int, float)}
            if step is not None and record.get('step') != step:
                return None, (f'not evaluated: the last evaluation in {shown} was at step {record.get("step")}, '
                              f'the checkpoint is of step {step}')
            return metrics, f'the last evaluation, step {record.get("step")}, in {shown}'
    return None, 'not evaluated: no evaluation scalars (vis_data/scalars.json) beside the checkpoint'


def _card(name: str, description: Dict[str, Any], metrics: Optional[Dict[str, float]]) -> str:
    """The model card: what the model is, its figures, how to use it, its licence."""
    lines = [line.strip() for line in (REPO_ROOT / 'LICENSE').read_text().splitlines()[:8] if line.strip()] \
        if (REPO_ROOT / 'LICENSE').is_file() else []
    licence = ', '.join(lines[:2]) + ' (the toolkit\'s LICENSE)' if lines else 'see the toolkit\'s LICENSE'
    over = description['overrides']
    scale = f'resized to {over["image_scale"]}' if over.get('image_scale') else 'not resized'
    figures = ('\n'.join(f'| {k} | {v:.4g} |' for k, v in metrics.items()) if metrics else None)
    return '\n'.join([
        f'# {name}', '',
        f'Recipe: `{description["recipe"]}` of xcit-dense {description["toolkit_version"]} '
        f'({description["recipe_found_by"]}), with the overrides in `model.json`: '
        f'{len(over.get("classes") or [])} classes ({", ".join((over.get("classes") or [])[:8])}'
        f'{", ..." if len(over.get("classes") or []) > 8 else ""}), test images {scale}.', '',
        f'Weights: `{WEIGHTS}` (sha256 `{description["weights"]["sha256"]}`), '
        + ('the EMA average of the trained weights.' if description['weights']['ema_average']
           else 'the trained weights (no EMA average).'), '',
        '## Figures', '',
        *(['| metric | value |', '|---|---|', figures, '', f'From {description["figures"]["source"]}.']
          if figures else [description['figures']['source'] + '.']), '',
        '## Use', '', '```bash', f'python tools/test.py {name}', f'python tools/infer.py {name} IMAGES', '```', '',
        f'The recipe and overrides build the model; `{CONFIG_COPY}` is the run\'s config, for reading (run only '
        f'with `--trust-config`).', '', '## Licence', '', licence, ''])


def publish(checkpoint: str, out_dir: str, config: Optional[str] = None) -> Path:
    """Write the published folder of a training checkpoint into ``out_dir`` (see the module's docstring) and
    return it. The checkpoint is read by the toolkit's checked reader; ``config`` (default: the one ``.py``
    beside the checkpoint) is the run's config. Refuses a missing or unreadable checkpoint, a config
    deriving from no recipe, an existing non-empty folder and a link where a file is written."""
    if not os.path.isfile(checkpoint):
        raise PublishedModelError(f'checkpoint file not found: {checkpoint}')
    try:
        ckpt = read_checkpoint(checkpoint)
    except (CheckpointError, OSError) as exc:
        raise PublishedModelError(str(exc)) from None
    state = ckpt.get('state_dict')
    if not isinstance(state, dict) or not state:
        raise PublishedModelError(f'{checkpoint} is not a training checkpoint (no state_dict)')
    if config is None:
        beside = sorted(Path(checkpoint).resolve().parent.glob('*.py'))
        if len(beside) != 1:
            raise PublishedModelError(f'pass the run\'s config with --config ({len(beside)} .py files beside '
                                      f'{checkpoint})')
        config = str(beside[0])
    if not os.path.isfile(config):
        raise PublishedModelError(f'config file not found: {config}')
    recipe, found_by = find_recipe(config)
    run_cfg, recipe_cfg = load_config(config), load_config(str(RECIPES_HOME / recipe))
    meta = ckpt.get('meta') if isinstance(ckpt.get('meta'), dict) else {}
    overrides = overrides_of(run_cfg, recipe_cfg, meta.get('dataset_meta') or {})
    _check_rebuilds(run_cfg, recipe, copy.deepcopy(recipe_cfg), overrides)

    from safetensors.torch import save as to_safetensors
    data = to_safetensors({k: v.detach().cpu().clone().contiguous() for k, v in state.items()})
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(out_dir) / f'{Path(config).stem}-{digest[:8]}'
    refuse_link(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise PublishedModelError(f'{folder} exists and is not an empty folder: refused (nothing written)')
    metrics, source = last_evaluation(checkpoint, meta.get('iter'))
    description = dict(
        format=FORMAT, format_version=FORMAT_VERSION, recipe=recipe, recipe_found_by=found_by, overrides=overrides,
        weights=dict(file=WEIGHTS, sha256=digest, ema_average=trained_weights(ckpt) is not None,
                     checkpoint=os.path.basename(checkpoint), iteration=meta.get('iter'), epoch=meta.get('epoch')),
        toolkit_version=_version(), figures=dict(source=source, metrics=metrics))
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes(folder / WEIGHTS, data)
    write_bytes(folder / MODEL_JSON, (json.dumps(description, indent=2) + '\n').encode())
    write_bytes(folder / CARD, _card(folder.name, description, metrics).encode())
    write_bytes(folder / CONFIG_COPY, Path(config).read_bytes())
    return folder


def _version() -> str:
    from . import __version__
    return __version__


def _check_rebuilds(run: Config, recipe: str, rebuilt: Config, overrides: Dict[str, Any]) -> None:
    """Refuse to publish overrides that would not rebuild the run's model from the recipe (``rebuilt``: a
    copy of the recipe's config, which the overrides change)."""
    apply_overrides(rebuilt, json.loads(json.dumps(overrides)))
    want = _plain(run.model.to_dict())
    _set_everywhere(want, 'init_cfg', None)
    got = _plain(rebuilt.model.to_dict())
    if want != got:
        differ = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise PublishedModelError(f'the recipe {recipe} with the overrides does not rebuild the run\'s model '
                                  f'(model.{", model.".join(differ)} differ)')


# --- reading ------------------------------------------------------------------------------------------------

def is_published_model(name: str) -> bool:
    """Whether ``name`` names a published model: an ``hf-hub:`` name or a folder holding model.json."""
    return is_hub_name(name) or os.path.isfile(os.path.join(name, MODEL_JSON))


def read_description(path: str) -> Dict[str, Any]:
    """model.json, its format, recipe and digest checked (the overrides are checked as they are applied)."""
    if os.path.getsize(path) > MAX_JSON_BYTES:
        raise PublishedModelError(f'{path}: larger than {MAX_JSON_BYTES} bytes')

    def refuse_constant(name: str) -> None:
        raise ValueError(f'{name} is not a number JSON allows')
    try:
        description = json.loads(Path(path).read_text(), parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PublishedModelError(f'{path}: not readable JSON ({exc})') from None
    if not isinstance(description, dict) or description.get('format') != FORMAT \
            or description.get('format_version') != FORMAT_VERSION:
        raise PublishedModelError(f'{path}: not a {FORMAT} {FORMAT_VERSION} description')
    recipe = description.get('recipe')
    configs = (RECIPES_HOME / 'configs').resolve()
    if (type(recipe) is not str or not recipe.endswith('.py') or os.path.isabs(recipe)
            or configs not in (RECIPES_HOME / recipe).resolve().parents or not (RECIPES_HOME / recipe).is_file()):
        raise PublishedModelError(f'{path}: recipe {recipe!r} is not a config file under {configs}')
    digest = (description.get('weights') or {}).get('sha256') if isinstance(description.get('weights'), dict) else None
    if type(digest) is not str or len(digest) != 64 or not all(c in '0123456789abcdef' for c in digest):
        raise PublishedModelError(f'{path}: weights.sha256 is not a sha256 (64 lowercase hex digits)')
    return description


def open_published(name: str, trust_config: bool = False, cfg_options: Optional[dict] = None) -> PublishedModel:
    """The config and checked weights of a published folder or ``hf-hub:OWNER/NAME[@REV]`` repository.

    The config is the recipe of model.json with its overrides (type-checked); with ``trust_config`` (a
    local folder only) the folder's config.py instead, which is otherwise never executed. The weights'
    sha256 must be model.json's. Raises PublishedModelError in one line."""
    hub = is_hub_name(name)
    if trust_config and hub:
        raise PublishedModelError(f'--trust-config is for a local folder: the config.py of {name} is never run')
    try:
        json_path = resolve_hub_file(name, MODEL_JSON) if hub else os.path.join(name, MODEL_JSON)
        weights = resolve_hub_file(name, WEIGHTS) if hub else os.path.join(name, WEIGHTS)
    except HubError as exc:
        raise PublishedModelError(str(exc)) from None
    description = read_description(json_path)
    if not os.path.isfile(weights):
        raise PublishedModelError(f'{name}: no {WEIGHTS}')
    expected, found = description['weights']['sha256'], file_digest(weights)
    if found != expected:
        raise PublishedModelError(f'{weights} has sha256 {found}, {MODEL_JSON} says {expected}: refused '
                                  f'(damaged or replaced weights)')
    if trust_config:
        cfg = load_config(os.path.join(name, CONFIG_COPY), cfg_options)
        meta = apply_overrides(Config(dict(model=dict(cfg.model.to_dict()))), description.get('overrides'))
    else:
        cfg = Config.fromfile(str(RECIPES_HOME / description['recipe']))
        meta = apply_overrides(cfg, description.get('overrides'))
        try:  # the config's own checks (config_check: the backbone's keys against XCiT's signature)
            cfg = load_config(cfg, cfg_options)
        except ValueError as exc:
            raise PublishedModelError(f'{name}: the recipe with {MODEL_JSON}\'s overrides: {exc}') from None
    return PublishedModel(config=cfg, weights=weights, dataset_meta=meta, description=description)
