"""The XCiT presets of the paper as named data, read by the backbone, the tools and the tests."""
from dataclasses import dataclass
from typing import Dict, Tuple

PATCH_SIZES = (16, 8)
# depth -> the blocks whose outputs feed the pyramid (the authors' dense-prediction defaults)
DEFAULT_OUT_INDICES: Dict[int, Tuple[int, ...]] = {12: (3, 5, 7, 11), 24: (7, 11, 15, 23)}
WEIGHTS_URL = 'https://dl.fbaipublicfiles.com/xcit/xcit_{arch}_p{patch}_384_dist.pth'


def check_patch_size(patch_size: int) -> None:
    """Refuse a patch size the patch embedding and the pyramid are not built for."""
    if patch_size not in PATCH_SIZES:
        raise ValueError(f'XCiT patch_size must be 8 or 16, got {patch_size!r}')


def default_out_indices(depth: int) -> Tuple[int, ...]:
    """The blocks feeding the four pyramid levels by default, for a model of ``depth`` blocks."""
    if depth not in DEFAULT_OUT_INDICES:
        raise ValueError(f'no default out_indices for depth {depth}: pass out_indices')
    return DEFAULT_OUT_INDICES[depth]


@dataclass(frozen=True)
class XCiTPreset:
    """One model size: width, depth, heads and initial layer scale (eta)."""

    name: str
    embed_dims: int
    depth: int
    num_heads: int
    eta: float

    def weights_url(self, patch_size: int) -> str:
        """The authors' ImageNet-1k (384, distilled) weights that the recipes start from."""
        check_patch_size(patch_size)
        return WEIGHTS_URL.format(arch=self.name, patch=patch_size)


PRESETS: Dict[str, XCiTPreset] = {p.name: p for p in (
    XCiTPreset('nano_12', 128, 12, 4, 1.0),
    XCiTPreset('tiny_12', 192, 12, 4, 1.0),
    XCiTPreset('small_12', 384, 12, 8, 1.0),
    XCiTPreset('tiny_24', 192, 24, 4, 1e-5),
    XCiTPreset('small_24', 384, 24, 8, 1e-5),
    XCiTPreset('medium_24', 512, 24, 8, 1e-5),
    XCiTPreset('large_24', 768, 24, 16, 1e-5),
)}
