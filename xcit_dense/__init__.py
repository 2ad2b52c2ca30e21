"""XCiT backbones for dense prediction on the OpenMMLab 2.0 stack (mmdet, mmseg)."""
from . import datasets  # noqa: F401  (registers SkipBadSamples and, without mmdet, CheckedCocoDataset)
from .models import XCiT  # noqa: F401  (registers the layers and backbone)
from . import engine  # noqa: F401  (registers the hooks the runtime configs name)

__version__ = '0.1.0'
