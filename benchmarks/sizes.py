"""Image sizes of the benchmark: a square side (an int, as before) or a non-square ``WIDTHxHEIGHT``.

A non-square size is written as mmdet writes its scales, width first (``1333x800``, mmdet's
``scale=(1333, 800)``), and held as a ``Size`` (height, width), torch's order. Sizes order by their
pixel count, so a run's sizes sort from smallest to largest and a memory limit hit at one size
skips the larger ones, whichever mix of square and non-square sizes the command line gives.
"""
import math
from typing import NamedTuple, Tuple, Union


class Size(NamedTuple):
    """A non-square image size, (height, width), ordered by pixels; printed as ``WIDTHxHEIGHT``."""

    height: int
    width: int

    def __str__(self) -> str:
        return f'{self.width}x{self.height}'

    def __lt__(self, other) -> bool:
        return _key(self) < _key(other)

    def __le__(self, other) -> bool:
        return _key(self) <= _key(other)

    def __gt__(self, other) -> bool:
        return _key(self) > _key(other)

    def __ge__(self, other) -> bool:
        return _key(self) >= _key(other)


Resolution = Union[int, Size]


def _key(res: Resolution) -> Tuple[int, int, int]:
    """Pixels first, then height and width: the order of sizes."""
    height, width = hw(res)
    return height * width, height, width


def parse_size(text: str) -> Resolution:
    """``'1024'`` -> 1024 (square), ``'1333x800'`` -> Size(height=800, width=1333); a square ``NxN`` is N."""
    parts = text.lower().split('x')
    if len(parts) > 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f'not a size: {text!r} (a side such as 1024, or WIDTHxHEIGHT such as 1333x800)')
    if len(parts) == 1 or parts[0] == parts[1]:
        return int(parts[0])
    return Size(height=int(parts[1]), width=int(parts[0]))


def hw(res: Union[Resolution, list]) -> Tuple[int, int]:
    """(height, width) of a size; also of the [height, width] list a Size becomes in JSON."""
    return (res, res) if isinstance(res, int) else (int(res[0]), int(res[1]))


def pixels(res: Resolution) -> int:
    """Pixels of one image of this size."""
    height, width = hw(res)
    return height * width


def side(res: Resolution) -> float:
    """The side of the square with as many pixels: where a size stands on a resolution axis."""
    return math.sqrt(pixels(res))


def label(res: Resolution) -> str:
    """The size as the tables head it: ``1024^2`` for a square, ``1333x800`` otherwise."""
    return f'{res}^2' if isinstance(res, int) else str(res)
