"""The fast set: XCiT's speed-ups, kept apart from the plain model and installed by one swap.

``install_fast_layers`` turns the plain layers of a built backbone into their fast subclasses in
place (the class of each module is swapped: the same Parameters, buffers, keys and hooks). The
backbone does it when it is built (``XCiT(fast_layers=...)``), before freezing stages and before DDP
wraps the model. The fast layers give the plain layers' outputs and gradients (tested to rounding).
"""
from typing import Dict, List, Type

from torch import nn

from ..layers import LPI, XCA, ConvPatchEmbed, Mlp, XCABlock
from .fast_layers import FastConvPatchEmbed, FastLPI, FastMlp, FastUpConv2x2, FastXCA, FastXCABlock

# plain layer -> its fast replacement (a transposed convolution only where it is the pyramid's 2x2)
FAST_LAYERS: Dict[Type[nn.Module], Type[nn.Module]] = {
    ConvPatchEmbed: FastConvPatchEmbed, XCA: FastXCA, LPI: FastLPI, Mlp: FastMlp, XCABlock: FastXCABlock,
    nn.ConvTranspose2d: FastUpConv2x2,
}


def _is_up_conv_2x2(conv: nn.ConvTranspose2d) -> bool:
    return (conv.kernel_size == conv.stride == (2, 2) and conv.padding == conv.output_padding == (0, 0)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == 'zeros')


def install_fast_layers(model: nn.Module) -> List[str]:
    """Swap every plain layer of ``model`` named in ``FAST_LAYERS`` for its fast class, in place;
    returns the swapped modules' names."""
    swapped = []
    for name, module in model.named_modules():
        fast = FAST_LAYERS.get(type(module))
        if fast is None or (fast is FastUpConv2x2 and not _is_up_conv_2x2(module)):
            continue
        module.__class__ = fast
        swapped.append(name)
    return swapped


__all__ = ['FAST_LAYERS', 'install_fast_layers']
