"""``python -m benchmarks backbones``: speed and peak memory of XCiT and the alternatives against image size.

For every model, size and mode it measures the time per image and the peak memory
of inference (``infer``) and of one training step, forward and backward (``train``). Each
measurement runs in a fresh process, so peaks never mix: warm-up runs, then ``--repeats`` timed
runs, the median reported. On a GPU it uses CUDA events and the allocator's peak above what was
allocated before the first forward; on a CPU, wall time and the resident memory the run adds
above the process's resident size just before the first forward (the high-water mark is reset
there through /proc/self/clear_refs), and, from one more profiled step, the peak tensor memory
(what the GPU figure counts, without what malloc keeps for reuse).

Every model is built through the mmengine / mmdet / mmseg registries with random weights:

- ``xcit_{t12,s12}_p{16,8}``: this toolkit's XCiT (type='XCiT');
- ``timm_xcit_{t12,s12}_p{16,8}``: timm's XCiT on the same weights, followed by the same pyramid
  ops written in plain torch (functional transposed convolutions, batch norm, GELU, max pools);
- ``swin_t`` (mmdet SwinTransformer), ``r50`` (mmdet ResNet-50);
- ``vit_s16`` (timm ViT-S/16, fused attention) and ``mmseg_vit_s16`` (mmseg VisionTransformer,
  attention weights materialised), both global attention;
- ``mask_rcnn_xcit_t12_p16`` and ``upernet_xcit_t12_p16``: whole models built from the configs
  (``--config PATH`` adds any other config).

Sizes (``--resolutions``, or its alias ``--sizes``) are square sides (``1024``) or non-square
``WIDTHxHEIGHT``, width first as mmdet writes its scales (``1333x800``); a table's columns go from
the fewest pixels to the most.

With ``--ratios`` it also measures the targets side by side: (1) the time ratio of this toolkit's
XCiT to timm's XCiT plus the plain pyramid at 512 and 1024, timed in turn in one process;
(2) XCiT-S12/16's peak memory at 1600 over 1024 against the pixel ratio, and the ViTs' ratio;
(3) what ``with_cp`` saves in training peak memory at 1024 (fresh processes) and costs in step
time (timed in turn in one process).

``--linearity`` runs only the linearity check (in this process, side by side, ``--repeats``
rounds): XCiT-S12/16's inference time and peak tensor memory growth between the two
``--memory-resolutions`` against the pixel ratio, and its speed-up over timm's XCiT plus the same
pyramid ops; the exit status is 1 when a target is missed. ``--profile-ops`` prints one block's
time per sub-layer and per ATen operator at each of ``--resolutions``, beside timm's block.

Outputs in ``--out-dir``: benchmark.md (also printed), benchmark.csv, benchmark.png, ratios.json.
Runs over ``--max-mem-gb`` or ``--timeout``, after ``--budget-s`` or matching ``--skip`` are
marked skipped. Example (the README has the command of its table)::

    .venv/bin/python -m benchmarks backbones --resolutions 512 1024 1600 --ratios --out-dir work_dirs/benchmark
    .venv/bin/python -m benchmarks backbones --backbones xcit_s12_p16 swin_t --sizes 1333x800 --mode infer
"""
import argparse
import os
from typing import List, Optional

from .catalogue import DEFAULT_MODELS, MODELS
from .measure import DTYPES
from .runs import run_benchmark
from .sizes import Resolution, parse_size


def _size(text: str) -> Resolution:
    """argparse's type of a size: its message names the bad value."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line, checked: known model names, ``backbones`` with the configs appended, ``modes``."""
    parser = argparse.ArgumentParser(prog='python -m benchmarks backbones',
                                     description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--backbones', nargs='+', default=DEFAULT_MODELS, metavar='NAME',
                        help=f'models to measure, of: {", ".join(MODELS)}')
    parser.add_argument('--config', nargs='*', default=[], help='also measure the whole models of these configs')
    parser.add_argument('--resolutions', '--sizes', nargs='+', type=_size, default=[224, 512, 768, 1024, 1280, 1600],
                        metavar='SIZE', help='square sides (1024) or WIDTHxHEIGHT (1333x800)')
    parser.add_argument('--repeats', type=int, default=5, help='timed runs (median reported)')
    parser.add_argument('--warmup', type=int, default=2, help='untimed runs first')
    parser.add_argument('--mode', choices=('infer', 'train', 'both'), default='both')
    parser.add_argument('--dtype', choices=DTYPES, default='fp32', help='fp16/bf16: autocast')
    parser.add_argument('--with-cp', action='store_true', help='activation checkpointing in the backbones')
    parser.add_argument('--channels-last', action='store_true')
    parser.add_argument('--compile', action='store_true', help="torch.compile XCiT's forward")
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--device', default=None, help='cuda or cpu (default: cuda when available)')
    parser.add_argument('--threads', type=int, default=os.cpu_count(), help='CPU threads per run')
    parser.add_argument('--ratios', action='store_true', help='measure the three target ratios too')
    parser.add_argument('--ratio-resolutions', nargs='+', type=int, default=[512, 1024],
                        help='resolutions of the side-by-side XCiT / timm timing')
    parser.add_argument('--memory-resolutions', nargs=2, type=int, default=[1024, 1600], metavar=('LOW', 'HIGH'),
                        help='peak memory at HIGH over LOW against the pixel ratio')
    parser.add_argument('--cp-resolution', type=int, default=1024, help='resolution of the with_cp target')
    parser.add_argument('--slow-s', type=float, default=60,
                        help='a run whose last warm-up took longer than this is timed once')
    parser.add_argument('--pair-repeats', type=int, default=6,
                        help='timed runs of each side of the XCiT / timm ratio (at least --repeats)')
    parser.add_argument('--timeout', type=float, default=600, help='seconds per run before it is skipped')
    parser.add_argument('--max-mem-gb', type=float, default=20, help='memory per run before it is skipped')
    parser.add_argument('--budget-s', type=float, default=0,
                        help='wall-time budget: runs not started by then are marked skipped (0: none)')
    parser.add_argument('--skip', nargs='*', default=[], metavar='MODEL:MODE:RES',
                        help='fnmatch patterns of runs not to attempt, e.g. "vit_s16:train:1600"')
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    parser.add_argument('--linearity', action='store_true',
                        help='only the linearity check: XCiT-S12/16 time and memory growth from LOW to HIGH of '
                             '--memory-resolutions and its speed-up over timm, side by side in this process')
    parser.add_argument('--profile-ops', action='store_true',
                        help="only one block's per-sub-layer and per-operator times against --resolutions, "
                             "this toolkit's beside timm's")
    args = parser.parse_args(argv)
    unknown = [m for m in args.backbones if m not in MODELS]
    if unknown:
        parser.error(f'unknown models {unknown}; choose from {", ".join(MODELS)}')
    if (args.linearity or args.profile_ops) and not all(isinstance(r, int) for r in args.resolutions):
        parser.error('--linearity and --profile-ops take square sizes only')
    args.backbones = list(args.backbones) + list(args.config)
    args.modes = ['infer', 'train'] if args.mode == 'both' else [args.mode]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line and run the benchmark, the linearity check or the profile it asks for."""
    args = parse_args(argv)
    if args.linearity:
        from benchmarks.linearity import linearity_check, summary, verdicts
        low, high = args.memory_resolutions
        result = linearity_check(low=low, high=high, rounds=args.repeats, threads=args.threads)
        print(summary(result))
        return 0 if all(verdicts(result).values()) else 1
    if args.profile_ops:
        from benchmarks.profile_ops import report
        print(report(sorted(args.resolutions), rounds=args.repeats, threads=args.threads))
        return 0
    return run_benchmark(args)

