"""The files of one sample, checked before anything decodes them: a path that stays inside its
folder, a file that exists and whose size on disk is within a limit (a sparse file of a gigabyte can
carry a small image's header), a header whose size is within a pixel limit (a few bytes can declare
40000x40000 pixels, gigabytes once decoded), a JPEG's scans and markers and a PNG's chunks
within the bounds of ``xcit_launch.decode_work`` (a decoder's time grows with them), and on request
a full decode by the decoder the pipelines use (OpenCV for images, PIL for label maps), so that a
check and training agree on what is readable.

Headers are read by PIL. An image in a format PIL does not read (Radiance HDR, OpenEXR, ...) is
decoded by OpenCV, whose own pixel limit applies (``xcit_dense/pixel_limit.py``). EXIF orientation
is ignored: images are decoded as stored, as their annotations are drawn (the configs load images
with ``color_type='color_ignore_orientation'``).

Paths are judged normalised (``..`` and absolute names), never resolved: a ``data/coco`` that is
a symbolic link to the real data is the usual setup, not an escape. So a link inside the data
folder to a file elsewhere is read like any other file there (docs/security.md).
"""
import contextlib
import os
import warnings
from typing import Iterator, Optional, Tuple

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from xcit_launch.decode_work import decode_work_problem

from ..pixel_limit import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_PIXELS,
    MAX_BYTES_KEY,
    MAX_PIXELS_KEY,
    OPENCV_LIMIT_VAR,
    opencv_limit,
)
from .problems import (
    LABELS_OUTSIDE,
    MISSING_IMAGE,
    MISSING_LABEL_MAP,
    PATH_OUTSIDE,
    TOO_MANY_BYTES,
    TOO_MANY_PIXELS,
    TOO_MUCH_WORK,
    UNREADABLE_IMAGE,
    UNREADABLE_LABEL_MAP,
    BadSample,
)

__all__ = ['IMAGE', 'LABEL_MAP', 'check_inside', 'check_image_file',
           'decode_image']

# how OpenCV decodes the pipelines' images: colour, EXIF orientation ignored
OPENCV_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION

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


def decode_image(path: str) -> np.ndarray:
    """The image as the pipelines decode it (OpenCV, BGR, EXIF orientation ignored); raises
    ``BadSample`` when OpenCV cannot read it or it is over OpenCV's pixel limit. Read from the file
    (the pipelines decode the same bytes from memory: the same decoders and limits), so that no
    temporary copy is left behind (see ``check_image_file``)."""
    try:
        image = cv2.imread(path, OPENCV_FLAGS)
    except cv2.error as exc:
        if 'validateInputImageSize' in str(exc):
            raise BadSample(TOO_MANY_PIXELS, path, f'over the limit of OpenCV, which decodes it: '
                            f'{opencv_limit()} pixels ({OPENCV_LIMIT_VAR})') from None
        raise BadSample(UNREADABLE_IMAGE, path, f'OpenCV cannot decode it: {str(exc).strip()[:200]}') from None
    if image is None:
        raise BadSample(UNREADABLE_IMAGE, path, 'OpenCV cannot decode it (image)')
    return image


# PIL's modes of at most 8 bits per value: what mmseg's 8-bit cast keeps as it is
_EIGHT_BIT_MODES = ('1', 'L', 'P', 'LA', 'PA', 'RGB', 'RGBA', 'CMYK', 'YCbCr', 'LAB', 'HSV')


def _check_wide_labels(path: str, image: Image.Image) -> None:
    """A label map of more than 8 bits per value (a 16-bit PNG, ...): mmseg's loader casts its values to
    8 bits without a word (300 becomes 44, another class), so one of 256 or more is refused, naming the
    largest; one whose values all fit reads as it would from an 8-bit file."""
    values = np.asarray(image)
    largest, smallest = (int(values.max()), int(values.min())) if values.size else (0, 0)
    if largest >= 256 or smallest < 0:
        raise BadSample(LABELS_OUTSIDE, path, f'a {image.mode} label map whose values reach {largest} '
                        f'(smallest {smallest}): label maps are read as 8 bits (values 0..255)')


def check_image_file(path: str, what: str = IMAGE, max_pixels: int = DEFAULT_MAX_PIXELS,
                     decode: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> Optional[Tuple[int, int]]:
    """The (height, width) its header declares, after checking the file's size on disk against
    ``max_bytes`` (before it is opened), a JPEG's scans and markers and a PNG's chunks
    (``decode_work``, before a decoder opens it) and the header against ``max_pixels``; with
    ``decode`` the whole file is decoded too, by the pipelines' decoder (OpenCV for an image, PIL
    for a label map). An image in a format PIL does not read is always decoded by OpenCV, from its
    file, under OpenCV's own limit: the pipeline decodes a copy in memory, which for these formats
    (Radiance HDR, ...) OpenCV writes to a temporary file that it leaves behind when it refuses the
    image. A label map of more than 8 bits per pixel is decoded at once: mmseg's loader casts it to
    8 bits, so a value of 256 or more is refused (``_check_wide_labels``). Raises ``BadSample``
    (missing, unreadable, over a limit)."""
    missing, unreadable = _KINDS[what]
    if not os.path.isfile(path):
        raise BadSample(missing, path, 'no such file')
    on_disk = os.stat(path).st_size
    if on_disk > max_bytes:
        raise BadSample(TOO_MANY_BYTES, path, f'{on_disk} bytes on disk, over the limit of {max_bytes} '
                        f'({MAX_BYTES_KEY})')
    size = None
    try:
        work = decode_work_problem(path)
        if work:
            raise BadSample(TOO_MUCH_WORK, path, work)
        with _headers_of_any_size(), Image.open(path) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise BadSample(TOO_MANY_PIXELS, path, f'its header declares {width}x{height} pixels, over the '
                                f'limit of {max_pixels} ({MAX_PIXELS_KEY})')
            size = height, width
            if what == LABEL_MAP and image.mode not in _EIGHT_BIT_MODES:
                _check_wide_labels(path, image)
            elif decode and what == LABEL_MAP:
                image.load()
    except UnidentifiedImageError:
        if what == LABEL_MAP:
            if decode:
                raise BadSample(unreadable, path, f'PIL cannot read it ({what})') from None
        else:  # OpenCV alone knows its size; refused here, before the pipeline meets it
            decode = True
    except BadSample:
        raise
    except Exception as exc:  # PIL's errors for damaged files: OSError, SyntaxError, zlib's, ...
        raise BadSample(unreadable, path, f'{type(exc).__name__}: {exc}') from None
    if decode and what == IMAGE:
        size = decode_image(path).shape[:2]
    return size
