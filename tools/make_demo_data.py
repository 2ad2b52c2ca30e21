"""Generate the demo datasets (shapes on textured backgrounds) unless they are already there:
COCO-format instances in data/demo_coco and the ADE20K layout in data/demo_ade.

Train and validation sets come from different seeds, so no validation image is seen in training.
"""
import argparse
import json
from pathlib import Path

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set

ROOT = Path(__file__).resolve().parents[1]
COCO_SPLITS = dict(train=(2000, 0), val=(200, 1))            # images, seed
ADE_SPLITS = dict(training=(2000, 2), validation=(200, 3))
SIZE = (128, 128)


def coco_complete(root: Path, splits: dict, size: tuple) -> bool:
    """Every split's annotation file lists the expected number of images of this size, all present."""
    for split, (count, _) in splits.items():
        ann_file = root / 'annotations' / f'instances_{split}.json'
        if not ann_file.is_file():
            return False
        images = json.loads(ann_file.read_text())['images']
        if len(images) != count or not all((im['height'], im['width']) == size
                                           and (root / split / im['file_name']).is_file() for im in images):
            return False
    return True


def ade_complete(root: Path, splits: dict) -> bool:
    """Every split has the expected number of images and label maps."""
    return all(len(list((root / 'images' / split).glob('*.jpg'))) == count
               and len(list((root / 'annotations' / split).glob('*.png'))) == count
               for split, (count, _) in splits.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--out', default=str(ROOT / 'data'), help='folder for demo_coco/ and demo_ade/')
    parser.add_argument('--only', choices=['coco', 'ade'], help='generate one of the two sets')
    parser.add_argument('--num-train', type=int, help='training images per set (default 2000)')
    parser.add_argument('--num-val', type=int, help='validation images per set (default 200)')
    parser.add_argument('--size', type=int, nargs=2, default=SIZE, metavar=('H', 'W'))
    args = parser.parse_args()

    def splits(defaults: dict) -> dict:
        (train, (n_train, s_train)), (val, (n_val, s_val)) = defaults.items()
        return {train: (args.num_train or n_train, s_train), val: (args.num_val or n_val, s_val)}

    out = Path(args.out)
    if args.only in (None, 'coco'):
        root, coco = out / 'demo_coco', splits(COCO_SPLITS)
        if coco_complete(root, coco, tuple(args.size)):
            print(f'[demo data] {root} is complete')
        else:
            for split, (count, seed) in coco.items():
                write_coco_set(root, split, count, size=tuple(args.size), seed=seed, max_objects=5,
                               progress=True)
    if args.only in (None, 'ade'):
        root, ade = out / 'demo_ade', splits(ADE_SPLITS)
        if ade_complete(root, ade):
            print(f'[demo data] {root} is complete')
        else:
            for split, (count, seed) in ade.items():
                write_segmentation_set(root, split, count, size=tuple(args.size), seed=seed,
                                       max_objects=5, progress=True)


if __name__ == '__main__':
    main()
