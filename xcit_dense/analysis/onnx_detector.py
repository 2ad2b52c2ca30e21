"""A Mask R-CNN's whole prediction (boxes, scores, labels, mask probabilities) as one module that
``torch.onnx.export(dynamo=True)`` turns into standard ONNX operators.

mmdet's own ``predict`` does not export: under the exporter its ``multiclass_nms`` takes a TensorRT
branch (no score threshold, a dummy box), and its heads branch on data (empty RoIs, per-level
indexing, per-image loops). ``DetectorForward`` reuses the model's layers and weights and writes
the post-processing without branches on data: a RoI's features are computed on every level and the
level mmdet would pick (``SingleRoIExtractor.map_roi_levels``) selected by a mask; NMS is
``torchvision.ops.nms`` (ONNX ``NonMaxSuppression``), RoIAlign ``torchvision.ops.roi_align``
(ONNX ``RoiAlign``).

The contract, batch 1: the image goes in resized and normalised (float32 (1, 3, H, W), mmdet's
``mean``/``std``/``bgr_to_rgb`` applied by the caller), not padded: the module pads it with zeros to
the data preprocessor's ``pad_size_divisor`` itself, as mmdet's preprocessor does after normalising,
and clips boxes to H x W. Out: boxes (N, 4) in the input's pixels (divide by the resize's scale
factor for the original image's), scores (N,), labels (N,), masks (N, 28, 28): each box's
probabilities of its label, to paste into the box (mmdet thresholds them at ``mask_thr_binary``).
"""
import copy
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms, roi_align

DETECTOR_OUTPUTS = ['boxes', 'scores', 'labels', 'masks']
# DeltaXYWHBBoxCoder.decode's default bound of the size deltas, which mmdet's heads do not change
WH_RATIO_CLIP = 16 / 1000
# --check: an onnxruntime detection matches PyTorch's of its label with a box IoU of at least this, their
# scores differ by at most this, and the pairs' 28x28 masks (over the file's mask_thr_binary) overlap by this
MIN_BOX_IOU = 0.99
MAX_SCORE_DIFFERENCE = 1e-3
MIN_MASK_IOU = 0.99


def decode_deltas(coder: nn.Module, priors: torch.Tensor, deltas: torch.Tensor, height, width) -> torch.Tensor:
    """``DeltaXYWHBBoxCoder.decode`` of (N, 4) deltas against (N, 4) priors, clipped to the image as
    the coder clips (``clip_border``): mmdet's ``delta2bbox`` without its branch on an empty input."""
    if type(coder).__name__ != 'DeltaXYWHBBoxCoder' or coder.add_ctr_clamp:
        raise ValueError(f'DetectorForward decodes DeltaXYWHBBoxCoder boxes without add_ctr_clamp, not {coder}')
    deltas = deltas * deltas.new_tensor(coder.stds) + deltas.new_tensor(coder.means)
    centres = (priors[:, :2] + priors[:, 2:]) * 0.5
    sizes = priors[:, 2:] - priors[:, :2]
    max_ratio = abs(math.log(WH_RATIO_CLIP))
    new_centres = centres + sizes * deltas[:, :2]
    new_sizes = sizes * deltas[:, 2:].clamp(min=-max_ratio, max=max_ratio).exp()
    x1, y1 = (new_centres - new_sizes * 0.5).unbind(1)
    x2, y2 = (new_centres + new_sizes * 0.5).unbind(1)
    if coder.clip_border:
        x1, x2 = x1.clamp(min=0, max=width), x2.clamp(min=0, max=width)
        y1, y2 = y1.clamp(min=0, max=height), y2.clamp(min=0, max=height)
    return torch.stack([x1, y1, x2, y2], 1)


def offset_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, nms_cfg) -> torch.Tensor:
    """mmcv's ``batched_nms`` (NMS within each group, kept indices by falling score): the boxes of
    group ``g`` shifted by ``g`` times one more than the largest coordinate, which mmcv takes over the
    boxes (here over them and 0, so that no box gives 0: equal for boxes clipped to the image)."""
    if nms_cfg.get('type', 'nms') != 'nms' or nms_cfg.get('class_agnostic', False):
        raise ValueError(f'DetectorForward runs per-class NMS of type nms only, not {dict(nms_cfg)}')
    largest = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    return nms(boxes + (groups.to(boxes.dtype) * (largest + 1))[:, None], scores, float(nms_cfg['iou_threshold']))


def roi_features(extractor: nn.Module, feats: Sequence[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
    """``SingleRoIExtractor``'s features of (N, 4) boxes: RoIAlign of every box on every level, each
    box's level (mmdet's ``map_roi_levels``) kept by a mask, so that nothing is indexed by data."""
    rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], 1)
    levels = extractor.map_roi_levels(rois, len(extractor.roi_layers))
    out = None
    for level, (layer, feat) in enumerate(zip(extractor.roi_layers, feats)):
        if getattr(layer, 'pool_mode', 'avg') != 'avg':
            raise ValueError(f'DetectorForward exports average RoIAlign only, not {layer}')
        pooled = roi_align(feat, rois, layer.output_size, layer.spatial_scale, layer.sampling_ratio,
                           layer.aligned)
        term = pooled * (levels == level).to(pooled.dtype)[:, None, None, None]
        out = term if out is None else out + term
    return out


def is_mask_rcnn(model: nn.Module) -> bool:
    """Whether ``model`` has the parts ``DetectorForward`` runs: mmdet's RPN head, and its standard RoI
    heads with a mask head and single-level RoI extractors (not a cascade's)."""
    from mmdet.models.dense_heads import RPNHead
    from mmdet.models.roi_heads import StandardRoIHead
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    roi_head = getattr(model, 'roi_head', None)
    return (isinstance(getattr(model, 'rpn_head', None), RPNHead) and isinstance(roi_head, StandardRoIHead)
            and roi_head.with_mask and not roi_head.with_shared_head
            and isinstance(roi_head.bbox_roi_extractor, SingleRoIExtractor)
            and isinstance(roi_head.mask_roi_extractor, SingleRoIExtractor))


class DetectorForward(nn.Module):
    """A Mask R-CNN's prediction for one resized, normalised, unpadded image (see the module's
    docstring), with the settings of the config's ``model.test_cfg``: the RPN's top ``nms_pre`` per
    level, its ``min_bbox_size``, NMS per level and ``max_per_img`` proposals; the box head's
    per-class NMS over scores above ``score_thr``, ``max_per_img`` detections; the mask head's
    probabilities of each detection's label."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.rpn_cfg, self.rcnn_cfg = copy.deepcopy(model.test_cfg.rpn), copy.deepcopy(model.test_cfg.rcnn)
        self.pad_divisor = int(getattr(model.data_preprocessor, 'pad_size_divisor', 1))
        if model.roi_head.bbox_head.custom_cls_channels:
            raise ValueError('DetectorForward takes a box head with a softmax over the classes')

    def proposals(self, feats: Sequence[torch.Tensor], height, width) -> torch.Tensor:
        """The RPN's boxes as mmdet's ``RPNHead.predict_by_feat`` keeps them, by falling score."""
        head, cfg = self.model.rpn_head, self.rpn_cfg
        cls_scores, deltas = head(feats)
        priors = head.prior_generator.grid_priors([s.shape[-2:] for s in cls_scores], device=feats[0].device)
        boxes, scores, levels = [], [], []
        for level, (cls_score, delta, prior) in enumerate(zip(cls_scores, deltas, priors)):
            score = cls_score[0].permute(1, 2, 0).reshape(-1).sigmoid()
            delta = delta[0].permute(1, 2, 0).reshape(-1, 4)
            score, top = score.topk(torch.sym_min(cfg.nms_pre, score.shape[0]))
            boxes.append(decode_deltas(head.bbox_coder, prior[top], delta[top], height, width))
            scores.append(score)
            levels.append(torch.full_like(top, level))
        boxes, scores, levels = torch.cat(boxes), torch.cat(scores), torch.cat(levels)
        if cfg.get('min_bbox_size', -1) >= 0:
            size = boxes[:, 2:] - boxes[:, :2]
            valid = (size > cfg.min_bbox_size).all(1)
            boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
        keep = offset_nms(boxes, scores, levels, cfg.nms)[:cfg.max_per_img]
        return boxes[keep]

    def detections(self, feats: Sequence[torch.Tensor], proposals: torch.Tensor, height,
                   width) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The box head's boxes, scores and labels as mmdet's ``multiclass_nms`` keeps them."""
        roi_head, cfg = self.model.roi_head, self.rcnn_cfg
        head = roi_head.bbox_head
        extractor = roi_head.bbox_roi_extractor
        cls_score, deltas = head(roi_features(extractor, feats[:extractor.num_inputs], proposals))
        probabilities = F.softmax(cls_score, dim=-1)[:, :-1]
        classes = probabilities.shape[1]
        regressed = 1 if head.reg_class_agnostic else classes
        boxes = decode_deltas(head.bbox_coder, proposals.repeat_interleave(regressed, 0),
                              deltas.reshape(-1, 4), height, width).reshape(-1, regressed, 4)
        boxes = boxes.expand(-1, classes, -1).reshape(-1, 4)
        scores = probabilities.reshape(-1)
        labels = torch.arange(classes, device=scores.device).repeat(proposals.shape[0])
        valid = scores > cfg.score_thr
        boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
        keep = offset_nms(boxes, scores, labels, cfg.nms)[:cfg.max_per_img]
        return boxes[keep], scores[keep], labels[keep]

    def mask_probabilities(self, feats: Sequence[torch.Tensor], boxes: torch.Tensor,
                           labels: torch.Tensor) -> torch.Tensor:
        """The mask head's (N, 28, 28) probabilities of each box's label."""
        roi_head = self.model.roi_head
        extractor = roi_head.mask_roi_extractor
        logits = roi_head.mask_head(roi_features(extractor, feats[:extractor.num_inputs], boxes))
        if roi_head.mask_head.class_agnostic:
            return logits[:, 0].sigmoid()
        index = labels[:, None, None, None].expand(-1, 1, *logits.shape[2:])
        return logits.gather(1, index)[:, 0].sigmoid()

    def forward(self, image: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        height, width = image.shape[2], image.shape[3]
        divisor = self.pad_divisor
        padded = F.pad(image, (0, (divisor - width % divisor) % divisor, 0, (divisor - height % divisor) % divisor))
        feats = self.model.extract_feat(padded)
        proposals = self.proposals(feats, height, width)
        boxes, scores, labels = self.detections(feats, proposals, height, width)
        return boxes, scores, labels, self.mask_probabilities(feats, boxes, labels)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The (len(a), len(b)) IoUs of two arrays of (x1, y1, x2, y2) boxes."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(high - low, 0, None).prod(2)
    area_a, area_b = (np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(1) for boxes in (a, b))
    union = area_a[:, None] + area_b[None] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match_detections(expected: Dict[str, np.ndarray], got: Dict[str, np.ndarray],
                     mask_threshold: float) -> dict:
    """``got``'s detections (``boxes``, ``scores``, ``labels``, ``masks`` as ``DetectorForward`` gives
    them) paired with ``expected``'s, by falling score, each with the unpaired one of the same label of
    the largest box IoU at least ``MIN_BOX_IOU``: the pairs, the unpaired ones of each, the pairs'
    largest score difference and smallest IoU of their masks (probabilities over ``mask_threshold``),
    and whether all are within the tolerances."""
    ious = box_iou(got['boxes'], expected['boxes'])
    free = np.ones(len(expected['boxes']), bool)
    pairs = []
    for i in np.argsort(-got['scores'], kind='stable'):
        candidates = free & (expected['labels'] == got['labels'][i]) & (ious[i] >= MIN_BOX_IOU)
        if candidates.any():
            j = int(np.argmax(np.where(candidates, ious[i], -1)))
            free[j] = False
            pairs.append((int(i), j))
    score_difference, mask_iou = 0.0, 1.0
    for i, j in pairs:
        score_difference = max(score_difference, abs(float(got['scores'][i] - expected['scores'][j])))
        a, b = got['masks'][i] >= mask_threshold, expected['masks'][j] >= mask_threshold
        union = (a | b).sum()
        mask_iou = min(mask_iou, float((a & b).sum() / union) if union else 1.0)
    unmatched = len(got['boxes']) - len(pairs), len(expected['boxes']) - len(pairs)
    return dict(matched=len(pairs), unmatched=unmatched, score_difference=score_difference, mask_iou=mask_iou,
                within=unmatched == (0, 0) and score_difference <= MAX_SCORE_DIFFERENCE and mask_iou >= MIN_MASK_IOU)


def check_detection(path: str, module: nn.Module, inputs: Iterable[Tuple[str, Optional[str]]],
                    shape: Sequence[int]) -> List[dict]:
    """onnxruntime's file at ``path`` beside ``module`` (``DetectorForward``) per input: ``(name, image
    path)`` pairs, the image prepared as the file's metadata says, or ``(name, None)`` for a random image
    of ``shape``; per input ``match_detections``'s row with its ``image``. An image that cannot be read
    raises ValueError or FileNotFoundError."""
    from xcit_launch.onnx_detection import DETECTION_OUTPUTS, DetectionModel
    from xcit_launch.onnx_segmentation import read_image

    from ..pixel_limit import DEFAULT_MAX_BYTES
    runtime = DetectionModel(path)
    rows = []
    for name, image_path in inputs:
        if image_path is None:
            prepared = torch.rand(1, 3, *shape).numpy()
        else:
            prepared = runtime.network_input(read_image(image_path, DEFAULT_MAX_BYTES))[0]
        with torch.no_grad():
            expected = dict(zip(DETECTION_OUTPUTS, (t.numpy() for t in module.eval()(torch.from_numpy(prepared)))))
        row = match_detections(expected, runtime.run(prepared), runtime.meta['mask_thr_binary'])
        rows.append(dict(image=name, **row))
    return rows
