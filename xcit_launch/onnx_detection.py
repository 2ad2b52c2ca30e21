"""Detection with a Mask R-CNN file of ``tools/deployment/export_onnx.py --whole`` outside the toolkit:
onnxruntime, numpy and OpenCV (``tools/deployment/infer_onnx.py``; images read and prepared as
``onnx_segmentation`` does, by the file's metadata).

The graph (``xcit_dense.analysis.onnx_detector.DetectorForward``) takes the resized, normalised image
and gives boxes in its pixels, scores, labels and each box's 28x28 mask probabilities; here the boxes
are scaled to the image's pixels and the masks pasted into them as mmdet pastes them.
"""
import json
from typing import Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

from .onnx_segmentation import OVERLAY_ALPHA, SegmentationModel, cpu_session, encode_mask, file_metadata, network_input

DETECTION_OUTPUTS = ('boxes', 'scores', 'labels', 'masks')


class DetectionModel:
    """An exported Mask R-CNN in an onnxruntime session on the CPU, with its file's metadata."""

    def __init__(self, path: str, session=None) -> None:
        self.session = session or cpu_session(path)
        self.meta = file_metadata(self.session, path, 'detection')
        self.classes: List[str] = list(self.meta['classes'])

    def network_input(self, image: np.ndarray) -> Tuple[np.ndarray, Tuple[float, float]]:
        """The BGR image as the graph takes it and the resize's (width, height) scale factor, by which the
        boxes the graph gives are divided for the image's pixels (mmdet's ``scale_factor``)."""
        prepared = network_input(image, self.meta)
        return prepared, (prepared.shape[3] / image.shape[1], prepared.shape[2] / image.shape[0])

    def run(self, prepared: np.ndarray) -> Dict[str, np.ndarray]:
        """The graph's outputs for a prepared image, by name."""
        return dict(zip(DETECTION_OUTPUTS, self.session.run(list(DETECTION_OUTPUTS), {'image': prepared})))

    def predict(self, image: np.ndarray) -> Dict[str, np.ndarray]:
        """A BGR image's detections as mmdet's ``predict`` gives them: ``boxes`` in the image's pixels,
        ``scores``, ``labels`` and ``masks`` (bool, the image's height and width)."""
        prepared, (x_scale, y_scale) = self.network_input(image)
        out = self.run(prepared)
        out['boxes'] = out['boxes'] / np.float32([x_scale, y_scale, x_scale, y_scale])
        out['masks'] = paste_masks(out['masks'], out['boxes'], *image.shape[:2], self.meta['mask_thr_binary'])
        return out


def instances(detections: Dict[str, np.ndarray], classes: Sequence[str]) -> List[dict]:
    """The detections as tools/infer.py writes them into results.json."""
    def name(label: int) -> str:
        return classes[label] if label < len(classes) else str(label)
    return [dict(label=int(label), **{'class': name(int(label))}, score=round(float(score), 4),
                 bbox=[round(float(v), 2) for v in box], mask=encode_mask(mask))
            for box, score, label, mask in zip(detections['boxes'], detections['scores'], detections['labels'],
                                               detections['masks'])]


def drawn(detections: Dict[str, np.ndarray], score_thr: float, overlap_iou: float) -> np.ndarray:
    """The indices of the detections a picture shows, as tools/infer.py chooses them: scores from
    ``score_thr`` up and, of boxes overlapping at an IoU above ``overlap_iou``, the best scoring."""
    boxes, scores = detections['boxes'], detections['scores']
    kept: List[int] = []
    areas = np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(1)
    for i in np.argsort(-scores, kind='stable'):
        if scores[i] < score_thr:
            break
        low, high = np.maximum(boxes[kept, :2], boxes[i, :2]), np.minimum(boxes[kept, 2:], boxes[i, 2:])
        inter = np.clip(high - low, 0, None).prod(1)
        union = areas[kept] + areas[i] - inter
        if overlap_iou >= 1 or not (inter > overlap_iou * np.maximum(union, 1e-9)).any():
            kept.append(int(i))
    return np.array(kept, np.int64)


def draw_detections(image: np.ndarray, detections: Dict[str, np.ndarray], shown: np.ndarray,
                    palette: Sequence[Sequence[int]], min_size: int, max_size: int) -> np.ndarray:
    """The BGR image with the ``shown`` detections' masks blended and boxes drawn in their class's (RGB)
    palette colour, enlarged as tools/infer.py enlarges pictures (short side to ``min_size``, long side
    at most ``max_size``)."""
    scale = max(min(min_size / min(image.shape[:2]), max_size / max(image.shape[:2])), 1)
    size = (round(image.shape[1] * scale), round(image.shape[0] * scale))
    picture = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR) if scale > 1 else image.copy()
    for i in shown:
        label = int(detections['labels'][i])
        colour = tuple(int(c) for c in (palette[label] if label < len(palette) else (255, 255, 255))[::-1])
        mask = cv2.resize(detections['masks'][i].astype(np.uint8), size, interpolation=cv2.INTER_NEAREST) > 0
        picture[mask] = (picture[mask] * (1 - OVERLAY_ALPHA) + np.float32(colour) * OVERLAY_ALPHA).astype(np.uint8)
        x1, y1, x2, y2 = (int(round(v * scale)) for v in detections['boxes'][i])
        cv2.rectangle(picture, (x1, y1), (x2, y2), colour, 1)
    return picture


def _sampling_weights(start: int, stop: int, low: float, high: float, size: int) -> np.ndarray:
    """The (stop - start, size) bilinear weights by which pixels ``start`` to ``stop`` of an image side
    read a ``size``-long mask side spread over ``low`` to ``high``: ``grid_sample``'s, corners not
    aligned, zeros beyond the mask (mmdet's ``_do_paste_mask``; a box of no width reads the mask's
    middle)."""
    with np.errstate(divide='ignore', invalid='ignore'):
        grid = (np.arange(start, stop, dtype=np.float32) + np.float32(0.5) - np.float32(low)) / \
            (np.float32(high) - np.float32(low)) * 2 - 1
    grid = np.where(np.isfinite(grid), grid, 0).astype(np.float32)
    position = ((grid + 1) * size - 1) / 2
    first = np.floor(position).astype(np.int64)
    weights = np.zeros((len(grid), size + 2), np.float32)  # columns 0 and size + 1: beyond the mask
    rows = np.arange(len(grid))
    for offset, weight in ((0, 1 - (position - first)), (1, position - first)):
        column = np.clip(first + offset + 1, 0, size + 1)
        np.add.at(weights, (rows, column), weight)
    return weights[:, 1:size + 1]


def paste_masks(probabilities: np.ndarray, boxes: np.ndarray, height: int, width: int,
                threshold: float) -> np.ndarray:
    """(N, h, w) mask probabilities pasted into their (N, 4) boxes on a ``height`` x ``width`` image and
    thresholded (``>= threshold``), as mmdet's ``FCNMaskHead`` pastes them on a CPU: each box's region
    one pixel beyond its corners, bilinear, zeros outside the mask."""
    out = np.zeros((len(boxes), height, width), bool)
    for mask, box, pasted in zip(probabilities.astype(np.float32), boxes.astype(np.float32), out):
        x0, y0 = (max(int(np.floor(v)) - 1, 0) for v in box[:2])
        x1, y1 = min(int(np.ceil(box[2])) + 1, width), min(int(np.ceil(box[3])) + 1, height)
        if x1 <= x0 or y1 <= y0:
            continue
        rows = _sampling_weights(y0, y1, box[1], box[3], mask.shape[0])
        columns = _sampling_weights(x0, x1, box[0], box[2], mask.shape[1])
        pasted[y0:y1, x0:x1] = rows @ mask @ columns.T >= threshold
    return out


def open_exported(path: str) -> Union[SegmentationModel, DetectionModel]:
    """The segmentor or Mask R-CNN in the file at ``path``, by its metadata's ``task``; ValueError for
    a file of neither (no metadata of tools/deployment/export_onnx.py --whole)."""
    session = cpu_session(path)
    task = session.get_modelmeta().custom_metadata_map.get('task')
    if task == json.dumps('detection'):
        return DetectionModel(path, session)
    if task == json.dumps('segmentation'):
        return SegmentationModel(path, session)
    raise ValueError(f'{path}: not a segmentation or detection model of tools/deployment/export_onnx.py --whole '
                     '(no metadata naming its task)')
