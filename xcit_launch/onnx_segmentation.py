"""Segmentation with a file of ``tools/deployment/export_onnx.py --whole`` outside the toolkit: onnxruntime, numpy and
OpenCV only (``tools/deployment/infer_onnx.py``), so that a server needs neither torch nor OpenMMLab.

The file carries what the caller does around it in its ``metadata_props`` (JSON values, written by
``xcit_dense.analysis.onnx_export.prediction_metadata``): the test pipeline's ``Resize`` (``scale``,
``keep_ratio``; mmcv's rule, done here with OpenCV as mmcv does), the normalisation (``mean``, ``std``,
``bgr_to_rgb``), the ``classes`` and their ``palette``. The graph gives logits at its input's size; they
are resized to the image's size (bilinear) before their argmax, as mmseg's ``predict`` does.

Images are decoded as the toolkit decodes them (OpenCV, EXIF orientation ignored), files over a byte
limit or beyond the bounds of ``decode_work`` refused before a decoder opens them, and images over a
pixel limit refused by OpenCV from their header (its variable ``OPENCV_IO_MAX_IMAGE_PIXELS``, read
once when OpenCV loads: the tool sets it first).
"""
import json
import os
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

from .decode_work import decode_work_problem
from .entry_point import OPENCV_LIMIT_VAR

# how the toolkit's pipelines decode images: colour, EXIF orientation ignored
OPENCV_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
# OpenCV's resize takes at most this many channels at once (ADE20K has 150 classes)
OPENCV_MAX_CHANNELS = 128
OVERLAY_ALPHA = 0.5  # the label map's weight in a picture, as tools/infer.py draws it


def read_image(path: str, max_bytes: int) -> np.ndarray:
    """The BGR image at ``path``; FileNotFoundError, or ValueError with the reason (over ``max_bytes`` on
    disk, checked before it is opened; too much work for a decoder, ``decode_work``; over OpenCV's pixel
    limit; not an image)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path}: no such file')
    on_disk = os.stat(path).st_size
    if on_disk > max_bytes:
        raise ValueError(f'{path}: too many bytes: {on_disk} bytes on disk, over the limit of {max_bytes}')
    work = decode_work_problem(path)
    if work:
        raise ValueError(f'{path}: too much work to decode: {work}')
    try:
        image = cv2.imread(path, OPENCV_FLAGS)
    except cv2.error as exc:
        if 'validateInputImageSize' in str(exc):
            raise ValueError(f'{path}: too many pixels: over the limit of OpenCV, which decodes it: '
                             f'{os.environ.get(OPENCV_LIMIT_VAR)} pixels ({OPENCV_LIMIT_VAR})') from None
        raise ValueError(f'{path}: not an image (cannot be decoded): {str(exc).strip()[:200]}') from None
    if image is None:
        raise ValueError(f'{path}: not an image (cannot be decoded)')
    return image


def rescaled_size(height: int, width: int, scale: Sequence[int], keep_ratio: bool) -> Tuple[int, int]:
    """The (height, width) mmcv's ``Resize`` gives an image: ``scale`` as (width, height), or with
    ``keep_ratio`` the largest size within its long and short sides."""
    if not keep_ratio:
        return int(scale[1]), int(scale[0])
    factor = min(max(scale) / max(height, width), min(scale) / min(height, width))
    return int(height * factor + 0.5), int(width * factor + 0.5)


def network_input(image: np.ndarray, meta: dict) -> np.ndarray:
    """A BGR image as an exported file takes it, by its metadata ``meta`` (a segmentor's or a detector's):
    resized by the test pipeline's rule, normalised, (1, 3, H, W)."""
    if meta['scale']:
        height, width = rescaled_size(*image.shape[:2], meta['scale'], meta['keep_ratio'])
        if (height, width) != image.shape[:2]:
            image = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    if meta['bgr_to_rgb']:
        image = image[..., ::-1]
    normalised = (image.astype(np.float32) - np.float32(meta['mean'])) / np.float32(meta['std'])
    return np.ascontiguousarray(normalised.transpose(2, 0, 1)[None])


def cpu_session(path: str):
    """An onnxruntime session of the file at ``path`` on the CPU."""
    import onnxruntime
    return onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])


def file_metadata(session, path: str, task: str) -> dict:
    """The JSON values of an onnxruntime session's ``metadata_props``; ValueError where the file at
    ``path`` is not of ``task`` (no metadata of tools/deployment/export_onnx.py --whole for it)."""
    props = session.get_modelmeta().custom_metadata_map
    if props.get('task') != json.dumps(task):
        raise ValueError(f'{path}: not a {task} model of tools/deployment/export_onnx.py --whole (no {task} metadata)')
    return {key: json.loads(value) for key, value in props.items()}


class SegmentationModel:
    """An exported segmentor in an onnxruntime session on the CPU, with its file's metadata."""

    def __init__(self, path: str, session=None) -> None:
        self.session = session or cpu_session(path)
        self.meta = file_metadata(self.session, path, 'segmentation')
        self.classes: List[str] = list(self.meta['classes'])

    def network_input(self, image: np.ndarray) -> np.ndarray:
        """The BGR image as the graph takes it: resized by the test pipeline's rule, normalised, (1, 3, H, W)."""
        return network_input(image, self.meta)

    def predict(self, image: np.ndarray) -> np.ndarray:
        """The label map (int64, the image's height and width) of a BGR image."""
        logits = self.session.run(['logits'], {'image': self.network_input(image)})[0][0]
        height, width = image.shape[:2]
        if logits.shape[1:] == (height, width):
            return logits.argmax(0)
        resized = [cv2.resize(np.ascontiguousarray(logits[first:first + OPENCV_MAX_CHANNELS].transpose(1, 2, 0)),
                              (width, height), interpolation=cv2.INTER_LINEAR).reshape(height, width, -1)
                   for first in range(0, len(logits), OPENCV_MAX_CHANNELS)]  # one class comes back 2-D
        return np.concatenate(resized, axis=2).argmax(2)


def encode_mask(mask: np.ndarray) -> Dict[str, object]:
    """A binary mask as COCO RLE with a text ``counts`` (pycocotools' compressed form: run lengths in
    column order from a run of zeros, each after the first two as the difference to the one two back,
    in 5-bit groups written as characters from '0')."""
    flat = mask.astype(bool).ravel(order='F')
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        runs.insert(0, 0)
    text = []
    for i, run in enumerate(runs):
        value = run - runs[i - 2] if i > 2 else run
        more = True
        while more:
            group = value & 0x1f
            value >>= 5
            more = value != -1 if group & 0x10 else value != 0
            text.append(chr((group | 0x20 if more else group) + 48))
    return dict(size=[int(mask.shape[0]), int(mask.shape[1])], counts=''.join(text))


def segments(labels: np.ndarray, classes: Sequence[str]) -> List[dict]:
    """The segments of each class present, as tools/infer.py writes them into results.json."""
    def name(label: int) -> str:
        return classes[label] if label < len(classes) else str(label)
    return [dict(label=int(label), **{'class': name(int(label))}, area=int((labels == label).sum()),
                 mask=encode_mask(labels == label)) for label in np.unique(labels)]


def overlay(image: np.ndarray, labels: np.ndarray, palette: Sequence[Sequence[int]], min_size: int,
            max_size: int) -> np.ndarray:
    """The BGR image with its label map blended in the palette's (RGB) colours, enlarged as tools/infer.py
    enlarges pictures: the short side to ``min_size``, the long side at most ``max_size``."""
    scale = min(min_size / min(image.shape[:2]), max_size / max(image.shape[:2]))
    if scale > 1:
        size = (round(image.shape[1] * scale), round(image.shape[0] * scale))
        image = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
        labels = cv2.resize(labels.astype(np.int32), size, interpolation=cv2.INTER_NEAREST)
    colours = np.zeros((max(len(palette), int(labels.max()) + 1), 3), np.uint8)
    colours[:len(palette)] = np.asarray(palette, np.uint8).reshape(-1, 3)[:, ::-1]
    return cv2.addWeighted(image, 1 - OVERLAY_ALPHA, colours[labels], OVERLAY_ALPHA, 0)


def png_bytes(picture: np.ndarray) -> bytes:
    """``picture`` encoded as PNG; ValueError where OpenCV cannot encode it."""
    done, data = cv2.imencode('.png', picture)
    if not done:
        raise ValueError('OpenCV cannot encode the picture as PNG')
    return data.tobytes()
