"""Print the GFLOPs (multiply-adds) and parameters of a config's model, whole and per part.

With ``--timm``, CONFIG is a timm model name (e.g. xcit_small_12_p16_224): the ImageNet
classifier, counted the same way. See docs/analysis.md for the counting convention.
"""
import argparse

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import DictAction

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.analysis.flops import analyse_classifier, analyse_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config', help='config file, or a timm model name with --timm')
    parser.add_argument('--shape', type=int, nargs=2, default=[800, 1280], metavar=('H', 'W'),
                        help='input height and width (default 800 1280)')
    parser.add_argument('--timm', action='store_true', help='CONFIG names a timm XCiT classifier')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config values')
    args = parser.parse_args()
    if args.timm:
        result = analyse_classifier(args.config, args.shape)
    else:
        result = analyse_config(args.config, args.shape, args.cfg_options)
    print(f'{args.config} at {args.shape[0]}x{args.shape[1]} (one multiply-add = one FLOP)')
    print(result.table())
    print('not counted (element-wise and other ops): '
          + ', '.join(f'{op} x{n}' for op, n in sorted(result.skipped.items())))


if __name__ == '__main__':
    main()
