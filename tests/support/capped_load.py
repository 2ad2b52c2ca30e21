"""Load the decoding bombs of tests/support/bad_data.py (write_bomb_coco) through the real mmdet datasets and pipeline,
in this
process with its address space capped at its size after the imports + 1 GiB; prints one JSON line:
per dataset class, what each image became ('loaded' or the kind it was refused as).

Run by tests/integration/test_faults_data.py as ``python capped_load.py COCO_ROOT``."""
import json
import resource
import sys

from mmengine.registry import DATASETS, DefaultScope

import xcit_dense  # noqa: F401  (registers the wrappers and CheckedCocoDataset)
from xcit_dense.datasets.problems import BadSample
from xcit_dense.datasets.robust import StopOnBadSamples

PIPELINE = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs')]


def cap_address_space(extra: int = 1 << 30) -> None:
    """RLIMIT_AS at the current virtual size + ``extra`` bytes: an allocation of gigabytes fails at once."""
    with open('/proc/self/statm') as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))


def main(root: str) -> None:
    with DefaultScope.overwrite_default_scope('mmdet'):
        datasets = {name: StopOnBadSamples(DATASETS.build(dict(
            type=kind, data_root=root, ann_file='ann.json', data_prefix=dict(img='img/'),
            metainfo=dict(classes=('box',)), test_mode=True, pipeline=PIPELINE)))
            for name, kind in (('checked', 'CheckedCocoDataset'), ('plain', 'CocoDataset'))}
        cap_address_space()
        results = {}
        for name, dataset in datasets.items():
            result = results[name] = {}
            if getattr(dataset, 'problems', None):
                result['dropped'] = {k: v for k, v in dataset.problems.items() if k == 'bad RLE masks'}
            for idx in range(len(dataset)):
                image = dataset.get_data_info(idx)['img_path'].rsplit('/', 1)[-1]
                try:
                    dataset[idx]
                    result[image] = 'loaded'
                except BadSample as bad:
                    result[image] = bad.kind
    print(json.dumps(results))


if __name__ == '__main__':
    main(sys.argv[1])
