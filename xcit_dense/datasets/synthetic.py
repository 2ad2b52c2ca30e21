"""Small synthetic datasets in the real on-disk formats, generated deterministically from a seed.

Every image is a scene of rotated shapes (one class per shape kind) of random size, colour,
shading and position on a textured background with distractor strokes; shapes may overlap,
later ones hiding part of earlier ones. Two layouts are written:

- instance segmentation in the COCO format (``<split>/*.jpg`` and
  ``annotations/instances_<split>.json`` with boxes, polygons of the visible part, mask areas
  and categories), read by mmdet's ``CocoDataset``;
- semantic segmentation in the ADE20K layout (``images/<split>/*.jpg`` and
  ``annotations/<split>/*.png``), labels 0 for the background and 1..K for the shapes.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils
from shapely.geometry import Polygon, box as shapely_box
from tqdm import tqdm

SHAPES = ('rectangle', 'ellipse', 'triangle')
MIN_VISIBLE = 0.75  # a shape is not placed where it would hide over 25% of an earlier one


@dataclass
class SceneObject:
    """One shape of a scene: its class index, the polygon of its visible part, its full area."""
    label: int
    visible: Polygon
    area: float


def _textured_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A base colour with a gradient, oriented stripes and pixel noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    base = rng.integers(40, 216, size=3).astype(np.float64)
    gradient = rng.uniform(-30, 30, size=3) * (xx / width - 0.5)[..., None]
    angle = rng.uniform(0, math.pi)
    period = rng.uniform(4, 14)
    stripes = rng.uniform(8, 24) * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) / period)
    return base + gradient + stripes[..., None]


def _outline(kind: str, centre: Tuple[float, float], radius: Tuple[float, float],
             angle: float) -> Polygon:
    """The polygon of a shape of half-sizes ``radius`` rotated by ``angle`` about ``centre``."""
    if kind == 'rectangle':
        unit = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    elif kind == 'ellipse':
        unit = [(math.cos(t), math.sin(t)) for t in np.linspace(0, 2 * math.pi, 40, endpoint=False)]
    elif kind == 'triangle':
        unit = [(0, -1), (1, 1), (-1, 1)]
    else:
        raise ValueError(f'unknown shape {kind!r}: expected one of {SHAPES}')
    cos, sin = math.cos(angle), math.sin(angle)
    (cx, cy), (rx, ry) = centre, radius
    return Polygon([(cx + rx * u * cos - ry * v * sin, cy + rx * u * sin + ry * v * cos)
                    for u, v in unit])


def _is_simple_region(geometry) -> bool:
    """One piece without holes: what a single COCO polygon can describe exactly."""
    return isinstance(geometry, Polygon) and not geometry.is_empty and not geometry.interiors


def _place(rng: np.random.Generator, kind: str, height: int, width: int,
           placed: List[SceneObject], min_side: int) -> Optional[Polygon]:
    """A random outline inside the image that leaves every earlier object mostly visible."""
    frame = shapely_box(0, 0, width, height)
    for _ in range(20):
        size = rng.uniform(0.12, 0.28) * min(height, width)
        aspect = rng.uniform(0.7, 1.4)
        radius = (size * math.sqrt(aspect), size / math.sqrt(aspect))
        centre = (rng.uniform(0, width), rng.uniform(0, height))
        outline = _outline(kind, centre, radius, rng.uniform(0, math.pi))
        if not frame.contains(outline):
            continue
        rest = [obj.visible.difference(outline) for obj in placed]
        if all(_is_simple_region(r) and r.area >= MIN_VISIBLE * obj.area
               and min(np.ptp(np.asarray(r.exterior.coords), axis=0)) >= min_side
               for r, obj in zip(rest, placed)):
            for obj, r in zip(placed, rest):
                obj.visible = r
            return outline
    return None


def _object_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A colour that stands out from the mean background colour (at least 100 apart)."""
    mean = background.reshape(-1, 3).mean(0)
    while True:
        colour = rng.integers(0, 256, size=3).astype(np.float64)
        if np.linalg.norm(colour - mean) >= 100:
            return colour


def rasterize(polygon: Polygon, height: int, width: int) -> np.ndarray:
    """The pixels of ``polygon`` as pycocotools (and so mmdet and the COCO metric) draw them."""
    coords = [float(v) for point in list(polygon.exterior.coords)[:-1] for v in point]
    return mask_utils.decode(mask_utils.frPyObjects([coords], height, width))[..., 0].astype(bool)


def make_scene(rng: np.random.Generator, size: Tuple[int, int], classes: Sequence[str] = SHAPES,
               max_objects: int = 4) -> Tuple[Image.Image, List[SceneObject], np.ndarray]:
    """One image, its objects (visible polygons, back to front) and its label map (0 = none)."""
    height, width = size
    canvas = _textured_background(rng, height, width)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    objects: List[SceneObject] = []
    outlines = []
    while not objects:  # drawn again if no object found a place: an empty scene teaches a detector nothing
        for _ in range(int(rng.integers(1, max_objects + 1))):
            label = int(rng.integers(len(classes)))
            outline = _place(rng, classes[label], height, width, objects, min_side=max(2, min(size) // 32))
            if outline is None:
                continue
            objects.append(SceneObject(label, outline, outline.area))
            outlines.append((label, outline, _object_colour(rng, canvas),
                             rng.uniform(-25, 25, size=2)))
    labels = np.zeros((height, width), np.uint8)
    for label, outline, colour, shading in outlines:
        inside = rasterize(outline, height, width)
        shade = shading[0] * (xx / width - 0.5) + shading[1] * (yy / height - 0.5)
        canvas[inside] = colour + shade[inside, None]
        labels[inside] = label + 1
    _draw_distractors(rng, canvas)
    canvas += rng.normal(0, 10, size=canvas.shape)
    image = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8))
    return image, objects, labels


def _draw_distractors(rng: np.random.Generator, canvas: np.ndarray) -> None:
    """A few thin strokes across the image: edges that belong to no object."""
    height, width = canvas.shape[:2]
    layer = Image.new('L', (width, height), 0)
    draw = ImageDraw.Draw(layer)
    for _ in range(int(rng.integers(0, 4))):
        points = [tuple(rng.uniform(0, [width, height])) for _ in range(3)]
        draw.line(points, fill=255, width=1)
    strokes = np.asarray(layer) > 0
    canvas[strokes] = rng.integers(0, 256, size=3)


def make_segmentation_image(rng: np.random.Generator, size: Tuple[int, int],
                            classes: Sequence[str] = SHAPES, max_objects: int = 4):
    """One image and its label map (``L`` mode: 0 for the background, 1..K for the shapes)."""
    image, _, labels = make_scene(rng, size, classes, max_objects)
    return image, Image.fromarray(labels)


def write_segmentation_set(root: str, split: str, num_images: int, size: Tuple[int, int] = (64, 64),
                           seed: int = 0, classes: Sequence[str] = SHAPES, max_objects: int = 4,
                           progress: bool = False) -> Path:
    """Write ``num_images`` image/label pairs under ``root`` in the ADE20K layout."""
    root = Path(root)
    (root / 'images' / split).mkdir(parents=True, exist_ok=True)
    (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in tqdm(range(num_images), desc=f'{root.name}/{split}', disable=not progress):
        image, label = make_segmentation_image(rng, size, classes, max_objects)
        image.save(root / 'images' / split / f'{split}_{i:05d}.jpg', quality=95)
        label.save(root / 'annotations' / split / f'{split}_{i:05d}.png')
    return root


def _coco_annotation(obj: SceneObject, ann_id: int, image_id: int, height: int, width: int) -> dict:
    polygon = [round(float(v), 2) for point in list(obj.visible.exterior.coords)[:-1] for v in point]
    rle = mask_utils.frPyObjects([polygon], height, width)
    x0, y0, x1, y1 = obj.visible.bounds
    return dict(id=ann_id, image_id=image_id, category_id=obj.label + 1, iscrowd=0,
                segmentation=[polygon], area=float(mask_utils.area(rle).sum()),
                bbox=[round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)])


def write_coco_set(root: str, split: str, num_images: int, size: Tuple[int, int] = (128, 128),
                   seed: int = 0, classes: Sequence[str] = SHAPES, max_objects: int = 5,
                   progress: bool = False) -> Path:
    """Write ``num_images`` images to ``root/<split>/`` and their instances to
    ``root/annotations/instances_<split>.json``; returns the annotation file.

    Polygons describe the visible part of each object; ``area`` is the pixel count of that
    polygon's mask as pycocotools rasterises it (what the COCO metric sorts by).
    """
    root = Path(root)
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    height, width = size
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for i in tqdm(range(num_images), desc=f'{root.name}/{split}', disable=not progress):
        image, objects, _ = make_scene(rng, size, classes, max_objects)
        name = f'{split}_{i:05d}.jpg'
        image.save(root / split / name, quality=95)
        images.append(dict(id=i + 1, file_name=name, height=height, width=width))
        for obj in objects:
            annotations.append(_coco_annotation(obj, len(annotations) + 1, i + 1, height, width))
    categories = [dict(id=k + 1, name=name, supercategory='shape') for k, name in enumerate(classes)]
    ann_file = root / 'annotations' / f'instances_{split}.json'
    ann_file.write_text(json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return ann_file
