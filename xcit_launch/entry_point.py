"""What the toolkit's entry points set for their own process before the stack loads: OpenCV's
decoder limit and the pinned stack's known-warning filters. Importing ``xcit_dense`` sets neither:
the process is the user's where the toolkit is imported into another program.

Called first thing by ``tools/*.py`` (the launch scripts run those); standard library only, so that
it runs before anything imports ``cv2`` or mmengine.
"""
import os
import sys

from .known_warnings import silence_known_warnings

# 16384 x 8192: far above any dataset image, far below a decoding bomb
DEFAULT_MAX_PIXELS = 2 ** 27
# far above any dataset image's file (a 16384 x 8192 PNG of noise is 400 MB; dataset images are a few MB)
DEFAULT_MAX_BYTES = 256 * 2 ** 20
OPENCV_LIMIT_VAR = 'OPENCV_IO_MAX_IMAGE_PIXELS'


def limit_opencv() -> None:
    """Give OpenCV the toolkit's pixel limit unless the user set one. OpenCV reads the variable once,
    when it loads: where ``cv2`` is already imported this changes nothing."""
    if 'cv2' not in sys.modules:
        os.environ.setdefault(OPENCV_LIMIT_VAR, str(DEFAULT_MAX_PIXELS))


def prepare_process() -> None:
    """The OpenCV limit and the known-warning filters, for a process the toolkit started."""
    limit_opencv()
    silence_known_warnings()
