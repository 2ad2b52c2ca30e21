"""XCiT layers and backbone, registered in MMEngine's model registry."""
from .layers import LPI, XCA, ConvPatchEmbed, FourierPositionalEncoding, XCABlock
from .presets import PRESETS, XCiTPreset
from .xcit import ARCH_SETTINGS, XCiT

__all__ = ['ARCH_SETTINGS', 'LPI', 'PRESETS', 'XCA', 'ConvPatchEmbed', 'FourierPositionalEncoding', 'XCABlock', 'XCiT',
           'XCiTPreset']
