"""The largest image, in pixels and in bytes on disk, that the toolkit decodes, and OpenCV's own decoder limit.

A few bytes of header can declare 40000x40000 pixels, gigabytes once decoded. Headers that PIL reads
are checked against ``max_image_pixels`` (a config key) before anything decodes them
(``datasets/files.py``). Every other format reaches OpenCV, the pipelines' decoder, whose own limit
is the environment variable ``OPENCV_IO_MAX_IMAGE_PIXELS``: OpenCV reads it once, when it loads, so
:func:`limit_opencv` sets it before anything imports ``cv2`` (``xcit_dense`` calls it first thing).
Files larger than ``max_image_bytes`` on disk are refused before they are opened: a sparse file of a
gigabyte can carry a small image's header, and decoders read the whole file.
This module imports nothing but the standard library, so that it can run that early.
"""
import os
import sys

# 16384 x 8192: far above any dataset image, far below a decoding bomb
DEFAULT_MAX_PIXELS = 2 ** 27
MAX_PIXELS_KEY = 'max_image_pixels'
# far above any dataset image's file (a 16384 x 8192 PNG of noise is 400 MB; dataset images are a few MB)
DEFAULT_MAX_BYTES = 256 * 2 ** 20
MAX_BYTES_KEY = 'max_image_bytes'
OPENCV_LIMIT_VAR = 'OPENCV_IO_MAX_IMAGE_PIXELS'
OPENCV_OWN_DEFAULT = 2 ** 30  # OpenCV's limit where the variable is unset when it loads

_opencv_limit = None  # the limit OpenCV loaded with, once known


def limit_opencv() -> None:
    """Give OpenCV the toolkit's limit unless the user set one; note the limit OpenCV has.

    Where ``cv2`` was imported before this call, OpenCV keeps the limit it loaded with (the
    variable's value then, else its own default): :func:`opencv_limit` reports that one."""
    global _opencv_limit
    if 'cv2' in sys.modules:
        _opencv_limit = _parse(os.environ.get(OPENCV_LIMIT_VAR))
        return
    os.environ.setdefault(OPENCV_LIMIT_VAR, str(DEFAULT_MAX_PIXELS))
    _opencv_limit = _parse(os.environ[OPENCV_LIMIT_VAR])


def opencv_limit() -> int:
    """The pixel limit of OpenCV's decoder in this process (and in the data workers it forks)."""
    return _opencv_limit if _opencv_limit is not None else _parse(os.environ.get(OPENCV_LIMIT_VAR))


def _parse(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return OPENCV_OWN_DEFAULT
