"""XCiT layers and backbone, registered in MMEngine's model registry."""
from .checkpoint import CheckpointError, load_backbone_weights, read_checkpoint, to_backbone_layout
from .layers import LPI, XCA, ConvPatchEmbed, FourierPositionalEncoding, XCABlock
from .xcit import ARCH_SETTINGS, XCiT

__all__ = ['ARCH_SETTINGS', 'LPI', 'XCA', 'CheckpointError', 'ConvPatchEmbed',
           'FourierPositionalEncoding', 'XCABlock', 'XCiT', 'load_backbone_weights',
           'read_checkpoint', 'to_backbone_layout']
