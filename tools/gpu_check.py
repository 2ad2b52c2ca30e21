"""The prepared GPU check: mmcv's CUDA ops against the CPU ops, training iterations of Mask R-CNN
(XCiT-S12/16, Swin-T) and UperNet in fp32/fp16/bf16, the benchmark, torch.compile of the backbone
and a one-process launched run; results in OUT_DIR/gpu_check.{json,md}, written step by step.

  python tools/gpu_check.py --out-dir work_dirs/gpu_check            # on a GPU machine
  python tools/gpu_check.py --device cpu --tiny --out-dir /tmp/check  # every step, tiny, on a CPU
"""
import argparse
import sys
from pathlib import Path

import torch

from xcit_dense.benchmark.gpu_check import run_check
from xcit_dense.engine import check_mmcv_cuda_arch

STEPS = ['ops', 'det_train', 'seg_train', 'benchmark', 'compile', 'launch']


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out-dir', type=Path, required=True)
    parser.add_argument('--device', default='cuda', help='cuda (default) or cpu')
    parser.add_argument('--tiny', action='store_true', help='tiny models and sizes (for a CPU, or a quick look)')
    parser.add_argument('--steps', nargs='+', choices=STEPS, help='only these steps (default: all)')
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        sys.exit('error: no CUDA device is visible: run on a GPU machine, or pass --device cpu --tiny')
    if device.type == 'cuda':
        try:
            check_mmcv_cuda_arch()
        except RuntimeError as exc:
            sys.exit(f'error: {exc}')
    data = run_check(device, args.tiny, args.out_dir, args.steps)
    failed = [step for step, result in data['steps'].items() if 'error' in result]
    print(f'[gpu_check] results: {args.out_dir / "gpu_check.md"}')
    sys.exit(f'error: steps failed: {", ".join(failed)}' if failed else 0)


if __name__ == '__main__':
    main()
