"""Find or compile an mmcv wheel with its ops for the installed torch (xcit_launch/mmcv_build.py).

Run by tools/install.sh before the package is installed: prints the wheel to install on stdout.
  python tools/misc/build_mmcv.py --version 2.1.0 --cache ~/.cache/xcit-dense [--check]
      [--sdist F --offline --ops nms,roi_align]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's xcit_launch, installed or not
from xcit_launch.mmcv_build import main  # noqa: E402

if __name__ == '__main__':
    main()
