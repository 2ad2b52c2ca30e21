"""The largest image a training pipeline can emit, read from its transforms' configs (auto-fit probes the
model on it: engine/planning/auto_fit.py).

The bound is (long side, short side), not (height, width): a pipeline that resizes to at most 1333 x 800
emits landscape and portrait images, and both fit in it. The transforms understood are mmcv's, mmdet's and
mmseg's ``Resize``, ``RandomResize``, ``RandomChoiceResize``, ``RandomChoice``, ``RandomCrop``, ``Pad`` and
mmdet's ``FixShapeResize``, by the formulas of their code (mmcv 2.1, mmdet 3.3, mmseg 1.2); any other
transform is taken to keep the image's size.
"""
from typing import NamedTuple, Optional, Sequence, Union

Size = Union[int, Sequence[int]]


class Sides(NamedTuple):
    """A bound on an image of either orientation, in pixels."""

    long: int
    short: int


def _sides(size: Size) -> Sides:
    a, b = (size, size) if isinstance(size, int) else size
    return Sides(max(a, b), min(a, b))


def _covering(bound: Optional[Sides], other: Optional[Sides]) -> Optional[Sides]:
    """The bound of an image that is one of the two; an unknown one (None) is left out (configs that
    auto-fit today: a ``RandomChoice`` branch or a ``Pad`` to a size after no resize or crop is taken to
    stay within the others)."""
    if bound is None or other is None:
        return other if bound is None else bound
    return Sides(max(bound.long, other.long), max(bound.short, other.short))


def _within(bound: Optional[Sides], limit: Sides) -> Sides:
    """The bound of an image no larger than ``bound`` cut to at most ``limit`` (a crop)."""
    return limit if bound is None else Sides(min(bound.long, limit.long), min(bound.short, limit.short))


def _scaled(bound: Sides, factor: float) -> Sides:
    """The bound times ``factor``, rounded as mmcv rounds a scaled size (``int(x * factor + 0.5)``)."""
    return Sides(int(bound.long * factor + 0.5), int(bound.short * factor + 0.5))


def _bound_after_resize(transform: dict, bound: Optional[Sides]) -> Optional[Sides]:
    """``Resize`` and ``RandomResize``: the target scale (w, h) bounds the output with or without
    ``keep_ratio``; without a scale, ``scale_factor`` scales the input's bound."""
    scale = transform.get('scale')
    if scale is None:
        factor = transform.get('scale_factor', 1.0)
        factor = max(factor) if isinstance(factor, (list, tuple)) else factor
        return None if bound is None else _scaled(bound, factor)
    if isinstance(scale, (list, tuple)) and scale and isinstance(scale[0], (list, tuple)):
        # RandomResize between two scales draws each edge between the two scales' values of it
        target = _sides((max(s[0] for s in scale), max(s[1] for s in scale)))
    else:
        target = _sides(scale)
    ratio = max(transform.get('ratio_range') or (1.0,))
    return Sides(int(target.long * ratio), int(target.short * ratio))


def _bound_after_random_crop(transform: dict, bound: Optional[Sides]) -> Optional[Sides]:
    """mmdet's ``RandomCrop`` by its ``crop_type`` (mmseg's crops an absolute (h, w)); a crop is never
    larger than its input."""
    crop_type = transform.get('crop_type', 'absolute')
    size = transform['crop_size']
    if crop_type == 'absolute':
        return _within(bound, _sides(size))
    if crop_type == 'absolute_range':  # each side drawn up to the range's top
        return _within(bound, _sides(max(size)))
    if bound is None:
        return None
    return _scaled(bound, max(size)) if crop_type == 'relative' else bound  # relative_range: up to the input


def _bound_after_pad(transform: dict, bound: Optional[Sides]) -> Optional[Sides]:
    """mmcv's (and mmdet's) ``Pad``: to a square of the long side and/or up to a multiple of
    ``size_divisor``, else to a fixed ``size`` (an image already larger is not padded)."""
    divisor = transform.get('size_divisor')
    if transform.get('pad_to_square') or divisor is not None:
        if bound is None:
            return None
        padded = Sides(bound.long, bound.long) if transform.get('pad_to_square') else bound
        return padded if divisor is None else Sides(*(-(-side // divisor) * divisor for side in padded))
    if transform.get('size') is not None:
        fixed = _sides(transform['size'])
        return fixed if bound is None else _covering(bound, fixed)
    return bound


def _bound_after_transform(transform: dict, bound: Optional[Sides]) -> Optional[Sides]:
    """The bound on the image after ``transform`` (a config), given the bound before it."""
    kind = transform.get('type')
    if kind == 'RandomChoice':
        branches = [branch if isinstance(branch, (list, tuple)) else [branch] for branch in transform['transforms']]
        out = None
        for branch in branches:
            out = _covering(out, largest_input(branch, bound))
        return out
    if kind in ('Resize', 'RandomResize'):
        return _bound_after_resize(transform, bound)
    if kind == 'RandomChoiceResize':
        out = None
        for scale in transform['scales']:
            out = _covering(out, _sides(scale))
        return out
    if kind == 'RandomCrop':
        return _bound_after_random_crop(transform, bound)
    if kind == 'FixShapeResize':  # exactly width x height (keep_ratio pads up to it)
        return _sides((transform['width'], transform['height']))
    if kind == 'Pad':
        return _bound_after_pad(transform, bound)
    return bound


def largest_input(pipeline: Sequence[dict], taken: Optional[Sides] = None) -> Optional[Sides]:
    """(long side, short side) of the largest image ``pipeline`` emits, given a bound on the images it
    takes (None: any size, as a dataset's files); None where the pipeline does not bound the size (no
    transform that resizes, crops or pads to a size)."""
    bound = taken
    for transform in pipeline:
        bound = _bound_after_transform(transform, bound)
    return bound
