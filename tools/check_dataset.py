"""Check a config's training and validation data before a run: images found and missing,
annotations, classes against the annotation file, images without annotations, image sizes, and
the bad data (annotations the dataset drops, samples training would skip) counted by kind.
Exits 1 naming what is wrong."""
import argparse
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import DictAction

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.builder import load_config
from xcit_dense.datasets.check import check_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. train_dataloader.dataset.data_root=/data/coco/')
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.cfg_options)  # a palette shorter than the classes: extended
    except ValueError as exc:
        sys.exit(f'error: {exc}')
    reports = check_dataset(cfg)
    for report in reports:
        print('\n'.join(report.lines()))
    problems = [f'{r.split}: {p}' for r in reports for p in r.problems]
    if problems:
        sys.exit('error: ' + '\nerror: '.join(problems))
    print('the data is complete')


if __name__ == '__main__':
    main()
