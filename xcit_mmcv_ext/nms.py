"""mmcv 2.1.0's ``nms``, ``softnms`` and ``nms_match`` (its CPU kernels' semantics), for ``mmcv._ext``.

Rules kept, the same on every device:
- Arithmetic: boxes are read as float32 whatever their dtype (mmcv reads ``float`` pointers), the
  overlap is ``inter / (area_i + area_j - inter)`` compared with the threshold rounded to float32,
  as mmcv's ``float`` argument is (mmcv's CPU kernel; its CUDA kernel compared ``inter > thr * union``).
- Ties: boxes of equal score are taken in their input order (a stable sort). mmcv sorted
  unstably, so its order of tied scores was an accident of its sort; this one is reproducible.
- Scores of any floating dtype are ranked in their own dtype: float16 and bfloat16 exactly as
  float32; float64 ones through a strictly decreasing float32 rank, so scores that differ only
  beyond float32 stay ordered.
- ``offset=1`` (legacy pixel boxes, width ``x2 - x1 + 1``): 1 is added to x2 and y2 first; the
  same numbers as mmcv where those float32 sums are exact (integer coordinates below 2**24).
"""
from typing import List

import torch
import torchvision  # noqa: F401  (registers the torch.ops.torchvision kernels called here)
from torch import Tensor

MAX_RANKED = 2 ** 24  # float64-scored boxes whose float32 ranks stay distinct


def _float32(value: float) -> float:
    """A threshold as mmcv's kernels take it (a C++ ``float``): 0.3 is 0.30000001192..."""
    return torch.tensor(value, dtype=torch.float32).item()


def _check_offset(offset: int) -> None:
    if offset not in (0, 1):
        raise ValueError(f'offset must be 0 or 1, got {offset}')


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    """Indices of the boxes kept by greedy NMS, highest score first (torchvision's kernel, whose
    sort is stable: ties in input order)."""
    _check_offset(offset)
    boxes = boxes.float()
    if offset:
        boxes = boxes + boxes.new_tensor([0, 0, 1, 1])
    if scores.dtype != torch.float64:  # float32 holds float16 and bfloat16 scores exactly
        return torch.ops.torchvision.nms(boxes, scores.float(), _float32(iou_threshold))
    # float64 scores that differ only beyond float32: NMS on their float32 rank instead
    if boxes.size(0) > MAX_RANKED:
        raise ValueError(f'nms ranks at most {MAX_RANKED} float64 scores, got {boxes.size(0)}')
    order = torch.sort(scores, descending=True, stable=True).indices
    rank = torch.arange(len(order), 0, -1, dtype=torch.float32, device=boxes.device)
    return order[torch.ops.torchvision.nms(boxes[order], rank, _float32(iou_threshold))]


def _overlaps(box: Tensor, others: Tensor, areas: Tensor, area: Tensor, offset: int) -> Tensor:
    """IoU of one box (x1, y1, x2, y2) with each of ``others``, in float32 as mmcv computes it."""
    width = (torch.minimum(others[:, 2], box[2]) - torch.maximum(others[:, 0], box[0]) + offset).clamp(min=0)
    height = (torch.minimum(others[:, 3], box[3]) - torch.maximum(others[:, 1], box[1]) + offset).clamp(min=0)
    inter = width * height
    return inter / (area + areas - inter)


def softnms(boxes: Tensor, scores: Tensor, dets: Tensor, iou_threshold: float, sigma: float,
            min_score: float, method: int, offset: int) -> Tensor:
    """mmcv's soft-NMS on CPU tensors: fills ``dets`` (N, 5) in place with the boxes and decayed
    scores in the order taken, and returns the input indices of the kept ones.

    ``method`` 0 drops overlaps at or above the threshold, 1 scales them by ``1 - iou``, 2 by
    ``exp(-iou**2 / sigma)``; a box whose score falls below ``min_score`` is dropped by moving the
    last candidate into its place, as mmcv does (the order of equal maxima depends on it)."""
    _check_offset(offset)
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    iou_threshold, sigma, min_score = _float32(iou_threshold), _float32(sigma), _float32(min_score)
    # rows: x1, y1, x2, y2, score, area
    rows = torch.cat([boxes.float(), scores.float()[:, None]], 1)
    rows = torch.cat([rows, ((rows[:, 2] - rows[:, 0] + offset) * (rows[:, 3] - rows[:, 1] + offset))[:, None]], 1)
    inds = torch.arange(len(rows))
    count, i = len(rows), 0
    while i < count:
        top = i + int(torch.argmax(rows[i:count, 4]))  # the first of equal maxima, as mmcv's scan
        rows[[i, top]], inds[[i, top]] = rows[[top, i]], inds[[top, i]]
        dets[i] = rows[i, :5]
        rest = rows[i + 1:count]
        iou = _overlaps(rows[i], rest, rest[:, 5], rows[i, 5], offset)
        if method == 0:
            weight = torch.where(iou >= iou_threshold, 0.0, 1.0)
        elif method == 1:
            weight = torch.where(iou >= iou_threshold, 1 - iou, 1.0)
        else:
            weight = torch.exp(-(iou * iou) / sigma)
        rest[:, 4] *= weight
        dropped = (rest[:, 4] < min_score).tolist()
        if any(dropped):
            slots, pos, left = list(range(len(dropped))), 0, len(dropped)
            while pos < left:
                if dropped[slots[pos]]:
                    slots[pos] = slots[left - 1]
                    left -= 1
                else:
                    pos += 1
            kept = torch.tensor(slots[:left], dtype=torch.long) + i + 1
            rows[i + 1:i + 1 + left], inds[i + 1:i + 1 + left] = rows[kept], inds[kept]
            count = i + 1 + left
        i += 1
    return inds[:count]


def nms_match(dets: Tensor, iou_threshold: float) -> List[List[int]]:
    """mmcv's NMS match on a CPU tensor (N, 5): for each kept box, highest score first, the list of
    its index followed by the indices it suppressed (overlap at or above the threshold)."""
    dets, iou_threshold = dets.float(), _float32(iou_threshold)
    areas = (dets[:, 2] - dets[:, 0]) * (dets[:, 3] - dets[:, 1])
    order = torch.sort(dets[:, 4], descending=True, stable=True).indices
    suppressed = torch.zeros(len(dets), dtype=torch.bool)
    matched = []
    for place, index in enumerate(order.tolist()):
        if suppressed[index]:
            continue
        later = order[place + 1:]
        later = later[~suppressed[later]]
        hit = later[_overlaps(dets[index], dets[later], areas[later], areas[index], 0) >= iou_threshold]
        suppressed[hit] = True
        matched.append([index] + hit.tolist())
    return matched
