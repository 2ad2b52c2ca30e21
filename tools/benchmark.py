"""Speed and peak memory of XCiT and the backbones users would pick instead, against image size.

The command line of ``benchmarks.cli`` (``--help`` and that module's docstring give the
options). Example::

    .venv/bin/python tools/benchmark.py --resolutions 512 1024 1600 --ratios --out-dir work_dirs/benchmark
    .venv/bin/python tools/benchmark.py --backbones xcit_s12_p16 swin_t --sizes 1333x800 --mode infer
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the checkout's, not installed
from benchmarks.cli import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
