"""Whole models at the recipe's sizes beside the stock Swin-T ones, side by side in one process:
Mask R-CNN XCiT-S12/16 against mmdet's Swin-T Mask R-CNN 3x at 800x1333 (``--task det``), UperNet
XCiT-S12/16 against mmseg's Swin-T UperNet at 512x512 (``--task seg``).

For each pair: the training step (forward, losses, backward, AdamW step) at ``--batch`` images and
inference at ``--batch`` and 1 image, the models alternated (``--rounds``, medians), the time per
part, the peak tensor memory of one step (profiler allocation events, above the weights and AdamW
state), the backward pass per part (one profiled step's split of the timed backward: each
autograd node counted in the part whose forward built it), and the GPU-comparable training
memory: weights, gradients and AdamW moments (fp32) plus that peak. ``--extra MODEL`` adds a model
measured at batch 1 beside the pair's first stock model (e.g. ``mask_rcnn_xcit_s12_p8``, whose
batch 2 step exceeds this machine's memory); ``--variants with_cp=selective`` the pair's first model
with that option, side by side with the pair (``fast_layers=False``: the plain layers beside the
fast ones, which the auto choice installs on a CPU). ``--fixed-proposals`` gives the detectors' RoI heads
the same proposals in both models, in training and at inference (``WholeModel(fixed_proposals=True)``):
with random weights each RPN's own proposals decide the heads' work. Example (the command of
benchmarks/reports/whole_models.md)::

    PYTHONPATH=. .venv/bin/python -m benchmarks whole_models --task det --rounds 3 --threads 2 \\
        --out benchmarks/reports/whole_models_det.md
"""
import argparse
import os
import platform
import time
from typing import Dict, List, Optional

import torch

from benchmarks.whole_model import WholeModel, side_by_side  # noqa: E402

PAIRS = {'det': (('mask_rcnn_xcit_s12_p16', 'mask_rcnn_swin_t'), (800, 1333)),
         'seg': (('upernet_xcit_s12_p16', 'upernet_swin_t'), (512, 512))}
GIB = 2 ** 30
# config options of the pair's first model, measured beside it with --variants
VARIANTS = {'with_cp=selective': {'model.backbone.with_cp': 'selective'},
            'with_cp=True': {'model.backbone.with_cp': True},
            'fast_layers=False': {'model.backbone.fast_layers': False},
            'fast_layers=False with_cp=selective': {'model.backbone.fast_layers': False,
                                                   'model.backbone.with_cp': 'selective'}}


def table(title: str, names: List[str], results: Dict[str, Dict[str, float]], peaks: Optional[Dict[str, int]] = None,
          total: str = 'total') -> List[str]:
    """A Markdown table: ``total`` and per-part seconds (and peak tensor memory), ratios to the last model."""
    parts = list(dict.fromkeys(k for n in names for k in results[n] if k != total))
    ref = names[-1]
    peak_head = ' peak tensors |' if peaks else ''
    lines = [f'**{title}**', '', f'| model | {total} | ' + ' | '.join(parts) + ' |' + peak_head,
             '|---' * (len(parts) + 2 + bool(peaks)) + '|']
    for n in names:
        cells = [f'{results[n].get(p, 0):.2f} s' for p in parts]
        lines.append(f'| {n} | {results[n][total]:.2f} s | ' + ' | '.join(cells) + ' |'
                     + (f' {peaks[n] / GIB:.2f} GiB |' if peaks else ''))
    for n in names[:-1]:
        cells = [f'{results[n].get(p, 0) / results[ref][p]:.2f}' if results[ref].get(p) else '' for p in parts]
        lines.append(f'| ratio {n} / {ref} | {results[n][total] / results[ref][total]:.2f} | '
                     + ' | '.join(cells) + ' |' + (f' {peaks[n] / peaks[ref]:.2f} |' if peaks else ''))
    return lines + ['']


def backward_split(model: WholeModel, backward_s: float) -> Dict[str, float]:
    """The timed backward seconds split per part as one profiled step splits its own."""
    shares = model.backward_parts()
    scale = backward_s / sum(shares.values())
    return dict({part: s * scale for part, s in sorted(shares.items(), key=lambda kv: -kv[1])}, backward=backward_s)


def roi_check(names: List[str], size, batch: int, rounds: int, instances: int) -> List[str]:
    """The training forward (no backward) with the RPN's own proposals and with fixed ones: the RoI
    heads' time follows the positive RoIs, which with random weights the backbone decides."""
    models = [WholeModel(n, size, batch, instances) for n in names]
    lines = [f'**RoI heads: the RPN\'s proposals against fixed ones** (training forward, no backward, batch {batch}, '
             f'{size[0]}x{size[1]}; medians of {rounds})', '',
             '| model | proposals | positive RoIs | roi_head | loss | forward in all |', '|---|---|---|---|---|---|']
    for fixed in (False, True):
        for m in models:
            m.fixed_proposals = fixed
        results = side_by_side(models, 'loss', rounds)
        source = 'fixed' if fixed else "the RPN's"
        for m in models:
            r = results[m.name]
            lines.append(f'| {m.name} | {source} | {m.positive_rois} | '
                         f'{r["roi_head"]:.2f} s | {r["loss"]:.2f} s | {r["total"]:.2f} s |')
    return lines + ['']


def build(names: List[str], size, batch: int, instances: int, variants: List[str] = (),
          fixed_proposals: bool = False) -> List[WholeModel]:
    """The catalogue models ``names``, and the first one's ``variants`` (``VARIANTS``) before the last."""
    models = [WholeModel(n, size, batch, instances, fixed_proposals=fixed_proposals) for n in names]
    for variant in variants:
        model = WholeModel(names[0], size, batch, instances, options=VARIANTS[variant], fixed_proposals=fixed_proposals)
        model.name = f'{names[0]} {variant}'
        models.insert(len(models) - 1, model)
    return models


def measure(names: List[str], size, batches: List[int], rounds: int, instances: int,
            variants: List[str] = (), fixed_proposals: bool = False) -> List[str]:
    """Build ``names`` (and ``variants``) and measure them side by side; the report's lines."""
    models = build(names, size, batches[0], instances, variants, fixed_proposals)
    names = [m.name for m in models]
    lines = ['| model | params | weights + grads + AdamW (fp32) |', '|---|---|---|']
    lines += [f'| {m.name} | {m.params / 1e6:.2f} M | {m.state_bytes() / GIB:.2f} GiB |' for m in models]
    lines.append('')
    train_peaks: Dict[str, int] = {}
    for mode, batch in [('train', batches[0])] + [('infer', b) for b in batches]:
        for m in models:
            m.rebatch(batch)
        results = side_by_side(models, mode, rounds)
        peaks = {m.name: m.peak_tensor_bytes(mode) for m in models}
        title = f'{"training step" if mode == "train" else "inference"}, batch {batch}, {size[0]}x{size[1]}'
        lines += table(title, names, results, peaks)
        if mode == 'train':
            train_peaks = peaks
            split = {m.name: backward_split(m, results[m.name]['backward']) for m in models}
            lines += table(f'backward of that step per part (the forward of the part built the autograd nodes; '
                           f'split as one profiled step splits it), batch {batch}', names, split, total='backward')
    lines += ['**GPU-comparable training memory** (weights, gradients, AdamW moments in fp32 + the step\'s '
              'peak tensors)', '']
    lines += [f'- {m.name}: {(m.state_bytes() + train_peaks[m.name]) / 1e9:.1f} GB' for m in models]
    return lines + ['']


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m benchmarks whole_models', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--task', choices=sorted(PAIRS), default='det')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'), help="default: the pair's recipe size")
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--instances', type=int, default=7, help="per image (COCO's mean is 7.3)")
    parser.add_argument('--extra', nargs='*', default=[], help='models measured at batch 1 beside the stock one')
    parser.add_argument('--variants', nargs='*', default=[], choices=sorted(VARIANTS),
                        help="the pair's first model with these options too, side by side with the pair")
    parser.add_argument('--roi-check', action='store_true',
                        help="only the RoI heads' training forward with the RPN's proposals and with fixed ones")
    parser.add_argument('--fixed-proposals', action='store_true',
                        help="the detectors' RoI heads get the same proposals in both models (training and inference)")
    parser.add_argument('--out', help='write the Markdown report here too')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names, size = PAIRS[args.task]
    size = tuple(args.size or size)
    start = time.time()
    load = os.getloadavg()[0]
    lines = [f'# Whole models side by side ({args.task}), {size[0]}x{size[1]}', '',
             f'CPU {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; random weights, '
             f'random images with {args.instances} boxes and masks each (detection), batched by each model\'s own '
             'data preprocessor (normalised, padded to its size divisor)'
             + ("; the RoI heads given the same fixed proposals in both models" if args.fixed_proposals else '')
             + f'; median of {args.rounds} '
             'rounds, the models alternated in one process; parts are forward times of the models\' own methods '
             '(each its own time: `loss` is the RPN, box and mask heads\' targets and losses, `other` the rest of '
             'the step), backward and optimizer step timed whole, backward split per part below.', '']
    if args.roi_check:
        lines += roi_check(list(names), size, args.batch, args.rounds, args.instances)
    else:
        lines += measure(list(names), size, [args.batch, 1], args.rounds, args.instances, args.variants,
                         args.fixed_proposals)
    for extra in args.extra:
        lines += [f'## {extra} at batch 1 beside {names[-1]}', '']
        lines += measure([extra, names[-1]], size, [1], args.rounds, args.instances,
                         fixed_proposals=args.fixed_proposals)
    lines += [f'Command: `PYTHONPATH=. .venv/bin/python -m benchmarks whole_models --task {args.task} '
              f'--size {size[0]} {size[1]} --rounds {args.rounds} --batch {args.batch} --threads {args.threads} '
              f'--instances {args.instances}'
              + (f' --extra {" ".join(args.extra)}' if args.extra else '') + (' --roi-check' if args.roi_check else '')
              + (f' --variants {" ".join(args.variants)}' if args.variants else '')
              + (' --fixed-proposals' if args.fixed_proposals else '')
              + '`; '
              f'{time.time() - start:.0f} s in all, load average {load:.1f} at the start, '
              f'{os.getloadavg()[0]:.1f} at the end.', '']
    text = '\n'.join(lines)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)
