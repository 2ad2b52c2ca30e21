"""Check a launch before any worker starts: the config exists and loads, its data files exist.

Run by the launch scripts with the tool's arguments (their --cfg-options count). It loads two
modules of xcit_dense by path, without the package, so that mmdet and mmseg are not imported:
the check takes a second or two. Prints one message and exits non-zero when the launch cannot work.
"""
import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parents[1] / 'xcit_dense'


def load(name: str) -> ModuleType:
    """xcit_dense/<name>.py as a stand-alone module."""
    spec = importlib.util.spec_from_file_location(f'xcit_dense_preflight_{name}', PACKAGE / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('stage', choices=['train', 'test'], help='which dataloaders the run reads')
    parser.add_argument('config')
    args, tool_args = parser.parse_known_args()
    load('known_warnings').silence_known_warnings()
    data_files = load('data_files')
    loaders = data_files.TRAIN_LOADERS if args.stage == 'train' else data_files.TEST_LOADERS
    problem = data_files.preflight(args.config, loaders, data_files.parse_cfg_options(tool_args))
    if problem:
        sys.exit(f'error: {problem}')


if __name__ == '__main__':
    main()
