"""The prepared GPU check: mmcv's CUDA ops against the CPU ops, training iterations of Mask R-CNN
(XCiT-S12/16, Swin-T) and UperNet in fp32/fp16/bf16, a one-process launched run, torch.compile
of the backbone and the benchmark; results in OUT_DIR/gpu_check.{json,md}, written step by step.
Exits 1 when a step failed: it raised, was cut at its budget, or its results say so.

  python tools/gpu_check.py --out-dir work_dirs/gpu_check            # on a GPU machine
  python tools/gpu_check.py --device cpu --tiny --out-dir /tmp/check  # every step, tiny, on a CPU
  python tools/gpu_check.py --out-dir DIR --budget det_train=120 benchmark=60   # seconds per step
"""
import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from xcit_dense.benchmark.gpu_check import STEPS, failed_steps, run_check
from xcit_dense.engine import check_mmcv_cuda_arch


def parse_budgets(items: List[str]) -> Dict[str, float]:
    """--budget STEP=SECONDS ... as a dict; SystemExit naming a bad item."""
    budgets = {}
    for item in items:
        step, _, seconds = item.partition('=')
        try:
            if step not in STEPS or float(seconds) <= 0:
                raise ValueError
        except ValueError:
            sys.exit(f'error: --budget {item!r}: expected STEP=SECONDS with STEP one of {", ".join(STEPS)}')
        budgets[step] = float(seconds)
    return budgets


def main(argv: Optional[List[str]] = None) -> int:
    """Run the check; return its exit status (1 when a step failed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out-dir', type=Path, required=True)
    parser.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    parser.add_argument('--tiny', action='store_true', help='tiny models and sizes (for a CPU, or a quick look)')
    parser.add_argument('--steps', nargs='+', choices=STEPS, help='only these steps (default: all)')
    parser.add_argument('--budget', nargs='+', default=[], metavar='STEP=SECONDS',
                        help='cut a step past this many seconds (it then fails)')
    args = parser.parse_args(argv)
    budgets = parse_budgets(args.budget)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        sys.exit('error: no CUDA device is visible: run on a GPU machine, or pass --device cpu --tiny')
    if device.type == 'cuda':
        try:
            check_mmcv_cuda_arch()
        except RuntimeError as exc:
            sys.exit(f'error: {exc}')
    data = run_check(device, args.tiny, args.out_dir, args.steps, budgets=budgets)
    failed = failed_steps(data)
    print(f'[gpu_check] results: {args.out_dir / "gpu_check.md"}')
    if failed:
        print(f'error: steps failed: {", ".join(failed)}', file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
