"""Write the golden outputs of compiled mmcv's NMS and RoIAlign that the GPU check compares with
(xcit_dense/acceptance/ops_goldens.py), in an environment with compiled mmcv 2.1.0
(XCIT_MMCV=compiled bash tools/install.sh)."""
import argparse
from pathlib import Path

from xcit_dense.acceptance import ops_goldens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--out', type=Path, default=ops_goldens.GOLDENS, help='default: %(default)s')
    args = parser.parse_args()
    goldens = ops_goldens.make_goldens(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB): {goldens['made_with']}")


if __name__ == '__main__':
    main()
