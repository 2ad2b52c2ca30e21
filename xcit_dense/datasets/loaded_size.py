"""The size of an image as the pipeline's loader reads it, from its header alone, and what is
wrong when its annotation says another size.

``LoadImageFromFile`` decodes with ``color_type``: 'color' and 'grayscale' turn the picture by its
EXIF orientation (OpenCV and PIL alike), the '*_ignore_orientation' kinds and 'unchanged' keep the
stored pixels. A phone's portrait photo is stored landscape with orientation 6; an annotation tool
shows it turned, so its annotations (and the height and width it writes) are for the turned
picture, and a loader that keeps the stored pixels misplaces every box and polygon.
"""
from typing import Optional, Sequence, Tuple

from PIL import Image, UnidentifiedImageError

EXIF_ORIENTATION = 0x0112
QUARTER_TURNS = {5, 6, 7, 8}  # the orientations that swap width and height
ORIENTING = ('color', 'grayscale')  # the color_types whose decoding applies the orientation


def loader_color_type(pipeline: Sequence[dict]) -> str:
    """The ``color_type`` of the pipeline's ``LoadImageFromFile`` (mmcv's default, 'color', if unset)."""
    for step in pipeline or ():
        if isinstance(step, dict) and step.get('type', '').endswith('LoadImageFromFile'):
            return step.get('color_type', 'color')
    return 'color'


def header_size(path: str) -> Optional[Tuple[Tuple[int, int], int]]:
    """((height, width) as stored, EXIF orientation) from the file's header; None where PIL cannot
    read it (the image check names such files)."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            return (height, width), int(image.getexif().get(EXIF_ORIENTATION, 1) or 1)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError):
        return None


def size_problem(path: str, annotated: Tuple[int, int], color_type: str) -> Optional[str]:
    """Why the image at ``path``, loaded with ``color_type``, is not of the ``annotated`` (height,
    width), naming both sizes and the likely cause; None where they agree or the header is unreadable."""
    header = header_size(path)
    if header is None:
        return None
    stored, orientation = header
    turns = orientation in QUARTER_TURNS
    orients = color_type in ORIENTING
    loaded = stored[::-1] if turns and orients else stored
    if tuple(loaded) == tuple(annotated):
        return None
    said = (f'{path}: loaded {loaded[0]}x{loaded[1]} (h x w, color_type={color_type!r}), the annotation '
            f'file says {annotated[0]}x{annotated[1]}')
    if turns and tuple(stored[::-1]) == tuple(annotated):
        return (f'{said}: its EXIF orientation ({orientation}) turns it a quarter, and the annotations are for '
                f'the turned picture while the pipeline reads the stored pixels; load it with '
                f"color_type='color' or store it turned (PIL's ImageOps.exif_transpose)")
    if turns and tuple(stored) == tuple(annotated):
        return (f'{said}: the pipeline turns it by its EXIF orientation ({orientation}), the annotations are '
                f"for the stored pixels; load it with color_type='color_ignore_orientation'")
    return f'{said}: a wrong height/width in the annotation file, or the image resized after annotating'
