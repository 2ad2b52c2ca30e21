"""The command line tools/check_dataset.py and tools/analysis_tools/browse_dataset.py share: a CONFIG
with ``--cfg-options`` (typically pointing its data elsewhere), loaded as the toolkit loads a config."""
import argparse

from mmengine.config import Config, DictAction

from .builder import load_config
from .tool_errors import stop_on


def config_parser(description: str) -> argparse.ArgumentParser:
    """A parser that takes CONFIG and ``--cfg-options``; a tool adds its own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. train_dataloader.dataset.data_root=/data/coco/')
    return parser


def open_config(args: argparse.Namespace) -> Config:
    """The config ``args`` name, its overrides applied (a palette shorter than the classes: extended);
    a config that does not load stops the tool (ToolStop)."""
    with stop_on(ValueError):
        return load_config(args.config, args.cfg_options)
