"""XCiT backbones for dense prediction on the OpenMMLab 2.0 stack (mmdet, mmseg)."""
from .pixel_limit import limit_opencv

limit_opencv()  # before anything imports cv2: OpenCV reads its decoder's pixel limit when it loads

from xcit_launch import known_warnings  # noqa: E402,F401  (xcit_dense.known_warnings, as before)

known_warnings.silence_known_warnings()  # before mmengine is imported: its import emits one of them

from . import datasets  # noqa: E402,F401  (registers SkipBadSamples and, without mmdet, CheckedCocoDataset)
from .models import XCiT  # noqa: E402,F401  (registers the layers and backbone)
from . import engine  # noqa: E402,F401  (registers the hooks and runner the runtime configs name)
from . import evaluation  # noqa: E402,F401  (registers FasterCocoMetric, the COCO configs' evaluator)

__version__ = '0.1.0'
