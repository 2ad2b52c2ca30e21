"""Datasets: synthetic sets in the COCO and ADE20K formats, checked/robust loading (bad data
named by kind, ``problems``), and samplers that start at a resumed position with each sample
seeded (``samplers``, ``sample_seeding``).

``CheckedCocoDataset`` subclasses mmdet's ``CocoDataset``, so its module is imported only when
the class is used or a config builds it: importing this package does not import mmdet.
"""
from typing import Any

from mmengine.registry import DATASETS

from .robust import SkipBadSamples, StopOnBadSamples
from .samplers import ResumableInfiniteSampler, ResumableSampler


@DATASETS.register_module(name='CheckedCocoDataset')
def _build_checked_coco(**kwargs: Any) -> Any:
    """Build a ``CheckedCocoDataset`` named in a config (found from mmdet's scope as well)."""
    from .coco import CheckedCocoDataset
    return CheckedCocoDataset(**kwargs)


def __getattr__(name: str) -> Any:
    """``CheckedCocoDataset``, imported on first use."""
    if name == 'CheckedCocoDataset':
        from .coco import CheckedCocoDataset
        return CheckedCocoDataset
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = ['CheckedCocoDataset', 'ResumableInfiniteSampler', 'ResumableSampler', 'SkipBadSamples',
           'StopOnBadSamples']
