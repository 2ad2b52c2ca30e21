"""The largest image, in pixels and in bytes on disk, that the toolkit decodes, and OpenCV's own decoder limit.

A few bytes of header can declare 40000x40000 pixels, gigabytes once decoded. Headers that PIL reads
are checked against ``max_image_pixels`` (a config key) before anything decodes them
(``datasets/files.py``). Every other format reaches OpenCV, the pipelines' decoder, whose own limit
is the environment variable ``OPENCV_IO_MAX_IMAGE_PIXELS``, read once when OpenCV loads: the
toolkit's entry points set it before that (``xcit_launch/entry_point.py``); importing ``xcit_dense``
does not.
Files larger than ``max_image_bytes`` on disk are refused before they are opened: a sparse file of a
gigabyte can carry a small image's header, and decoders read the whole file.
"""
import os

from xcit_launch.entry_point import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, OPENCV_LIMIT_VAR

MAX_PIXELS_KEY = 'max_image_pixels'
MAX_BYTES_KEY = 'max_image_bytes'
OPENCV_OWN_DEFAULT = 2 ** 30  # OpenCV's limit where the variable is unset when it loads

__all__ = ['DEFAULT_MAX_BYTES', 'DEFAULT_MAX_PIXELS', 'MAX_BYTES_KEY', 'MAX_PIXELS_KEY', 'OPENCV_LIMIT_VAR',
           'OPENCV_OWN_DEFAULT', 'opencv_limit']


def opencv_limit() -> int:
    """The pixel limit of OpenCV's decoder in this process: the variable's value (its own default
    where unset or not a number)."""
    try:
        return int(os.environ.get(OPENCV_LIMIT_VAR))
    except (TypeError, ValueError):
        return OPENCV_OWN_DEFAULT
