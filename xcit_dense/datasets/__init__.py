"""Datasets: synthetic sets in the COCO and ADE20K formats, and checked/robust loading."""
from .robust import CheckedCocoDataset, SkipBadSamples

__all__ = ['CheckedCocoDataset', 'SkipBadSamples']
