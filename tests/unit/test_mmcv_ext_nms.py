"""xcit_mmcv_ext's ``nms``, ``softnms`` and ``nms_match`` through mmcv's own wrappers, against
greedy forms written here in float32 scalars (mmcv 2.1.0's CPU arithmetic). Planted mistakes
each test catches are named in its docstring."""
import importlib
import math
import types

import numpy as np
import pytest
import torch
from mmcv.ops import batched_nms, nms, nms_match, soft_nms

from xcit_mmcv_ext import nms as served

F32 = np.float32


@pytest.fixture(autouse=True)
def served_kernels(monkeypatch):
    """mmcv's NMS wrappers call xcit_mmcv_ext's functions, whichever mmcv._ext is installed."""
    monkeypatch.setattr(importlib.import_module('mmcv.ops.nms'), 'ext_module', types.SimpleNamespace(
        nms=served.nms, softnms=served.softnms, nms_match=served.nms_match))


def iou(a, b, offset=0):
    """Overlap of two boxes in float32 scalars, mmcv's formula."""
    a, b = [F32(v) for v in a], [F32(v) for v in b]
    area_a = (a[2] - a[0] + F32(offset)) * (a[3] - a[1] + F32(offset))
    area_b = (b[2] - b[0] + F32(offset)) * (b[3] - b[1] + F32(offset))
    w = max(F32(0), min(a[2], b[2]) - max(a[0], b[0]) + F32(offset))
    h = max(F32(0), min(a[3], b[3]) - max(a[1], b[1]) + F32(offset))
    inter = w * h
    return inter / (area_a + area_b - inter)


def greedy_nms(boxes, scores, thr, offset=0):
    """Keep boxes by score (ties: input order); drop later ones overlapping a kept one above thr."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    keep = []
    for i in order:
        if all(not iou(boxes[i].tolist(), boxes[k].tolist(), offset) > F32(thr) for k in keep):
            keep.append(i)
    return keep


def random_boxes(n, seed=0, integer=False):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 40
    wh = torch.rand(n, 2, generator=gen) * 20 + 1
    boxes = torch.cat([xy, xy + wh], 1)
    # few distinct scores: many ties
    scores = torch.randint(0, 8, (n,), generator=gen).float() / 8
    return (boxes.round() if integer else boxes), scores


@pytest.mark.parametrize('offset', [0, 1])
@pytest.mark.parametrize('thr', [0.3, 0.5, 0.7])
def test_nms_keeps_what_greedy_nms_keeps_in_its_order(offset, thr):
    """Random boxes with many tied scores. Planted: ties in reverse input order, offset ignored,
    or a threshold compared with >= fails here."""
    boxes, scores = random_boxes(120, integer=bool(offset))
    _, keep = nms(boxes, scores, thr, offset=offset)
    assert keep.tolist() == greedy_nms(boxes, scores, thr, offset)


def test_boxes_exactly_at_the_threshold_are_kept():
    """IoU 0.5 at threshold 0.5, and 3/10 at 0.3 (0.3 as mmcv's float32 threshold, equal to the
    float32 overlap). Planted: >= instead of >, or the threshold passed on as the double 0.3."""
    boxes = torch.tensor([[0, 0, 2, 1], [0, 0, 1, 1], [0, 5, 10, 6], [7, 5, 10, 6]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    assert nms(boxes, scores, 0.5)[1].tolist() == [0, 1, 2, 3]
    assert nms(boxes, scores, 0.3)[1].tolist() == [0, 2, 3]
    assert nms(boxes, scores, 0.29)[1].tolist() == [0, 2]


def test_ties_keep_the_first_box_in_input_order():
    """Planted: ties taken in reverse input order keep index 2 here."""
    boxes = torch.tensor([[0, 0, 10, 10]] * 4, dtype=torch.float32)
    scores = torch.tensor([0.5, 0.9, 0.9, 0.1])
    assert nms(boxes, scores, 0.5)[1].tolist() == [1]
    assert served.nms(boxes, torch.full((4,), 0.5), 0.5, 0).tolist() == [0]


def test_everything_suppressed_but_one_and_no_boxes():
    """Planted: kept indices returned as int32 (mmcv's are int64) fail here."""
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10.1], [0.1, 0, 10, 10]])
    assert nms(boxes, torch.tensor([0.1, 0.3, 0.2]), 0.5)[1].tolist() == [1]
    dets, keep = nms(boxes[:0], torch.zeros(0), 0.5)
    assert keep.dtype == torch.long and keep.shape == (0,) and dets.shape == (0, 5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float64])
def test_boxes_of_any_float_dtype_are_read_as_float32_and_scores_ranked_in_their_own(dtype):
    """Planted: scores cast to float32 before ranking merge float64 scores that differ beyond
    float32 into ties; boxes not cast fail in torchvision for mixed dtypes."""
    boxes, scores = random_boxes(60, seed=1)
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    if dtype == torch.float64:
        scores = scores + torch.arange(60, dtype=dtype) * 1e-12  # ties broken beyond float32
    keep = served.nms(boxes, scores, 0.5, 0)
    assert keep.tolist() == greedy_nms(boxes.float(), scores, 0.5)
    assert served.nms(boxes.float(), scores.half() if dtype != torch.float16 else scores, 0.5, 0).dtype == torch.long


def test_batched_nms_and_score_threshold_and_max_num():
    """mmcv's wrappers around the kernel (class offsets, score filtering, max_num) keep working."""
    boxes, scores = random_boxes(80, seed=2)
    labels = torch.arange(80) % 3
    _, keep = batched_nms(boxes, scores, labels, dict(type='nms', iou_threshold=0.5))
    expected = []
    for label in range(3):
        idx = (labels == label).nonzero().squeeze(1)
        expected += idx[greedy_nms(boxes[idx], scores[idx], 0.5)].tolist()
    assert sorted(keep.tolist()) == sorted(expected)
    _, keep = nms(boxes, scores, 0.5, score_threshold=0.4, max_num=5)
    valid = (scores > 0.4).nonzero().squeeze(1)
    assert keep.tolist() == valid[greedy_nms(boxes[valid], scores[valid], 0.5)][:5].tolist()


def soft_nms_oracle(boxes, scores, thr, sigma, min_score, method, offset=0):
    """mmcv's soft-NMS loop on Python lists of float32 scalars."""
    rows = [[F32(v) for v in b] + [F32(s)] for b, s in zip(boxes.tolist(), scores.tolist())]
    inds = list(range(len(rows)))
    dets, n, i = [], len(rows), 0
    while i < n:
        top = max(range(i, n), key=lambda k: (rows[k][4], -k))  # the first of equal maxima
        rows[i], rows[top], inds[i], inds[top] = rows[top], rows[i], inds[top], inds[i]
        dets.append(rows[i][:])
        pos = i + 1
        while pos < n:
            ovr = iou(rows[i][:4], rows[pos][:4], offset)
            if method == 0:
                weight = F32(0) if ovr >= F32(thr) else F32(1)
            elif method == 1:
                weight = F32(1) - ovr if ovr >= F32(thr) else F32(1)
            else:
                weight = F32(math.exp(-(ovr * ovr) / F32(sigma)))
            rows[pos][4] = rows[pos][4] * weight
            if rows[pos][4] < F32(min_score):
                rows[pos], inds[pos] = rows[n - 1], inds[n - 1]
                n -= 1
            else:
                pos += 1
        i += 1
    return np.array(dets[:n], dtype=np.float32).reshape(-1, 5), inds[:n]


@pytest.mark.parametrize('method', ['naive', 'linear', 'gaussian'])
def test_soft_nms_matches_mmcvs_loop(method):
    """Planted: a dropped box removed by shifting (not mmcv's swap with the last), the first of
    equal maxima not taken, or the linear decay applied below the threshold: each fails here."""
    boxes, scores = random_boxes(50, seed=3)
    dets, keep = soft_nms(boxes, scores, 0.3, sigma=0.5, min_score=0.05, method=method)
    method_code = {'naive': 0, 'linear': 1, 'gaussian': 2}[method]
    ref_dets, ref_keep = soft_nms_oracle(boxes, scores, 0.3, 0.5, 0.05, method_code)
    assert keep.tolist() == ref_keep
    np.testing.assert_allclose(dets.numpy(), ref_dets, rtol=1e-6, atol=0)
    empty_dets, empty_keep = soft_nms(boxes[:0], scores[:0], 0.3)
    assert empty_dets.shape == (0, 5) and empty_keep.shape == (0,)


def test_nms_match_groups_each_kept_box_with_what_it_suppressed():
    """Planted: > instead of mmcv's >= here, or groups not in score order."""
    boxes, scores = random_boxes(60, seed=4)
    boxes[1] = torch.tensor([0, 0, 2, 1.0])
    boxes[2] = torch.tensor([0, 0, 1, 1.0])  # IoU exactly 0.5 with box 1
    scores[1], scores[2] = 0.99, 0.98
    groups = nms_match(torch.cat([boxes, scores[:, None]], 1), 0.5)
    order = sorted(range(60), key=lambda i: -float(scores[i]))
    suppressed, expected = set(), []
    for place, i in enumerate(order):
        if i in suppressed:
            continue
        hit = [j for j in order[place + 1:]
               if j not in suppressed and iou(boxes[i].tolist(), boxes[j].tolist()) >= F32(0.5)]
        suppressed.update(hit)
        expected.append([i] + hit)
    assert [g.tolist() for g in groups] == expected
    assert [1, 2] in [g.tolist() for g in groups]
