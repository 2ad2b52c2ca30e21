"""The two tasks, detection (mmdet) and segmentation (mmseg), in one table.

Code that depends on the task reads it here. A package is imported only when a field that
needs it is used, so that a segmentation run never imports mmdet: mmseg's MaskFormer heads
subclass mmdet's when mmdet can be imported, so ``mmseg.models`` is imported with mmdet kept
out, unless mmdet is in already (a config that wants those heads imports ``mmdet.models``).
"""
import importlib
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Tuple

from mmengine.registry import DefaultScope
from torch import nn


@dataclass(frozen=True)
class Task:
    """Where one task's registries, data samples, inferencer and predictions are."""

    name: str  # 'detection' or 'segmentation', as tools report it
    scope: str  # the configs' default_scope, which is also the package
    data_sample: str  # class in <scope>.structures
    inferencer: str  # the stock inferencer, a class in <scope>.apis
    prediction: str  # the data sample field that holds the model's prediction
    dump_results: str  # the metric that saves raw predictions to a .pkl file
    head_keys: Tuple[str, ...]  # state-dict prefixes that only this task's models have
    draws_scores: bool  # the visualizer takes pred_score_thr
    keep_out: Optional[str]  # a package that <scope>.models imports only if it can, kept out

    def module(self, name: str) -> Any:
        """``<scope>.<name>``, imported now, after ``<scope>.models`` (see ``import_models``)."""
        self.import_models()
        return importlib.import_module(f'{self.scope}.{name}')

    def import_models(self) -> Any:
        """``<scope>.models``, registering the task's model classes, imported without ``keep_out``."""
        name = f'{self.scope}.models'
        if name in sys.modules or not self.keep_out or self.keep_out in sys.modules:
            return importlib.import_module(name)
        with _kept_out(self.keep_out):
            return importlib.import_module(name)

    def data_sample_class(self) -> type:
        """The task's data sample class (DetDataSample or SegDataSample)."""
        return getattr(self.module('structures'), self.data_sample)

    def inferencer_class(self) -> type:
        """The task's stock inferencer class (DetInferencer or MMSegInferencer)."""
        return getattr(self.module('apis'), self.inferencer)

    def build_model(self, cfg: Mapping) -> nn.Module:
        """Build a model config in the task's scope, its model classes registered."""
        with DefaultScope.overwrite_default_scope(self.scope):
            return self.module('registry').MODELS.build(cfg)

    def owns_state(self, state: Mapping[str, Any]) -> bool:
        """Whether a state dict has keys that only this task's models have."""
        return any(key.startswith(self.head_keys) for key in state)


class _KeepOut:
    """An import finder under which ``package`` and its modules cannot be found."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == self.package or fullname.startswith(f'{self.package}.'):
            raise ModuleNotFoundError(f'No module named {fullname!r}', name=fullname)


@contextmanager
def _kept_out(package: str) -> Iterator[None]:
    """Within the block, importing ``package`` raises ModuleNotFoundError (optional imports skip it)."""
    finder = _KeepOut(package)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


DETECTION = Task(name='detection', scope='mmdet', data_sample='DetDataSample',
                 inferencer='DetInferencer', prediction='pred_instances',
                 dump_results='DumpDetResults', head_keys=('rpn_head.', 'roi_head.'),
                 draws_scores=True, keep_out=None)
SEGMENTATION = Task(name='segmentation', scope='mmseg', data_sample='SegDataSample',
                    inferencer='MMSegInferencer', prediction='pred_sem_seg',
                    dump_results='DumpResults', head_keys=('decode_head.',),
                    draws_scores=False, keep_out='mmdet')
TASKS = {task.scope: task for task in (DETECTION, SEGMENTATION)}


def task_of_config(cfg: Mapping) -> Task:
    """The task of a config, from its ``default_scope``; ValueError naming the file otherwise."""
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        source = getattr(cfg, 'filename', None)
        raise ValueError(f"config{f' {source}' if source else ''} needs default_scope 'mmdet' or "
                         f"'mmseg', got {scope!r}")
    return TASKS[scope]


def task_of_model(model: nn.Module) -> Task:
    """The task of a built detector or segmentor, from the package its class comes from."""
    package = type(model).__module__.partition('.')[0]
    if package not in TASKS:
        raise ValueError(f'{type(model).__name__} is neither an mmdet detector nor an mmseg segmentor')
    return TASKS[package]


def task_of_state(state: Mapping[str, Any]) -> Optional[Task]:
    """The task whose heads a state dict holds; None when no head shows."""
    return next((task for task in TASKS.values() if task.owns_state(state)), None)
