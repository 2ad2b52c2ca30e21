"""Micro-benchmark of the kernels behind mmcv._ext at the recipe's shapes: the toolkit's
(xcit_mmcv_ext, on torchvision) against a compiled mmcv 2.1.0's, side by side in one process.

  python -m benchmarks mmcv_ext [--compiled-ext PATH/mmcv/_ext.cpython-311-x86_64-linux-gnu.so]

The compiled module is loaded from its file (an environment made with XCIT_MMCV=compiled for the
same torch); without it only the toolkit's column is measured. Shapes: Mask R-CNN at 800x1333,
2 images, the FPN's stride-4 level (2x256x200x334) with RoIs of the sizes mmdet maps there: the box
head's RoIAlign (1024 RoIs, 7x7, adaptive sampling) and the mask head's (256 RoIs, 14x14), forward
and backward; NMS at the RPN's sizes (2000 and 10000
boxes, IoU 0.7). Calls alternate between the two modules; the table gives medians and the largest
difference of their outputs. Prints a markdown table.
"""
import argparse
import importlib.machinery
import importlib.util
import statistics
import time
from types import ModuleType
from typing import Callable, List, Optional

import torch

from xcit_mmcv_ext import ext_module as toolkit_ext

FEATURE = (2, 256, 200, 334)  # stride 4 of 800x1333
STRIDE = 4


def load_compiled(path: str) -> ModuleType:
    """A compiled mmcv's _ext from its file, as a module of its own beside mmcv-lite's."""
    loader = importlib.machinery.ExtensionFileLoader('_ext', path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader('_ext', loader))
    loader.exec_module(module)
    return module


def rois(count: int, gen: torch.Generator) -> torch.Tensor:
    """RoIs (batch index, x1, y1, x2, y2) in image pixels inside 800x1333, 16 to 112 px wide: the
    sizes mmdet's RoI extractor maps to the stride-4 level (larger ones go to coarser levels)."""
    wh = torch.rand(count, 2, generator=gen) * 96 + 16
    xy = torch.rand(count, 2, generator=gen) * (torch.tensor([1333.0, 800.0]) - wh)
    index = torch.randint(0, FEATURE[0], (count, 1), generator=gen).float()
    return torch.cat([index, xy, xy + wh], 1)


def roi_align_calls(ext: ModuleType, size: int, count: int) -> tuple[Callable, Callable]:
    """The forward and backward calls of one RoIAlign shape, as mmcv's RoIAlignFunction makes them."""
    gen = torch.Generator().manual_seed(size)
    feats, boxes = torch.randn(FEATURE, generator=gen), rois(count, gen)
    grad_out = torch.randn(count, FEATURE[1], size, size, generator=gen)
    empty = feats.new_zeros(0)
    args = dict(aligned_height=size, aligned_width=size, spatial_scale=1 / STRIDE, sampling_ratio=0,
                pool_mode=1, aligned=True)

    def forward() -> torch.Tensor:
        out = feats.new_zeros(count, FEATURE[1], size, size)
        ext.roi_align_forward(feats, boxes, out, empty, empty, **args)
        return out

    def backward() -> torch.Tensor:
        grad = feats.new_zeros(FEATURE)
        ext.roi_align_backward(grad_out, boxes, empty, empty, grad, **args)
        return grad
    return forward, backward


def nms_call(ext: ModuleType, count: int) -> Callable:
    gen = torch.Generator().manual_seed(count)
    boxes = rois(count, gen)[:, 1:].contiguous()
    scores = torch.rand(count, generator=gen)
    return lambda: ext.nms(boxes, scores, iou_threshold=0.7, offset=0)


def median_seconds(fn: Callable, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks mmcv_ext', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--compiled-ext', help="a compiled mmcv 2.1.0's _ext extension file")
    parser.add_argument('--repeats', type=int, default=5)
    args = parser.parse_args(argv)
    modules = {'toolkit (torchvision)': toolkit_ext}
    if args.compiled_ext:
        modules['compiled mmcv'] = load_compiled(args.compiled_ext)
    cases = {}
    for name, ext in modules.items():
        box_fwd, box_bwd = roi_align_calls(ext, 7, 1024)
        mask_fwd, mask_bwd = roi_align_calls(ext, 14, 256)
        cases.setdefault('RoIAlign box head fwd (1024 RoIs, 7x7)', {})[name] = box_fwd
        cases.setdefault('RoIAlign box head bwd', {})[name] = box_bwd
        cases.setdefault('RoIAlign mask head fwd (256 RoIs, 14x14)', {})[name] = mask_fwd
        cases.setdefault('RoIAlign mask head bwd', {})[name] = mask_bwd
        cases.setdefault('NMS 2000 boxes, IoU 0.7', {})[name] = nms_call(ext, 2000)
        cases.setdefault('NMS 10000 boxes, IoU 0.7', {})[name] = nms_call(ext, 10000)
    names = list(modules)
    header = ['kernel'] + [f'{n} (ms)' for n in names]
    if len(names) == 2:
        header += ['ratio', 'largest difference']
    print('| ' + ' | '.join(header) + ' |')
    print('|' + '---|' * len(header))
    for case, calls in cases.items():
        outputs = {n: calls[n]() for n in names}  # warm-up, and the outputs compared
        times = {n: [] for n in names}
        for _ in range(args.repeats):  # alternating, so that load changes reach both columns
            for n in names:
                times[n].append(median_seconds(calls[n], 1))
        row = [case] + [f'{1000 * statistics.median(times[n]):.1f}' for n in names]
        if len(names) == 2:
            a, b = (outputs[n] for n in names)
            same_shape = a.shape == b.shape
            diff = (a.double() - b.double()).abs().max().item() if same_shape and a.numel() else 0.0
            row += [f'{statistics.median(times[names[0]]) / statistics.median(times[names[1]]):.2f}',
                    f'{diff:.3g}' if same_shape else f'shapes {tuple(a.shape)} vs {tuple(b.shape)}']
        print('| ' + ' | '.join(row) + ' |')
