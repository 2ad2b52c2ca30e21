"""The files of one sample, checked before anything decodes them: a path that stays inside its
folder, a file that exists, a header whose size is within a pixel limit (a few bytes can declare
40000x40000 pixels, gigabytes once decoded), and on request a full decode.

Paths are judged normalised (``..`` and absolute names), never resolved: a ``data/coco`` that is
a symbolic link to the real data is the usual setup, not an escape.
"""
import contextlib
import os
import warnings
from typing import Iterator, Optional, Tuple

from PIL import Image, UnidentifiedImageError

from .problems import (MISSING_IMAGE, MISSING_LABEL_MAP, PATH_OUTSIDE, TOO_MANY_PIXELS, UNREADABLE_IMAGE,
                       UNREADABLE_LABEL_MAP, BadSample)

# 16384 x 8192: far above any dataset image, far below a decoding bomb; config key max_image_pixels
DEFAULT_MAX_PIXELS = 2 ** 27
MAX_PIXELS_KEY = 'max_image_pixels'

IMAGE, LABEL_MAP = 'image', 'label map'
_KINDS = {IMAGE: (MISSING_IMAGE, UNREADABLE_IMAGE), LABEL_MAP: (MISSING_LABEL_MAP, UNREADABLE_LABEL_MAP)}


def check_inside(path: str, folder: str) -> None:
    """Raise ``BadSample`` when ``path``, normalised, is not inside ``folder`` (the cwd if empty)."""
    folder = os.path.abspath(folder or os.curdir)
    if os.path.commonpath([folder, os.path.abspath(path)]) != folder:
        raise BadSample(PATH_OUTSIDE, path, f'outside {folder}')


@contextlib.contextmanager
def _headers_of_any_size() -> Iterator[None]:
    """PIL refuses to open images over its own limit; the caller applies its own limit instead."""
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def check_image_file(path: str, what: str = IMAGE, max_pixels: int = DEFAULT_MAX_PIXELS,
                     decode: bool = False) -> Optional[Tuple[int, int]]:
    """The (height, width) its header declares, after checking it against ``max_pixels``; with
    ``decode`` the whole file is decoded too. None for a format PIL does not know (its decoder then
    has its own limit). Raises ``BadSample`` (missing, unreadable, over the limit)."""
    missing, unreadable = _KINDS[what]
    if not os.path.isfile(path):
        raise BadSample(missing, path, 'no such file')
    try:
        with _headers_of_any_size(), Image.open(path) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise BadSample(TOO_MANY_PIXELS, path, f'its header declares {width}x{height} pixels, over the '
                                f'limit of {max_pixels} ({MAX_PIXELS_KEY})')
            if decode:
                image.load()
    except UnidentifiedImageError:
        if decode:
            raise BadSample(unreadable, path, f'PIL cannot read it ({what})') from None
        return None
    except BadSample:
        raise
    except Exception as exc:  # PIL's errors for damaged files: OSError, SyntaxError, zlib's, ...
        raise BadSample(unreadable, path, f'{type(exc).__name__}: {exc}') from None
    return height, width
