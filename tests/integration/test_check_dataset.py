"""tools/check_dataset.py: the right counts on the demo sets; a missing image folder, a missing
annotation file, a corrupt JSON and classes that differ from the file's categories are named; every
kind of bad data (tests/support/bad_data.py, a truncated label map) is counted."""
import json
import runpy
import shutil
import sys

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import TRANSFORMS, DefaultScope
from PIL import Image

from bad_data import ANNOTATION_KINDS, SAMPLE_KINDS, write_bad_coco, write_bomb_coco
from helpers import ROOT
from xcit_dense.datasets.check import check_dataset
from xcit_dense.datasets.files import check_image_file
from xcit_dense.datasets.problems import BadSample, summary
from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set

DET_CONFIG = str(ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py')
SEG_CONFIG = str(ROOT / 'configs/demo/upernet_xcit_tiny_12_p16_demo.py')


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo_coco')
    write_coco_set(root, 'train', 4, size=(64, 64), seed=0)
    write_coco_set(root, 'val', 2, size=(48, 64), seed=1)
    return root


def det_options(root) -> dict:
    return {'train_dataloader.dataset.data_root': f'{root}/', 'val_dataloader.dataset.data_root': f'{root}/',
            'val_evaluator.ann_file': f'{root}/annotations/instances_val.json'}


def det_config(root, **options) -> Config:
    cfg = Config.fromfile(DET_CONFIG)
    cfg.merge_from_dict(dict(det_options(root), **options))
    return cfg


def check_tool(config: str, options: dict, capsys) -> str:
    """Run tools/check_dataset.py in this process; returns its message, raises if it exited 0."""
    argv = ['check_dataset.py', config, '--cfg-options', *(f'{k}={v}' for k, v in options.items())]
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.setattr(sys, 'argv', argv)
        runpy.run_path(str(ROOT / 'tools/check_dataset.py'), run_name='__main__')
    assert exit_info.value.code not in (0, None)
    return str(exit_info.value.code) + capsys.readouterr().out


def test_counts_on_the_demo_sets(coco, tmp_path):
    train, val = check_dataset(det_config(coco))
    for report, split in ((train, 'train'), (val, 'val')):
        ann = json.loads((coco / f'annotations/instances_{split}.json').read_text())
        assert report.images == len(ann['images']) and not report.missing_images
        assert report.annotations == len(ann['annotations'])
        assert report.classes == report.file_classes == ('rectangle', 'ellipse', 'triangle')
        assert not report.problems
    assert '  image sizes (h x w): min 48x64, median 48x64, max 48x64' in val.lines()
    write_segmentation_set(tmp_path, 'training', 3, size=(64, 64), seed=0)
    write_segmentation_set(tmp_path, 'validation', 2, size=(64, 64), seed=1)
    (tmp_path / 'annotations/validation/validation_00001.png').unlink()
    label = tmp_path / 'annotations/training/training_00002.png'
    label.write_bytes(label.read_bytes()[:60])  # truncated: PIL reads its header, not its pixels
    label = tmp_path / 'annotations/training/training_00001.png'
    values = np.array(Image.open(label))
    values[0, 0] = 200  # 4 classes: found only when training loaded it, before
    Image.fromarray(values).save(label)
    label = tmp_path / 'annotations/validation/validation_00000.png'
    Image.open(label).resize((32, 32), Image.NEAREST).save(label)  # accepted everywhere, before
    cfg = Config.fromfile(SEG_CONFIG)
    cfg.merge_from_dict({'train_dataloader.dataset.data_root': str(tmp_path),
                         'val_dataloader.dataset.data_root': str(tmp_path)})
    train, val = check_dataset(cfg)
    assert (train.images, train.annotations, train.without_annotations) == (3, 3, 0)
    assert (val.images, val.annotations, val.without_annotations) == (2, 1, 1)
    assert train.bad_kinds == {'unreadable label maps': 1, 'label values outside the classes': 1}
    assert 'training_00001.png: label values [200] outside the 4 classes' in train.bad_examples[
        'label values outside the classes']
    assert val.bad_kinds == {'missing label maps': 1, 'label maps of another size than their image': 1}
    assert '32x32 pixels, its image ' in val.bad_examples['label maps of another size than their image']


def test_a_broken_copy_is_named(coco, tmp_path, capsys):
    broken = tmp_path / 'broken'
    shutil.copytree(coco, broken)
    shutil.rmtree(broken / 'val')
    message = check_tool(DET_CONFIG, det_options(broken), capsys)
    assert f'val: val_dataloader: folder not found: {broken}/val/' in message
    assert 'images: 4 found, 0 missing' in message  # the training split is still reported
    (broken / 'val').mkdir()
    message = check_tool(DET_CONFIG, det_options(broken), capsys)
    assert f'val: 2 image(s) not found, e.g. {broken}/val/val_00000.jpg' in message

    (broken / 'annotations/instances_train.json').unlink()
    message = check_tool(DET_CONFIG, det_options(broken), capsys)
    assert f'annotation file not found: {broken}/annotations/instances_train.json' in message
    assert 'see README: Datasets' in message

    (broken / 'annotations/instances_train.json').write_text('{"images": [')
    message = check_tool(DET_CONFIG, det_options(broken), capsys)
    assert f'annotation file {broken}/annotations/instances_train.json is not valid JSON' in message


def test_classes_that_differ_from_the_annotation_file(coco, capsys):
    classes = '(rectangle,ellipse,hexagon)'
    options = {**det_options(coco), 'train_dataloader.dataset.metainfo.classes': classes}
    message = check_tool(DET_CONFIG, options, capsys)
    assert "only in the config ['hexagon'], only in the file ['triangle']" in message


def test_every_kind_of_bad_data_is_named_and_counted(tmp_path, capsys):
    """The set of tests/support/bad_data.py: each kind with its count, a non-zero exit, no traceback (before,
    the string box crashed it with a TypeError and the rest passed as 'the data is complete')."""
    root = tmp_path / 'coco'
    write_bad_coco(root)
    options = {**det_options(root), 'val_evaluator.ann_file': f'{root}/ann.json'}
    for split in ('train', 'val'):
        options.update({f'{split}_dataloader.dataset.ann_file': 'ann.json',
                        f'{split}_dataloader.dataset.data_prefix.img': 'img/',
                        f'{split}_dataloader.dataset.metainfo.classes': '(box,)'})
    message = check_tool(DET_CONFIG, options, capsys)
    for kind, count in {**ANNOTATION_KINDS, **SAMPLE_KINDS}.items():
        assert f'  {kind}: {count}, e.g. ' in message, kind
    assert f'error: train: bad data: {summary({**ANNOTATION_KINDS, **SAMPLE_KINDS})}' in message
    assert 'the data is complete' not in message


def test_exif_orientation_is_ignored_by_the_check_and_the_pipelines(coco, tmp_path):
    """A 64x48 JPEG whose EXIF says 'rotate 90': the annotations are drawn on the stored pixels, so the
    check's sizes, the configs' pipelines and tools/infer.py's decoder all take it as stored (before,
    OpenCV rotated the image to 48x64 in training and inference, not its boxes)."""
    from xcit_dense.datasets.files import decode_image
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    path = tmp_path / 'rotated.jpg'
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(path, exif=exif)
    assert decode_image(str(path)).shape == (48, 64, 3)
    for config in (DET_CONFIG, SEG_CONFIG, str(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py'),
                   str(ROOT / 'configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py')):
        cfg = Config.fromfile(config)
        for pipeline in (cfg.train_dataloader.dataset.pipeline, cfg.test_dataloader.dataset.pipeline):
            with DefaultScope.overwrite_default_scope(cfg.default_scope):
                load = TRANSFORMS.build(pipeline[0])
            assert load(dict(img_path=str(path)))['img'].shape == (48, 64, 3), config


def test_bombs_of_every_decoder_are_named_in_both_splits(tmp_path):
    """tests/support/bad_data.py's bombs: the polygon far outside its image is dropped from training and
    stops validation at its image; the HDR image over the limit, which PIL cannot read, is named as over
    the limit by OpenCV (before: 'unreadable', while training decoded it)."""
    root = tmp_path / 'coco'
    write_bomb_coco(root)
    options = {'val_evaluator.ann_file': f'{root}/ann.json'}
    for split in ('train', 'val'):
        options.update({f'{split}_dataloader.dataset.data_root': f'{root}/',
                        f'{split}_dataloader.dataset.ann_file': 'ann.json',
                        f'{split}_dataloader.dataset.data_prefix.img': 'img/',
                        f'{split}_dataloader.dataset.metainfo.classes': ('box',)})
    cfg = Config.fromfile(DET_CONFIG)
    cfg.merge_from_dict(options)
    train, val = check_dataset(cfg)
    expected = {'bad RLE masks': 1, 'images over the pixel limit': 2, 'polygons reaching far outside the image': 1}
    assert train.bad_kinds == val.bad_kinds == expected
    assert train.bad_examples['polygons reaching far outside the image'].startswith('image poly.jpg annotation 6')
    assert val.bad_examples['polygons reaching far outside the image'].startswith(f'{root}/img/poly.jpg: ')
    with pytest.raises(BadSample, match='over the limit of OpenCV, which decodes it: 134217728 pixels '
                                        r'\(OPENCV_IO_MAX_IMAGE_PIXELS\)'):
        check_image_file(str(root / 'img/bomb.hdr'), decode=True)
