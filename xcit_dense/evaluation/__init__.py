"""Evaluation metrics: ``FasterCocoMetric``, mmdet's ``CocoMetric`` computed by faster-coco-eval.

The metric subclasses mmdet's, so its module is imported only when a config builds it: importing
this package does not import mmdet (the segmentation configs do not need it).
"""
from typing import Any

from mmengine.registry import METRICS


@METRICS.register_module(name='FasterCocoMetric')
def _build_faster_coco_metric(**kwargs: Any) -> Any:
    """Build a ``FasterCocoMetric`` named in a config (found from mmdet's scope as well)."""
    from .coco_metric import FasterCocoMetric
    return FasterCocoMetric(**kwargs)


def __getattr__(name: str) -> Any:
    """``FasterCocoMetric``, imported on first use."""
    if name == 'FasterCocoMetric':
        from .coco_metric import FasterCocoMetric
        return FasterCocoMetric
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = ['FasterCocoMetric']
