"""The prepared GPU check: the installed mmcv ops against compiled mmcv's golden outputs, then the
toolkit's own commands (dist_train.sh with --amp fp16 and bf16, SyncBN, accumulation, validation,
--resume; mmdet's train.py --resume; channels_last; the backbone compiled in training), each
judged by what its log must show; results in OUT_DIR/gpu_check.{json,md}, written step by step.
Exits 1 when a step failed: it raised, was cut at its budget, or its log lacked what it must show.

  python tools/misc/gpu_check.py --out-dir work_dirs/gpu_check --gpu-budgets   # on a GPU machine
  python tools/misc/gpu_check.py --device cpu --tiny --out-dir /tmp/check      # every step, tiny, on a CPU
  python tools/misc/gpu_check.py --out-dir DIR --steps ops det_fp16 --budget det_fp16=120

The check is gpu_check/machine_check.py in this checkout (not part of the installed package).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's gpu_check/ (not installed)
from gpu_check.machine_check import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
