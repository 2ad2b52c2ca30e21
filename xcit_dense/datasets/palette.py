"""One drawing colour per class, whatever the config inherited.

A config that overrides ``metainfo.classes`` keeps the palette of the config it inherits (MMEngine
merges the two dicts), so 20 classes on a 3-class base leave 3 colours: mmdet's and mmseg's
visualizers then stop drawing ("The length of palette should not be less than 'num_classes'") and
mmseg's datasets refuse the metainfo ("palette does not match classes"). ``complete_palettes``
extends every such palette of a config with distinct colours, saying so once.
"""
import colorsys
import logging
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from mmengine.config import Config
from mmengine.logging import print_log

Colour = Tuple[int, int, int]

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_GOLDEN = 0.618033988749895  # hue step: consecutive colours far apart on the colour wheel


def distinct_colours(count: int, taken: Sequence[Sequence[int]] = ()) -> List[Colour]:
    """``count`` saturated colours, each at least a little away from ``taken`` and from each other
    (the same ones on every call: drawings of two runs match)."""
    chosen: List[Colour] = []
    seen = [tuple(int(v) for v in c) for c in taken]
    hue, step = 0.0, 0
    while len(chosen) < count:
        value, saturation = (0.95, 0.85) if step % 2 == 0 else (0.75, 0.65)
        r, g, b = colorsys.hsv_to_rgb(hue, saturation, value)
        colour = (round(r * 255), round(g * 255), round(b * 255))
        close = step < 16 * (count + len(seen)) and any(
            sum(abs(a - b) for a, b in zip(colour, other)) < 60 for other in seen)
        if not close:
            chosen.append(colour)
            seen.append(colour)
        hue, step = (hue + _GOLDEN) % 1.0, step + 1
    return chosen


def complete_palette(classes: Sequence[str], palette: Optional[Sequence]) -> Optional[list]:
    """``palette`` with distinct colours appended up to one per class, or None where it has enough
    (or none at all: the dataset class then chooses)."""
    if not palette or len(palette) >= len(classes):
        return None
    return [tuple(int(v) for v in c) for c in palette] + distinct_colours(len(classes) - len(palette), palette)


def _datasets(node: Any, where: str) -> Iterator[Tuple[str, dict]]:
    """Each dataset config under a dataloader's ``dataset``, wrappers' inner ones included."""
    if not isinstance(node, dict):
        return
    yield where, node
    yield from _datasets(node.get('dataset'), f'{where}.dataset')
    for i, inner in enumerate(node.get('datasets') or ()):
        yield from _datasets(inner, f'{where}.datasets.{i}')


def complete_palettes(cfg: Config) -> List[str]:
    """Extend, in ``cfg``, each dataset's ``metainfo.palette`` that has fewer colours than its
    ``metainfo.classes``; logs one warning and returns the keys it extended."""
    extended, sizes = [], set()
    for loader in LOADERS:
        for where, dataset in _datasets((cfg.get(loader) or {}).get('dataset'), f'{loader}.dataset'):
            metainfo = dataset.get('metainfo') or {}
            palette = complete_palette(metainfo.get('classes') or (), metainfo.get('palette'))
            if palette is not None:
                sizes.add((len(metainfo['palette']), len(palette)))
                metainfo['palette'] = palette
                extended.append(f'{where}.metainfo.palette')
    if extended:
        counts = ', '.join(f'{old} colours for {new} classes' for old, new in sorted(sizes))
        print_log(f'the palette has fewer colours than the classes ({counts}; inherited with the base '
                  f'config?): extended with distinct colours in {", ".join(extended)}. Set metainfo.palette '
                  f'(one RGB colour per class) to choose them', logger='current', level=logging.WARNING)
    return extended
