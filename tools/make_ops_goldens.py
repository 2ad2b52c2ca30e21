"""Write the golden outputs of compiled mmcv's NMS and RoIAlign that the GPU check compares with
(gpu_check/ops_goldens.py), in an environment with compiled mmcv 2.1.0
(XCIT_MMCV=compiled bash tools/install.sh)."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's gpu_check/ (not installed)
from gpu_check import ops_goldens  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--out', type=Path, default=ops_goldens.GOLDENS, help='default: %(default)s')
    args = parser.parse_args()
    goldens = ops_goldens.make_goldens(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB): {goldens['made_with']}")


if __name__ == '__main__':
    main()
