"""The GPU check as one call on a lent machine without network (gpu_check/device_check.py; run by
the machine's own python3, which holds torch, before anything is installed).

  python3 tools/misc/gpu_device_check.py --bundle .gpu_bundle --out "$OUT"              # on the GPU machine
  python3 tools/misc/gpu_device_check.py --bundle B --out O --device cpu --tiny --deadline-s 1800  # rehearsal
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's gpu_check/ (standard library only)
from gpu_check.device_check import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
