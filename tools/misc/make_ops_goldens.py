"""Write the golden outputs the GPU check compares the installed mmcv ops with.

  python tools/misc/make_ops_goldens.py                          # NMS and RoIAlign, compiled mmcv on the CPU
  python tools/misc/make_ops_goldens.py --served-ops             # the other served ops, compiled mmcv on a GPU
  python tools/misc/make_ops_goldens.py --served-ops --reference # the same from the float64 CPU reference

The first two need compiled mmcv 2.1.0 (XCIT_MMCV=compiled bash tools/install.sh); see
gpu_check/ops_goldens.py and gpu_check/served_ops_goldens.py for what each file holds and its source.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's gpu_check/ (not installed)
from gpu_check import ops_goldens, served_ops_goldens  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--served-ops', action='store_true',
                        help='the ops xcit_mmcv_ext serves beyond NMS and RoIAlign (served_ops_goldens.pt)')
    parser.add_argument('--reference', action='store_true',
                        help='with --served-ops: the float64 CPU reference of mmcv 2.1.0 semantics, no compiled mmcv')
    parser.add_argument('--device', default='cuda', help='with --served-ops: where compiled mmcv runs (default cuda)')
    parser.add_argument('--out', type=Path, help='default: the file beside its module in gpu_check/')
    args = parser.parse_args()
    if args.reference and not args.served_ops:
        parser.error('--reference goes with --served-ops')
    if args.served_ops:
        out = args.out or served_ops_goldens.GOLDENS
        goldens = (served_ops_goldens.make_reference_goldens(out) if args.reference
                   else served_ops_goldens.make_goldens(out, args.device))
        what = goldens['source']
    else:
        out = args.out or ops_goldens.GOLDENS
        what = ops_goldens.make_goldens(out)['made_with']
    print(f'wrote {out} ({out.stat().st_size / 1e6:.2f} MB): {what}')


if __name__ == '__main__':
    main()
