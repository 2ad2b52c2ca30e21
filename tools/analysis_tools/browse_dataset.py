"""Draw N random training samples as the model sees them (after the config's augmentation
pipeline, ground truth drawn) into a folder, with a mosaic of all of them."""
import argparse
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import DictAction

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.builder import load_config
from xcit_dense.datasets.browse import browse_training_samples
from xcit_dense.errors import UnsafeOutputError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config')
    parser.add_argument('--num', type=int, default=16, help='how many samples (default 16)')
    parser.add_argument('--out-dir', default='browse', help='where the drawings go (default ./browse)')
    parser.add_argument('--seed', type=int, default=0, help='which samples are drawn')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. train_dataloader.dataset.data_root=/data/coco/')
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.cfg_options)  # a palette shorter than the classes: extended
    except ValueError as exc:
        sys.exit(f'error: {exc}')
    try:
        drawn = browse_training_samples(cfg, args.num, args.out_dir, args.seed)
    except UnsafeOutputError as exc:  # at the mosaic's name (a sample's is reported, the others drawn)
        sys.exit(f'error: {exc}')
    print(f'{len(drawn)} samples drawn into {args.out_dir} (mosaic.jpg shows them all)')


if __name__ == '__main__':
    main()
