"""tools/browse_dataset.py's library: N training samples after the pipeline, drawn, and a mosaic."""
from mmengine.config import Config
from PIL import Image

from helpers import ROOT
from xcit_dense.datasets.browse import CELL, browse_training_samples
from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set


def test_samples_after_the_pipeline_and_a_mosaic(tmp_path):
    write_coco_set(tmp_path / 'coco', 'train', 4, size=(64, 64), seed=0)
    write_segmentation_set(tmp_path / 'ade', 'training', 2, size=(64, 64), seed=0)
    for name, data in (('mask_rcnn', 'coco'), ('upernet', 'ade')):
        cfg = Config.fromfile(str(ROOT / f'configs/demo/{name}_xcit_tiny_12_p16_demo.py'))
        cfg.merge_from_dict({'train_dataloader.dataset.data_root': f'{tmp_path / data}/'})
        drawn = browse_training_samples(cfg, 3, tmp_path / name)
        assert len(drawn) == min(3, len(list((tmp_path / data).rglob('*.jpg'))))
        for path in drawn:
            with Image.open(path) as image:
                assert image.size == (128, 128)  # the demo pipeline resizes the 64 px images to 128
        with Image.open(tmp_path / name / 'mosaic.jpg') as image:
            assert image.size == (2 * CELL, 2 * CELL if len(drawn) > 2 else CELL)
