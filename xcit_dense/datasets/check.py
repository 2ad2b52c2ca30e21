"""What a config's training and validation data hold, read through the real dataset classes:
images found and missing, annotations, classes against the annotation file and the model's heads,
image sizes (each image's as the pipeline loads it against its annotation's), and every sample or
annotation that training would skip, validation refuse or the dataset class drop, counted by kind
in the words of ``problems`` (each image and label map is decoded).

Used by tools/check_dataset.py before a long run, so that a wrong path, a half-extracted archive
or a class list that does not match the annotations is named instead of found hours later.
"""
import contextlib
import copy
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmengine.config import Config
from mmengine.registry import DATASETS, TRANSFORMS, DefaultScope

from xcit_launch.preflight import DataFilesError, check_data_files, config_datasets

from ..pixel_limit import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, MAX_BYTES_KEY, MAX_PIXELS_KEY
from . import _build_checked_coco
from .annotations import duplicate_category_problem, image_size_problem
from .loaded_size import loader_color_type, size_problem
from .problems import LABELS_OUTSIDE, MISSING_IMAGE, MISSING_LABEL_MAP, BadSample, summary
from .robust import check_sample_files, label_values_problem, sample_folders

IGNORE_INDEX = 255  # the label value segmentation ignores (SkipBadSamples' default, mmseg's)

SPLITS = dict(train='train_dataloader', val='val_dataloader')


@dataclass
class SplitReport:
    """The counts of one split and the problems that make it unusable."""
    split: str
    dataset_type: str
    images: int = 0
    missing_images: List[str] = field(default_factory=list)
    annotations: int = 0
    annotation_kind: str = 'instances'
    classes: Tuple[str, ...] = ()
    file_classes: Optional[Tuple[str, ...]] = None  # the annotation file's categories (COCO)
    without_annotations: int = 0
    sizes: List[Tuple[int, int]] = field(default_factory=list)  # (height, width) of each image
    size_mismatches: List[str] = field(default_factory=list)  # images loaded at another size than annotated
    problems: List[str] = field(default_factory=list)
    read: bool = False  # the dataset class read the split's data (else: the problems say why not)
    bad_kinds: Counter = field(default_factory=Counter)  # samples and annotations, by kind
    bad_examples: Dict[str, str] = field(default_factory=dict)  # the first of each kind

    def add_bad(self, kind: str, count: int, example: str) -> None:
        self.bad_kinds[kind] += count
        self.bad_examples.setdefault(kind, example)

    def _classes_line(self) -> str:
        if not self.read and not self.classes:
            return '  classes: not known (the config names none and the data was not read)'
        return (f'  classes: {len(self.classes)} ({", ".join(self.classes)})'
                + ('' if self.read else ', as the config names them (the data was not read)'))

    def lines(self) -> List[str]:
        """The report as printed: a header line, then one indented line per item."""
        out = [f'{self.split} ({self.dataset_type}):',
               f'  images: {self.images} found, {len(self.missing_images)} missing'
               + (f' (e.g. {self.missing_images[0]})' if self.missing_images else ''),
               f'  annotations: {self.annotations} {self.annotation_kind}',
               self._classes_line()]
        if self.file_classes is not None:
            left_out = [c for c in self.file_classes if c not in self.classes]
            if set(self.file_classes) == set(self.classes):
                detail = ' (the same)'
            elif set(self.classes) <= set(self.file_classes):
                detail = f' ({len(left_out)} left out, their annotations unused: {", ".join(left_out)})'
            else:
                detail = f' ({", ".join(self.file_classes)})'
            out.append(f'  annotation file categories: {len(self.file_classes)}{detail}')
        out.append(f'  images without annotations: {self.without_annotations}')
        if self.sizes:
            heights, widths = zip(*self.sizes)
            out.append('  image sizes (h x w): ' + ', '.join(
                f'{name} {int(pick(heights))}x{int(pick(widths))}'
                for name, pick in (('min', min), ('median', median), ('max', max))))
        if self.size_mismatches:
            out.append(f'  images of another size than annotated: {len(self.size_mismatches)}')
        out += [f'  {kind}: {n}, e.g. {self.bad_examples[kind]}' for kind, n in sorted(self.bad_kinds.items())]
        out += [f'  problem: {p}' for p in self.problems]
        return out


def _declared_classes(dataset_cfg: dict, scope: str) -> Tuple[str, ...]:
    """The classes the config names, else those its dataset class declares (``METAINFO``: COCO's 80
    for the recipe, which names none), known before any file is read; () where neither says."""
    named = (dataset_cfg.get('metainfo') or {}).get('classes')
    if named:
        return tuple(named)
    kind = dataset_cfg.get('type')
    with DefaultScope.overwrite_default_scope(scope):
        found = DATASETS.get(kind) if isinstance(kind, str) else kind
    if found is _build_checked_coco:  # the package's lazy builder: the class behind it
        from .coco import CheckedCocoDataset as found
    return tuple((getattr(found, 'METAINFO', None) or {}).get('classes') or ())


def _build(dataset_cfg: dict, scope: str):
    """The dataset as the config describes it, without pipeline or filtering: every image counts."""
    cfg = copy.deepcopy(dataset_cfg)
    cfg.update(pipeline=[], lazy_init=False, serialize_data=False)  # data_list stays readable
    if 'filter_cfg' in cfg:
        cfg['filter_cfg'] = None
    with DefaultScope.overwrite_default_scope(scope), contextlib.redirect_stdout(io.StringIO()):
        return DATASETS.build(cfg)  # quiet: pycocotools prints its progress


def _check_label_values(info: dict, load_labels, classes: int) -> None:
    """Raise ``BadSample`` for a label map whose values, read as ``load_labels`` (mmseg's
    ``LoadAnnotations``: ``reduce_zero_label``, a custom classes' ``label_map``) reads them for
    training, fall outside the classes."""
    labels = load_labels(dict(copy.deepcopy(info), seg_fields=[]))['gt_seg_map']
    problem = label_values_problem(np.unique(labels), classes, IGNORE_INDEX)
    if problem and labels.ndim == 3:  # a colour picture of the classes, not their indices
        problem = (f'a {labels.shape[2]}-channel label map (colours): a label map holds one class index per '
                   f'pixel (grayscale or palette PNG); {problem}')
    if problem:
        raise BadSample(LABELS_OUTSIDE, info['seg_map_path'], problem)


def _coco_categories(ann_file: str) -> Tuple[Tuple[str, ...], Optional[str]]:
    """The annotation file's category names, and what is wrong where two share a name or, else, with the
    first image whose height or width is not a size in pixels (what ``CheckedCocoDataset`` refuses)."""
    with open(ann_file) as f:
        data = json.load(f)
    categories = data.get('categories', [])
    sizes = (image_size_problem(image) for image in data.get('images', []) if isinstance(image, dict))
    return tuple(c['name'] for c in categories), duplicate_category_problem(categories) or next(
        (problem for problem in sizes if problem), None)


def head_class_problem(model: dict, classes: int) -> Optional[str]:
    """What is wrong with the ``num_classes`` of the model's heads (every one that has the key:
    detection's box and mask heads, segmentation's decode and auxiliary heads) for ``classes``
    classes, naming the keys to set; None where all match. Training would stop at its first
    batch with 'Target ... is out of bounds' (or learn fewer classes)."""
    found: List[Tuple[str, int]] = []

    def visit(node, where: str) -> None:
        if isinstance(node, dict):
            if 'num_classes' in node and 'rpn_head' not in where:  # the RPN's one class is 'object'
                found.append((f'{where}.num_classes', node['num_classes']))
            for key, value in node.items():
                visit(value, f'{where}.{key}')
        elif isinstance(node, (list, tuple)):
            for i, value in enumerate(node):
                visit(value, f'{where}.{i}')
    visit(model, 'model')
    wrong = [(key, n) for key, n in found if n != classes]
    if not wrong:
        return None
    return (f'the model has {classes} classes to learn but ' + ', '.join(f'{key}={n}' for key, n in wrong)
            + f': set {"each of these" if len(wrong) > 1 else "it"} to {classes} (num_classes=len(classes) '
            f'in the head\'s dict of your config)')


def palette_problem(metainfo: dict) -> Optional[str]:
    """A palette with fewer colours than the classes (drawing would stop at it), else None."""
    palette, classes = metainfo.get('palette'), metainfo.get('classes') or ()
    if palette and len(palette) < len(classes):
        return (f'metainfo.palette has {len(palette)} colours for {len(classes)} classes (inherited with the '
                f'base config?): set one RGB colour per class, or load the config with '
                f'xcit_dense.builder.load_config, which extends it')
    return None


def check_split(cfg: Config, split: str) -> SplitReport:
    """Read one split of ``cfg`` (train or val) through its dataset class and count what it holds."""
    loader = SPLITS[split]
    dataset_cfg = dict(config_datasets(cfg))[loader]
    # the declared classes, until the dataset class reads its own (a split whose data cannot be read)
    report = SplitReport(split, dataset_cfg.get('type', '?'),
                         classes=_declared_classes(dataset_cfg, cfg.get('default_scope', 'mmengine')))
    try:
        check_data_files(cfg, [loader])
    except DataFilesError as exc:
        report.problems.append(str(exc))
        return report
    try:
        dataset = _build(dataset_cfg, cfg.get('default_scope', 'mmengine'))
    except Exception as exc:  # an annotation file the dataset class cannot read: named, not a traceback
        hint = (' (metainfo.palette: one RGB colour per class; a palette inherited with the base config '
                'has its number of classes)' if 'palette' in str(exc) else '')
        report.problems.append(f'{dataset_cfg.get("type")} cannot read its data: {type(exc).__name__}: '
                               f'{str(exc)[:300]}{hint}')
        return report
    report.classes, report.read = tuple(dataset.metainfo.get('classes', ())), True
    segmentation = 'instances' not in (dataset.data_list[0] if dataset.data_list else {})  # mmseg's
    if segmentation:
        report.annotation_kind = 'label maps'
    else:
        report.file_classes, problem = _coco_categories(dataset.ann_file)
        if problem:
            report.problems.append(f'{dataset.ann_file}: {problem}')
    for kind, count in getattr(dataset, 'problems', {}).items():  # what CheckedCocoDataset dropped
        report.add_bad(kind, count, dataset.examples[kind])
    folders, max_pixels = sample_folders(dataset), cfg.get(MAX_PIXELS_KEY, DEFAULT_MAX_PIXELS)
    max_bytes = cfg.get(MAX_BYTES_KEY, DEFAULT_MAX_BYTES)
    color_type = loader_color_type(dataset_cfg.get('pipeline'))
    if segmentation:
        with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmengine')):
            load_labels = TRANSFORMS.build(dict(type='LoadAnnotations'))
    for info in dataset.data_list:
        size, bad = None, None
        try:
            size = check_sample_files(info, folders, max_pixels, decode=True, max_bytes=max_bytes)
            if segmentation and info.get('seg_map_path'):
                _check_label_values(info, load_labels, len(report.classes))
        except BadSample as exc:
            bad = exc
        if bad and bad.kind == MISSING_IMAGE:
            report.missing_images.append(info['img_path'])
            continue
        report.images += 1
        if bad:
            report.add_bad(bad.kind, 1, f'{bad.path}: {bad.detail}')
        if segmentation:
            has_labels = not (bad and bad.kind == MISSING_LABEL_MAP)
            report.annotations += has_labels
            if size:
                report.sizes.append(tuple(size))
        else:
            count = sum(1 for inst in info['instances'] if not inst.get('ignore_flag'))
            report.annotations += count
            has_labels = count > 0
            if image_size_problem(info) is None:  # (else named with the file's problems: no statistics of it)
                report.sizes.append((info['height'], info['width']))
                mismatch = None if bad else size_problem(info['img_path'], (info['height'], info['width']), color_type)
                if mismatch:
                    report.size_mismatches.append(mismatch)
        report.without_annotations += not has_labels
    if not dataset.data_list:
        report.problems.append('no images at all')
    elif report.missing_images:
        report.problems.append(f'{len(report.missing_images)} image(s) not found, e.g. '
                               f'{report.missing_images[0]}')
    if report.bad_kinds:
        report.problems.append('bad data: ' + summary(report.bad_kinds)
                               + ' (the dataset drops bad annotations; training skips bad samples, '
                                 'validation and test stop at them)')
    if report.size_mismatches:
        report.problems.append(f'{len(report.size_mismatches)} image(s) loaded at another size than their '
                               f'annotations say (boxes and masks would be misplaced), e.g. '
                               f'{report.size_mismatches[0]}')
    problem = palette_problem(dataset.metainfo)
    if problem:
        report.problems.append(problem)
    if report.file_classes is not None and not set(report.classes) <= set(report.file_classes):
        only_cfg = sorted(set(report.classes) - set(report.file_classes))
        only_file = sorted(set(report.file_classes) - set(report.classes))
        report.problems.append(f'the config\'s classes and {dataset.ann_file}\'s categories differ: '
                               f'only in the config {only_cfg or "none"}, only in the file '
                               f'{only_file or "none"}')
    return report


def check_dataset(cfg: Config, splits: Sequence[str] = tuple(SPLITS)) -> List[SplitReport]:
    """The reports of the config's training and validation splits; the model's heads are checked
    against the first split's classes."""
    reports = [check_split(cfg, split) for split in splits]
    first = next((r for r in reports if r.classes), None)
    problem = first and head_class_problem(cfg.get('model') or {}, len(first.classes))
    if problem:
        first.problems.append(problem)
    return reports
