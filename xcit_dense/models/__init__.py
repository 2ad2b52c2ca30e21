"""XCiT layers and backbone, registered in MMEngine's model registry."""
from .layers import LPI, XCA, ConvPatchEmbed, FourierPositionalEncoding, XCABlock
from .presets import PRESETS, XCiTPreset
from .weights import CheckpointError, load_backbone_weights, read_checkpoint, to_backbone_layout
from .xcit import ARCH_SETTINGS, XCiT

__all__ = ['ARCH_SETTINGS', 'LPI', 'PRESETS', 'XCA', 'CheckpointError', 'ConvPatchEmbed',
           'FourierPositionalEncoding', 'XCABlock', 'XCiT', 'XCiTPreset', 'load_backbone_weights',
           'read_checkpoint', 'to_backbone_layout']
