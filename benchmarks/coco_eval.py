"""Generated COCO evaluation work: ground truth of COCO val2017's size and detections in the form
mmdet's ``CocoMetric.process`` stores them (boxes, scores, labels, RLE masks), to compare metrics.

Ground-truth objects are random polygons whose areas follow COCO's mix of small, medium and large
objects; each detection is a jittered copy of a ground-truth object (its box and polygon moved and
scaled, sometimes mislabelled) or a random false positive, with a random score.
"""
from typing import Dict, List, Tuple

import numpy as np
from pycocotools import mask as mask_utils

# COCO val2017: 5000 images, 36781 instances, 80 categories; 41% small, 34% medium, 24% large
VAL2017_IMAGES, VAL2017_INSTANCES_PER_IMAGE = 5000, 7.36
AREA_SHARES = ((0.41, 8 ** 2, 32 ** 2), (0.34, 32 ** 2, 96 ** 2), (0.25, 96 ** 2, 400 ** 2))


def _polygon(rng: np.random.Generator, centre: np.ndarray, area: float, vertices: int) -> np.ndarray:
    """A star-shaped polygon of roughly ``area`` pixels around ``centre``, as (vertices, 2)."""
    angles = np.sort(rng.uniform(0, 2 * np.pi, vertices))
    radii = rng.uniform(0.6, 1.0, vertices) * np.sqrt(area / np.pi) * 1.2
    return centre + np.stack([np.cos(angles), np.sin(angles)], axis=1) * radii[:, None]


def _clip(points: np.ndarray, height: int, width: int) -> np.ndarray:
    """The points moved inside the image."""
    return np.clip(points, 0, [width - 1, height - 1])


def synthetic_ground_truth(num_images: int = VAL2017_IMAGES, num_classes: int = 80,
                           instances_per_image: float = VAL2017_INSTANCES_PER_IMAGE,
                           size: Tuple[int, int] = (480, 640), seed: int = 0) -> dict:
    """A COCO instances dict of ``num_images`` images of ``size`` (H, W) with polygon instances."""
    rng = np.random.default_rng(seed)
    height, width = size
    shares = np.array([s for s, _, _ in AREA_SHARES])
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        images.append(dict(id=image_id, file_name=f'{image_id:012d}.jpg', height=height, width=width))
        for _ in range(rng.poisson(instances_per_image)):
            _, low, high = AREA_SHARES[rng.choice(len(shares), p=shares)]
            area = np.exp(rng.uniform(np.log(low), np.log(high)))
            centre = rng.uniform([0, 0], [width, height])
            points = _clip(_polygon(rng, centre, area, int(rng.integers(6, 24))), height, width)
            rle = mask_utils.frPyObjects([points.ravel().tolist()], height, width)[0]
            if mask_utils.area(rle) == 0:
                continue
            x, y, w, h = mask_utils.toBbox(rle).tolist()
            annotations.append(dict(id=len(annotations) + 1, image_id=image_id,
                                    category_id=int(rng.integers(1, num_classes + 1)),
                                    segmentation=[points.ravel().tolist()], area=float(mask_utils.area(rle)),
                                    bbox=[x, y, w, h], iscrowd=0))
    categories = [dict(id=k, name=f'class_{k}') for k in range(1, num_classes + 1)]
    return dict(images=images, annotations=annotations, categories=categories)


def synthetic_detections(ground_truth: dict, per_image: int = 100, seed: int = 1) -> List[Tuple[dict, dict]]:
    """``per_image`` detections per image as ``CocoMetric.process`` stores them: (gt, pred) pairs,
    pred with float32 ``bboxes`` (x1y1x2y2), ``scores``, int64 ``labels`` (indices into the
    categories, in id order) and RLE ``masks`` with byte counts."""
    rng = np.random.default_rng(seed)
    cat_ids = sorted(c['id'] for c in ground_truth['categories'])
    label_of = {cat_id: k for k, cat_id in enumerate(cat_ids)}
    by_image: Dict[int, List[dict]] = {im['id']: [] for im in ground_truth['images']}
    for ann in ground_truth['annotations']:
        by_image[ann['image_id']].append(ann)
    results = []
    for image in ground_truth['images']:
        height, width = image['height'], image['width']
        boxes, labels, polygons = [], [], []
        anns = by_image[image['id']]
        for k in range(per_image):
            if anns and k < 3 * len(anns):  # up to three jittered copies of each object
                ann = anns[k % len(anns)]
                points = np.asarray(ann['segmentation'][0]).reshape(-1, 2)
                x, y, w, h = ann['bbox']
                scale = rng.uniform(0.8, 1.2)
                shift = rng.normal(0, 0.1, 2) * [w, h]
                centre = points.mean(axis=0)
                points = (points - centre) * scale + centre + shift
                label = label_of[ann['category_id']] if rng.random() > 0.1 else int(rng.integers(len(cat_ids)))
            else:
                _, low, high = AREA_SHARES[int(rng.integers(len(AREA_SHARES)))]
                area = np.exp(rng.uniform(np.log(low), np.log(high)))
                points = _polygon(rng, rng.uniform([0, 0], [width, height]), area, int(rng.integers(6, 16)))
                label = int(rng.integers(len(cat_ids)))
            points = _clip(points, height, width)
            (x1, y1), (x2, y2) = points.min(axis=0), points.max(axis=0)
            box = np.array([x1, y1, x2, y2]) + rng.normal(0, 1.0, 4)
            boxes.append(np.clip(box, 0, [width, height, width, height]))
            labels.append(label)
            polygons.append(points.ravel().tolist())
        masks = [mask_utils.frPyObjects([p], height, width)[0] for p in polygons]
        pred = dict(img_id=image['id'], bboxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
                    scores=rng.uniform(0.05, 1.0, len(boxes)).astype(np.float32),
                    labels=np.asarray(labels, dtype=np.int64), masks=masks)
        results.append((dict(width=width, height=height, img_id=image['id']), pred))
    return results
