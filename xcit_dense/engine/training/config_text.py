"""The run's config whose text is formatted once per content.

MMEngine asks the Runner's config for ``pretty_text`` (its contents formatted by yapf) four times in
a training run (the log's header, the message hub, the config dump, the local visualizer's copy) and
once more at every checkpoint (its ``meta['cfg']``). Formatting a recipe's config takes about a second
of one CPU core (0.8-1.4 s for the demo's Mask R-CNN, 2.6-3.4 s for the COCO recipe, on this project's
2-core machines), for a text that does not change during a run. ``FormattedOnceConfig`` keeps the last
formatted text with the contents it was formatted from and formats again only when they differ, so
every caller gets exactly MMEngine's text.
"""
import copy
from typing import Optional, Tuple

from mmengine.config import Config


class FormattedOnceConfig(Config):
    """A ``Config`` whose ``pretty_text`` is MMEngine's, formatted again only after its contents changed."""

    @classmethod
    def of(cls, cfg: Config) -> 'FormattedOnceConfig':
        """A deep copy of ``cfg`` as this class (what ``Config.__deepcopy__`` copies, the same attributes)."""
        copied = copy.deepcopy(cfg)
        formatted_once = cls.__new__(cls)
        for name, value in vars(copied).items():
            object.__setattr__(formatted_once, name, value)
        return formatted_once

    @property
    def pretty_text(self) -> str:
        contents = repr(self.to_dict())  # what MMEngine's text is made from (milliseconds, against yapf's second)
        kept: Optional[Tuple[str, str]] = vars(self).get('_formatted_text')
        if kept is None or kept[0] != contents:
            kept = (contents, super().pretty_text)
            object.__setattr__(self, '_formatted_text', kept)  # (Config's own __setattr__ sets config keys)
        return kept[1]
