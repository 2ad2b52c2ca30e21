"""The prepared GPU check: mmcv's CUDA ops against the CPU ops, training iterations of Mask R-CNN
(XCiT-S12/16, Swin-T) and UperNet in fp32/fp16/bf16, a one-process launched run, torch.compile
of the backbone and the benchmark; results in OUT_DIR/gpu_check.{json,md}, written step by step.
Exits 1 when a step failed: it raised, was cut at its budget, or its results say so.

  python tools/gpu_check.py --out-dir work_dirs/gpu_check            # on a GPU machine
  python tools/gpu_check.py --device cpu --tiny --out-dir /tmp/check  # every step, tiny, on a CPU
  python tools/gpu_check.py --out-dir DIR --budget det_train=120 benchmark=60   # seconds per step

The check is xcit_dense/acceptance/gpu_check.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the checkout's, not installed
from xcit_dense.acceptance.gpu_check import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
