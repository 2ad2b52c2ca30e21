"""A generated COCO-like instance set for timing the training pipeline: jpegs of COCO's image sizes
with COCO's instance counts (about 7 per image on average, up to tens), polygon masks, 80 classes."""
import json
from pathlib import Path
from typing import Sequence, Tuple

import cv2
import numpy as np

COCO_SIZES = ((640, 480), (640, 427), (480, 640), (640, 426), (500, 375))  # (width, height), common in COCO


def _polygon(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A random star-shaped polygon of 6..24 vertices, 16..300 px across, inside the image."""
    radius = rng.uniform(8, 150)
    centre = rng.uniform([radius, radius], [max(radius + 1, width - radius), max(radius + 1, height - radius)])
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(6, 25))))
    radii = radius * rng.uniform(0.5, 1.0, angles.size)
    points = centre + np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    return np.clip(points, 0, [width - 1, height - 1])


def instance_count(rng: np.random.Generator, mean: float = 7.3, cap: int = 60) -> int:
    """COCO-like: at least 1, geometric with the given mean, at most ``cap``."""
    return int(min(cap, rng.geometric(1.0 / mean)))


def write_coco_like_set(root: str, num_images: int, seed: int = 0,
                        sizes: Sequence[Tuple[int, int]] = COCO_SIZES) -> Path:
    """Write ``root/images/*.jpg`` and ``root/annotations.json``; return the annotation file."""
    from mmdet.datasets import CocoDataset
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / 'images').mkdir(parents=True, exist_ok=True)
    classes = CocoDataset.METAINFO['classes']
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        width, height = sizes[int(rng.integers(len(sizes)))]
        low = cv2.resize(rng.integers(0, 255, (height // 16, width // 16, 3), dtype=np.uint8), (width, height))
        canvas = np.clip(low.astype(np.int16) + rng.integers(-20, 20, (height, width, 3)), 0, 255).astype(np.uint8)
        for _ in range(instance_count(rng)):
            points = _polygon(rng, width, height)
            cv2.fillPoly(canvas, [points.round().astype(np.int32)], rng.integers(0, 255, 3).tolist())
            x0, y0 = points.min(0)
            x1, y1 = points.max(0)
            x, y = points[:, 0], points[:, 1]
            area = 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
            annotations.append(dict(id=len(annotations) + 1, image_id=image_id,
                                    category_id=int(rng.integers(1, len(classes) + 1)),
                                    segmentation=[points.round(1).ravel().tolist()], area=area,
                                    bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)], iscrowd=0))
        name = f'{image_id:012d}.jpg'
        cv2.imwrite(str(root / 'images' / name), canvas, [cv2.IMWRITE_JPEG_QUALITY, 90])
        images.append(dict(id=image_id, file_name=name, width=width, height=height))
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(classes)]
    ann_file = root / 'annotations.json'
    ann_file.write_text(json.dumps(dict(images=images, annotations=annotations, categories=categories)))
    return ann_file
