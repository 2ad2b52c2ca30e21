"""Small synthetic datasets in the real on-disk formats, generated deterministically from a seed.

Segmentation sets follow the ADE20K layout (``images/<split>/*.jpg`` and
``annotations/<split>/*.png``); labels are 0 for the background and 1..K for the shapes.
"""
from pathlib import Path
from typing import Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ('rectangle', 'ellipse', 'triangle')


def _textured_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    base = rng.integers(40, 200, size=3)
    noise = rng.normal(0, 18, size=(height, width, 3))
    yy, xx = np.mgrid[0:height, 0:width]
    stripes = 20 * np.sin(xx / rng.uniform(3, 12) + yy / rng.uniform(3, 12))[..., None]
    return np.clip(base + noise + stripes, 0, 255).astype(np.uint8)


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: Tuple[int, int, int, int], fill) -> None:
    x0, y0, x1, y1 = box
    if kind == 'rectangle':
        draw.rectangle(box, fill=fill)
    elif kind == 'ellipse':
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


def make_segmentation_image(rng: np.random.Generator, size: Tuple[int, int],
                            classes: Sequence[str] = SHAPES, max_objects: int = 4):
    """One image and its label map: shapes of random class, colour, size and position."""
    height, width = size
    image = Image.fromarray(_textured_background(rng, height, width))
    label = Image.new('L', (width, height), 0)
    paint, mark = ImageDraw.Draw(image), ImageDraw.Draw(label)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(len(classes)))
        w = int(rng.integers(width // 6, width // 2))
        h = int(rng.integers(height // 6, height // 2))
        x0, y0 = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        _draw_shape(paint, classes[cls], (x0, y0, x0 + w, y0 + h), colour)
        _draw_shape(mark, classes[cls], (x0, y0, x0 + w, y0 + h), cls + 1)
    return image, label


def write_segmentation_set(root: str, split: str, num_images: int, size: Tuple[int, int] = (64, 64),
                           seed: int = 0, classes: Sequence[str] = SHAPES) -> Path:
    """Write ``num_images`` image/label pairs under ``root`` in the ADE20K layout."""
    root = Path(root)
    (root / 'images' / split).mkdir(parents=True, exist_ok=True)
    (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(num_images):
        image, label = make_segmentation_image(rng, size, classes)
        image.save(root / 'images' / split / f'{split}_{i:05d}.jpg', quality=95)
        label.save(root / 'annotations' / split / f'{split}_{i:05d}.png')
    return root
