"""Check a launch before any worker starts: the config exists and loads, the data files it needs
exist (annotation files that exist and parse, image and label folders that exist).

Imports only mmengine's Config (not torch, mmdet or mmseg), so that the launch scripts check a
config in a second or two, before torchrun or srun start the workers; ``tools/train.py`` runs
the same data-file check at start (``check_data_files``).
"""
import argparse
import json
import os
import sys
from typing import Iterator, List, Optional, Sequence, Tuple

from mmengine.config import Config, DictAction

HINT = 'see README: Datasets (or set data_root with --cfg-options)'
TRAIN_LOADERS = ('train_dataloader', 'val_dataloader')
TEST_LOADERS = ('test_dataloader',)


class DataFilesError(ValueError):
    """A file or folder the config's data needs is missing or unreadable; the message says where to look."""

    def __str__(self) -> str:
        return f'{super().__str__()}; {HINT}'


def config_datasets(cfg: Config) -> Iterator[Tuple[str, dict]]:
    """(loader name, dataset config) of every dataloader, looking inside wrappers."""
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = (cfg.get(loader) or {}).get('dataset')
        while isinstance(dataset, dict) and isinstance(dataset.get('dataset'), dict):
            dataset = dataset['dataset']
        if isinstance(dataset, dict):
            yield loader, dataset


def check_annotation_file(path: str, where: str) -> None:
    """An annotation file must exist and, when it is JSON, parse."""
    if not os.path.isfile(path):
        raise DataFilesError(f'{where}: annotation file not found: {path}')
    if path.endswith('.json'):
        try:
            with open(path) as f:
                json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataFilesError(f'{where}: annotation file {path} is not valid JSON: {exc}') from None


def check_data_files(cfg: Config, loaders: Sequence[str] = TRAIN_LOADERS) -> None:
    """Whole-dataset problems stop the run at start: a missing or unparsable annotation file,
    a missing image folder. Raises DataFilesError naming the file."""
    for loader, dataset in config_datasets(cfg):
        if loader not in loaders:
            continue
        root = dataset.get('data_root') or ''
        if dataset.get('ann_file'):
            check_annotation_file(os.path.join(root, dataset['ann_file']), loader)
        prefix = dataset.get('data_prefix') or {}
        for key in ('img', 'img_path', 'seg_map_path'):
            if prefix.get(key):
                folder = os.path.join(root, prefix[key])
                if not os.path.isdir(folder):
                    raise DataFilesError(f'{loader}: folder not found: {folder} (data_prefix.{key})')
    for loader, evaluator in (('val_dataloader', 'val_evaluator'), ('test_dataloader', 'test_evaluator')):
        metrics = cfg.get(evaluator) or []
        for metric in [metrics] if isinstance(metrics, dict) else metrics:
            if loader in loaders and metric.get('ann_file'):
                check_annotation_file(metric['ann_file'], evaluator)


def preflight(config: str, loaders: Sequence[str], cfg_options: Optional[dict] = None) -> Optional[str]:
    """What stops a launch of ``config`` before any worker starts, as one message; None if nothing."""
    if not os.path.isfile(config):
        return f'config file not found: {config}'
    try:
        cfg = Config.fromfile(config, import_custom_modules=False)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except Exception as exc:  # a config is Python: any error in it stops the launch
        return f'cannot load {config}: {type(exc).__name__}: {exc}'
    try:
        check_data_files(cfg, loaders)
    except DataFilesError as exc:
        return f'{config}: {exc}'
    return None


def parse_cfg_options(tool_args: Sequence[str]) -> Optional[dict]:
    """The ``--cfg-options`` among a tool's arguments (the rest is the tool's business)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_known_args(list(tool_args))[0].cfg_options


def main(argv: Optional[List[str]] = None) -> None:
    """``preflight train|test CONFIG [tool arguments]``: exits with one message when the launch cannot work."""
    parser = argparse.ArgumentParser(description='Check a launch before any worker starts: the config '
                                                 'exists and loads, its data files exist.')
    parser.add_argument('stage', choices=['train', 'test'], help='which dataloaders the run reads')
    parser.add_argument('config')
    args, tool_args = parser.parse_known_args(argv)
    loaders = TRAIN_LOADERS if args.stage == 'train' else TEST_LOADERS
    problem = preflight(args.config, loaders, parse_cfg_options(tool_args))
    if problem:
        sys.exit(f'error: {problem}')
