"""XCiT backbones for dense prediction on the OpenMMLab 2.0 stack (mmdet, mmseg)."""
# Importing the package registers its modules and changes nothing else in the process: OpenCV's pixel
# limit and the known-warning filters are set by the toolkit's entry points (xcit_launch/entry_point.py),
# MMEngine's checkpoint schemes by them and by the opt-in module xcit_dense.checked_loading.
from . import (
    datasets,  # noqa: F401  (registers SkipBadSamples and, without mmdet, CheckedCocoDataset)
    engine,  # noqa: F401  (registers the hooks and runner the runtime configs name)
    evaluation,  # noqa: F401  (registers FasterCocoMetric, the COCO configs' evaluator)
)
from .models import XCiT  # noqa: F401  (registers the layers and backbone)

__version__ = '0.1.0'
