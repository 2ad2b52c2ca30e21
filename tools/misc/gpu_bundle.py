"""Gather, here where the network is, what a lent GPU machine (no network) lacks for the GPU check
(gpu_check/bundle.py).

  python tools/misc/gpu_bundle.py                       # .gpu_bundle/ (git-ignored), for Python 3.12
  python tools/misc/gpu_bundle.py --python-version 3.11 --out /tmp/bundle311   # a rehearsal on this Python
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's gpu_check/
from gpu_check.bundle import main  # noqa: E402

if __name__ == '__main__':
    main()
