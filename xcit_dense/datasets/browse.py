"""Training samples as the model sees them: after the config's augmentation pipeline, with their
ground truth drawn, one image per sample and a mosaic of all.

mmdet's browse_dataset.py draws every sample of the set (118k for COCO) and no mosaic; mmseg
1.2.2's fails under OpenCV 5 (cv2.rectangle refuses the non-contiguous image it passes). This
draws N random ones of either; a sample that cannot be drawn is reported, and the others drawn.
"""
import logging
import math
import random
from pathlib import Path
from typing import List

import numpy as np
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import DATASETS, VISUALIZERS, init_default_scope
from PIL import Image

from ..io.output_files import writing
from ..pictures import draw_picture

MAX_CELL = 256  # the mosaic's largest cell side in pixels


def _drawable(data_sample):
    """The data sample with detection ground truth in the types the visualizer draws."""
    gt = data_sample.get('gt_instances')
    if gt is None:
        return data_sample
    from mmdet.models.utils import mask2ndarray
    from mmdet.structures.bbox import BaseBoxes
    data_sample = data_sample.numpy()
    gt = data_sample.gt_instances
    if isinstance(gt.get('bboxes'), BaseBoxes):
        gt.bboxes = gt.bboxes.tensor
    if gt.get('masks') is not None:
        gt.masks = mask2ndarray(gt.masks).astype(bool)
    return data_sample


def mosaic(paths: List[Path], out_file: Path) -> Path:
    """Tile the images in a square-ish grid of cells the size of the largest one (at most MAX_CELL a
    side: larger ones are fitted, aspect kept), so that small samples fill their cells."""
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    cell_w, cell_h = (min(MAX_CELL, max(size[i] for size in sizes)) for i in (0, 1))
    columns = math.ceil(math.sqrt(len(paths)))
    rows = math.ceil(len(paths) / columns)
    canvas = Image.new('RGB', (columns * cell_w, rows * cell_h), (255, 255, 255))
    for i, path in enumerate(paths):
        with Image.open(path) as image:
            image.thumbnail((cell_w, cell_h))
            canvas.paste(image, ((i % columns) * cell_w, (i // columns) * cell_h))
    with writing(out_file) as path:  # a link at its name refused
        canvas.save(path)
    return out_file


def browse_training_samples(cfg: Config, num: int, out_dir: str, seed: int = 0) -> List[Path]:
    """Draw ``num`` random training samples after the pipeline into ``out_dir``, plus mosaic.jpg;
    returns the drawn files."""
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    visualizer = VISUALIZERS.build(dict(cfg.visualizer, name='browse_training_samples', vis_backends=[]))
    visualizer.dataset_meta = dataset.metainfo
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = []
    for index in random.Random(seed).sample(range(len(dataset)), min(num, len(dataset))):
        item = dataset[index]
        image = np.ascontiguousarray(item['inputs'].permute(1, 2, 0).numpy()[..., ::-1])  # BGR -> RGB
        data_sample = _drawable(item['data_samples'])
        path = out / f'{index:06d}_{Path(data_sample.img_path).stem}.jpg'
        not_drawn = draw_picture(visualizer, image, data_sample, str(path), draw_pred=False)
        if not_drawn:
            print_log(not_drawn, logger='current', level=logging.WARNING)
        else:
            drawn.append(path)
    if drawn:
        mosaic(drawn, out / 'mosaic.jpg')
    return drawn
