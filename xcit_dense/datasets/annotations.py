"""Checks of one COCO annotation's box and mask, without decoding anything: what is wrong with it
in the words of ``problems``, or None.

An RLE mask declares its own size and is decoded at that size (20 bytes can declare 40000x40000,
1.6 GB): its size must be the image's and its run lengths must cover exactly that many pixels.
A polygon is rasterised by pycocotools with memory in proportion to its coordinates (about 120
bytes per pixel of extent: ``[0, 0, 4e8, 0, 4e8, 4e8]`` asks for gigabytes, and a failed allocation
there crashes the process), so its points must lie within the image, give or take
``POLYGON_MARGIN`` of its longer side.
"""
import math
from numbers import Real
from typing import Any, List, Optional, Tuple

from .problems import (
    AREA_EMPTY,
    BAD_RLE,
    BOX_EMPTY,
    BOX_NOT_FINITE,
    BOX_NOT_NUMBERS,
    BOX_OUTSIDE,
    BOX_TINY,
    POLYGON_DEGENERATE,
    POLYGON_NOT_NUMBERS,
    POLYGON_OUTSIDE,
)


def _numbers(values: Any) -> bool:
    return isinstance(values, (list, tuple)) and all(
        isinstance(v, Real) and not isinstance(v, bool) for v in values)


def box_problem(ann: dict, height: int, width: int) -> Optional[Tuple[str, str]]:
    """(kind, detail) for an annotation whose ``[x, y, w, h]`` box (or area) mmdet's
    ``CocoDataset`` would crash on or drop, in an image of ``height`` x ``width``; else None."""
    bbox, area = ann.get('bbox'), ann.get('area')
    if not _numbers(bbox) or len(bbox) != 4:
        return BOX_NOT_NUMBERS, f'box {bbox!r}'
    if not all(math.isfinite(v) for v in bbox):
        return BOX_NOT_FINITE, f'box {bbox}'
    x, y, w, h = bbox
    if w <= 0 or h <= 0:
        return BOX_EMPTY, f'box {bbox}'
    if w < 1 or h < 1:
        return BOX_TINY, f'box {bbox}'
    if min(x + w, width) <= max(x, 0) or min(y + h, height) <= max(y, 0):
        return BOX_OUTSIDE, f'box {bbox} in an image of {height}x{width}'
    if not _numbers([area]) or not area > 0:
        return AREA_EMPTY, f'area {area!r}'
    return None


# how far outside the image a polygon's points may lie, as a fraction of the image's longer side
# (annotation tools leave points a little outside; rasterising stays within a few times the image)
POLYGON_MARGIN = 0.25


def polygon_problem(polygon: Any, height: int, width: int) -> Optional[Tuple[str, str]]:
    """(kind, detail) for one polygon of a segmentation in an image of ``height`` x ``width`` that
    mmdet would drop or that would be rasterised far beyond the image, else None."""
    if not _numbers(polygon) or len(polygon) % 2 or not all(math.isfinite(v) for v in polygon):
        return POLYGON_NOT_NUMBERS, f'a polygon {str(polygon)[:80]}'
    if len(polygon) < 6:
        return POLYGON_DEGENERATE, f'a polygon of {len(polygon) // 2} point(s)'
    margin = POLYGON_MARGIN * max(height, width)
    xs, ys = polygon[0::2], polygon[1::2]
    if min(xs) < -margin or min(ys) < -margin or max(xs) > width + margin or max(ys) > height + margin:
        return POLYGON_OUTSIDE, (f'a polygon spanning x {min(xs):g}..{max(xs):g}, y {min(ys):g}..{max(ys):g} '
                                 f'in an image of {height}x{width}')
    return None


def _string_counts(counts: str) -> List[int]:
    """The run lengths of pycocotools' compressed RLE string (its rleFrString, in Python)."""
    runs: List[int] = []
    data, p = counts.encode('ascii'), 0
    while p < len(data):
        value, shift, more = 0, 0, True
        while more:
            if p == len(data):
                raise ValueError('the counts string ends inside a number')
            c = data[p] - 48
            value |= (c & 0x1f) << shift
            more = bool(c & 0x20)
            p, shift = p + 1, shift + 5
            if not more and c & 0x10:
                value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        runs.append(value)
    return runs


def rle_problem(mask: Any, height: int, width: int) -> Optional[Tuple[str, str]]:
    """(kind, detail) for an RLE ``{'size': [h, w], 'counts': ...}`` that cannot be decoded for an
    image of ``height`` x ``width``, else None; a mask that is not a polygon list nor RLE is bad too."""
    if not isinstance(mask, dict):
        return BAD_RLE, f'a mask that is neither polygons nor RLE: {str(mask)[:80]}'
    size, counts = mask.get('size'), mask.get('counts')
    if not _numbers(size) or list(size) != [height, width]:
        return BAD_RLE, f'an RLE of size {size!r} for an image of {height}x{width}'
    try:
        runs = _string_counts(counts) if isinstance(counts, str) else counts
    except (ValueError, UnicodeEncodeError) as exc:
        return BAD_RLE, f'RLE counts that do not decode: {exc}'
    if not _numbers(runs) or any(r < 0 for r in runs) or sum(runs) != height * width:
        return BAD_RLE, f'RLE counts that do not cover its {height}x{width} pixels'
    return None
