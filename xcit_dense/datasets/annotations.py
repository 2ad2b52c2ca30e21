"""Checks of one COCO annotation's box and mask, without decoding anything: what is wrong with it
in the words of ``problems``, or None.

An RLE mask declares its own size and is decoded at that size (20 bytes can declare 40000x40000,
1.6 GB): its size must be the image's and its run lengths must cover exactly that many pixels.
A polygon is rasterised by pycocotools with memory in proportion to its coordinates (about 120
bytes per pixel of extent: ``[0, 0, 4e8, 0, 4e8, 4e8]`` asks for gigabytes, and a failed allocation
there crashes the process), so its points must lie within the image, give or take
``POLYGON_MARGIN`` of its longer side. JSON reads a 400-digit integer exactly, beyond what a float
holds: such a number is bad like NaN, not an ``OverflowError`` (in an image's height or width it
makes the file refused, see ``image_size_problem``). An RLE string is decoded in linear
time, each of its numbers at most ``RLE_NUMBER_CHARACTERS`` long (one number of many characters cost
quadratic time), and details quote at most ``SHOWN_CHARACTERS`` of a value.
"""
import math
from numbers import Real
from typing import Any, Optional, Tuple

import numpy as np

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

# pycocotools stores run lengths as 32-bit unsigned integers: 7 characters of 5 bits (35 bits, the sign
# included) write any of them, so a longer number is refused before any arithmetic on it
RLE_NUMBER_CHARACTERS = 7
SHOWN_CHARACTERS = 80


def shown(value: Any) -> str:
    """``value`` as text of at most ``SHOWN_CHARACTERS`` characters, for a warning's detail."""
    text = str(value)
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + '...'


def _numbers(values: Any) -> bool:
    return isinstance(values, (list, tuple)) and all(
        isinstance(v, Real) and not isinstance(v, bool) for v in values)


def duplicate_category_problem(categories: Any) -> Optional[str]:
    """Two categories of a COCO file's list that share a name, named with both ids; None where the
    names differ. mmdet maps a class name to every category of that name, each to a label of its
    own: the second's annotations would be learnt as another class, or as one past the last."""
    first: dict = {}
    for category in categories:
        name = category.get('name') if isinstance(category, dict) else None
        if not isinstance(name, str):
            continue  # not a category mmdet can match by name
        if name in first:
            return f'categories {shown(first[name])} and {shown(category.get("id"))} are both named {shown(repr(name))}'
        first[name] = category.get('id')
    return None


def _finite(value: Real) -> bool:
    """Whether a float holds ``value``: NaN, the infinities and integers beyond float range are not."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an exact integer of hundreds of digits, as JSON reads one
        return False


def image_size_problem(image: dict) -> Optional[str]:
    """Why a COCO ``images`` record's height or width is not a size in pixels (a positive number a
    float holds), naming the image; None where both are. Every check of its annotations and
    pycocotools' rasterising in the metric take them as the image's size, so no annotation of it
    could be judged, and a 400-digit integer raised ``OverflowError`` there."""
    for key in ('height', 'width'):
        value = image.get(key)
        if not _numbers([value]) or not _finite(value) or not value > 0:
            return (f'image {shown(image.get("file_name"))} (id {shown(image.get("id"))}) has {key} '
                    f'{shown(repr(value))}, not a positive number of pixels')
    return None


def box_problem(ann: dict, height: int, width: int) -> Optional[Tuple[str, str]]:
    """(kind, detail) for an annotation whose ``[x, y, w, h]`` box (or area) mmdet's
    ``CocoDataset`` would crash on or drop, in an image of ``height`` x ``width``; else None."""
    bbox, area = ann.get('bbox'), ann.get('area')
    if not _numbers(bbox) or len(bbox) != 4:
        return BOX_NOT_NUMBERS, f'box {shown(repr(bbox))}'
    if not all(_finite(v) for v in bbox):
        return BOX_NOT_FINITE, f'box {shown(bbox)}'
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
    if not _numbers(polygon) or len(polygon) % 2 or not all(_finite(v) for v in polygon):
        return POLYGON_NOT_NUMBERS, f'a polygon {shown(polygon)}'
    if len(polygon) < 6:
        return POLYGON_DEGENERATE, f'a polygon of {len(polygon) // 2} point(s)'
    margin = POLYGON_MARGIN * max(height, width)
    xs, ys = polygon[0::2], polygon[1::2]
    if min(xs) < -margin or min(ys) < -margin or max(xs) > width + margin or max(ys) > height + margin:
        return POLYGON_OUTSIDE, (f'a polygon spanning x {min(xs):g}..{max(xs):g}, y {min(ys):g}..{max(ys):g} '
                                 f'in an image of {height}x{width}')
    return None


def _string_counts(counts: str) -> np.ndarray:
    """The run lengths of pycocotools' compressed RLE string (its rleFrString), decoded at once with
    numpy: each character holds 5 bits of a number, low bits first, and 0x20 where the number goes
    on; the last sets the sign (0x10); from the fourth on, a number is added to the run two before.
    Raises ValueError for a character outside the 64 of the format, a number longer than
    ``RLE_NUMBER_CHARACTERS`` or a string that ends inside a number."""
    codes = np.frombuffer(counts.encode('ascii'), np.uint8).astype(np.int64) - 48
    if not codes.size:
        return codes
    if codes.min() < 0 or codes.max() > 63:
        raise ValueError('a character outside the 64 of the format')
    ends = np.flatnonzero(codes & 0x20 == 0)  # the last character of each number
    if not ends.size or ends[-1] != codes.size - 1:
        raise ValueError('the counts string ends inside a number')
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > RLE_NUMBER_CHARACTERS:
        raise ValueError(f'a number of {lengths.max()} characters, more than {RLE_NUMBER_CHARACTERS}')
    place = np.arange(codes.size) - np.repeat(starts, lengths)  # each character's place in its number
    values = np.add.reduceat((codes & 0x1f) << (5 * place), starts)
    values -= ((codes[ends] & 0x10) != 0) << (5 * lengths)  # negative: the bits above set, as pycocotools does
    runs = values.copy()
    runs[1::2] = np.cumsum(values[1::2])
    runs[2::2] = np.cumsum(values[2::2])
    return runs


def _cover(runs: np.ndarray, pixels: int) -> bool:
    """Whether the decoded ``runs`` are all non-negative and add up to ``pixels`` (summed in int64
    where that cannot overflow)."""
    if not runs.size:
        return pixels == 0
    if runs.min() < 0 or runs.max() > min(pixels, 2 ** 62):
        return False
    return int(runs.sum(dtype=np.int64 if runs.size * pixels < 2 ** 63 else object)) == pixels


def rle_problem(mask: Any, height: int, width: int) -> Optional[Tuple[str, str]]:
    """(kind, detail) for an RLE ``{'size': [h, w], 'counts': ...}`` that cannot be decoded for an
    image of ``height`` x ``width``, else None; a mask that is not a polygon list nor RLE is bad too."""
    if not isinstance(mask, dict):
        return BAD_RLE, f'a mask that is neither polygons nor RLE: {shown(mask)}'
    size, counts = mask.get('size'), mask.get('counts')
    if not _numbers(size) or list(size) != [height, width]:
        return BAD_RLE, f'an RLE of size {shown(repr(size))} for an image of {height}x{width}'
    if isinstance(counts, str):
        try:
            covered = _cover(_string_counts(counts), height * width)
        except (ValueError, UnicodeEncodeError) as exc:
            return BAD_RLE, f'RLE counts that do not decode: {shown(exc)}'
    else:
        covered = _numbers(counts) and all(r >= 0 for r in counts) and sum(counts) == height * width
    if not covered:
        return BAD_RLE, f'RLE counts that do not cover its {height}x{width} pixels'
    return None
