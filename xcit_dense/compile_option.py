"""The run's ``torch.compile`` option in a model config: ``model.backbone.compile``.

It belongs to the run, not to the model: read and removed before the model is built (the backbone
takes no such argument), so that the builder, inference and resume build the eager model and the
run alone compiles it (engine/training/compile.py).
"""
import copy
from typing import Any, Tuple

COMPILE_KEY = 'compile'  # in the backbone's config


def take_compile_option(model_cfg: Any) -> Tuple[Any, bool]:
    """A model config without the backbone's ``compile`` key (a copy when it had one), and that key."""
    backbone = model_cfg.get('backbone') if isinstance(model_cfg, dict) else None
    if not isinstance(backbone, dict) or COMPILE_KEY not in backbone:
        return model_cfg, False
    model_cfg = copy.deepcopy(model_cfg)
    return model_cfg, bool(model_cfg['backbone'].pop(COMPILE_KEY))
