"""The kinds of bad data, in the words every entry point uses for them (the dataset's warnings,
training's skip counts, tools/check_dataset.py and the errors of validation and test).

Annotation kinds are dropped when the annotation file is read (``CheckedCocoDataset``); sample
kinds make a whole image unusable and are found when it is loaded (``xcit_dense.datasets.robust``).
"""
from collections import Counter
from typing import Mapping, Optional

# annotations (dropped, the rest of the image is kept)
BOX_NOT_NUMBERS = 'boxes that are not four numbers'
BOX_NOT_FINITE = 'boxes with NaN or infinite values'
BOX_EMPTY = 'boxes of zero or negative size'
BOX_TINY = 'boxes under one pixel wide or high'
BOX_OUTSIDE = 'boxes outside the image'
AREA_EMPTY = 'annotations of zero or negative area'
POLYGON_DEGENERATE = 'polygons with fewer than three points'
POLYGON_NOT_NUMBERS = 'polygons that are not pairs of finite numbers'
POLYGON_OUTSIDE = 'polygons reaching far outside the image'
BAD_RLE = 'bad RLE masks'
NO_ANNOTATIONS = 'images without annotations'

# samples (the image is skipped in training; validation and test stop)
PATH_OUTSIDE = 'paths leaving data_root'
MISSING_IMAGE = 'missing images'
MISSING_LABEL_MAP = 'missing label maps'
UNREADABLE_IMAGE = 'unreadable images'
UNREADABLE_LABEL_MAP = 'unreadable label maps'
TOO_MANY_PIXELS = 'images over the pixel limit'
TOO_MANY_BYTES = 'files over the size limit'
TOO_MUCH_WORK = 'images over the decoding work limits'
LABELS_OUTSIDE = 'label values outside the classes'
LABEL_MAP_SIZE = 'label maps of another size than their image'
PIPELINE_FAILED = 'samples the pipeline failed on'


class BadSample(ValueError):
    """One sample (or annotation) that cannot be used: its kind (above), the file and why."""

    def __init__(self, kind: str, path: str, detail: str) -> None:
        super().__init__(f'{path}: {kind}: {detail}')
        self.kind, self.path, self.detail = kind, path, detail

    def __reduce__(self):  # rebuilt from its parts when it crosses a process boundary
        return type(self), (self.kind, self.path, self.detail)


def summary(counts: Mapping[str, int]) -> str:
    """'2 unreadable images, 1 bad RLE masks': the counts by kind, in a stable order."""
    return ', '.join(f'{n} {kind}' for kind, n in sorted(Counter(counts).items()) if n)


def bad_sample_message(exc: BaseException) -> Optional[str]:
    """The message of a ``BadSample`` raised in this process, or in a DataLoader worker (torch
    re-raises that one as text, its last line naming the exception); None for any other error."""
    if isinstance(exc, BadSample):
        return str(exc)
    marker = f'{BadSample.__module__}.{BadSample.__qualname__}: '
    text = str(exc)
    return text.rsplit(marker, 1)[1].strip() if marker in text else None
