"""Building mmdet/mmseg models from this toolkit's configs, outside a Runner."""
import logging
from contextlib import contextmanager
from typing import Iterator, Optional, Union

from mmengine.config import Config
from mmengine.logging import MMLogger, print_log
from mmengine.model import revert_sync_batchnorm
from torch import nn

from .compile_option import take_compile_option
from .config_check import check_config
from .datasets.palette import complete_palettes
from .tasks import task_of_config


def load_config(config: Union[str, Config], cfg_options: Optional[dict] = None) -> Config:
    """Read a config file (importing its ``custom_imports``), merge ``cfg_options`` and check it; a
    palette shorter than the classes (inherited with the base config) is extended."""
    cfg = Config.fromfile(config) if isinstance(config, str) else config.copy()
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    check_config(cfg)
    complete_palettes(cfg)
    return cfg


@contextmanager
def quiet_current_logger(level: int = logging.WARNING) -> Iterator[None]:
    """MMEngine's current logger at ``level`` or above for the block: a model's ``init_weights`` logs each
    parameter's initialisation (over a thousand lines for Mask R-CNN), meant for a run's log file, not for
    the terminal of a tool that only builds the model."""
    logger = MMLogger.get_current_instance()
    old = logger.level
    logger.setLevel(max(old, level))
    try:
        yield
    finally:
        logger.setLevel(old)


def build_model(config: Union[str, Config], cfg_options: Optional[dict] = None,
                init: bool = True) -> nn.Module:
    """Build ``cfg.model`` in the config's ``default_scope`` (mmdet or mmseg).

    SyncBN layers become BN: this builds a model for one process (see the train tool for
    distributed runs). The backbone's ``compile`` key, which the run applies, is left out: an eager model.
    """
    cfg = load_config(config, cfg_options)
    model = task_of_config(cfg).build_model(take_compile_option(cfg.model)[0])
    has_sync_bn = any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    if has_sync_bn:
        print_log('SyncBN converted to BN: single-process model', logger='current')
        model = revert_sync_batchnorm(model)
    if init:
        with quiet_current_logger():
            model.init_weights()
    return model
