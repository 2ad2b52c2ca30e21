"""Data faults, provoked for real: missing and corrupt images, broken annotation files, empty
images, degenerate boxes and polygons, out-of-range labels, every kind of tests/support/bad_data.py,
decoding bombs under a memory cap, and a SIGTERM inside the bad-sample retry loop."""
import json
import logging
import re
import shutil
import signal
import sys

import numpy as np
import pytest
import torch
from bad_data import (
    ANNOTATION_KINDS,
    HUGE_INT,
    LONG_FILE_NAME,
    SAMPLE_KINDS,
    tiny_det_config,
    write_annotation_attacks,
    write_bad_coco,
    write_bomb_coco,
)
from helpers import ROOT, SUPPORT, launch_env, read_log, run, run_tool_in_process, tiny_seg_config, train_cmd
from mmengine.logging import MMLogger
from mmengine.registry import DefaultScope
from PIL import Image

from xcit_dense.datasets import CheckedCocoDataset, SkipBadSamples, robust
from xcit_dense.datasets.problems import summary


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def seg_copy(tmp_path, seg_data):
    root = tmp_path / 'data'
    shutil.copytree(seg_data, root)
    return root


def train_seg(tmp_path, data_root, max_iters=4):
    config = tiny_seg_config(tmp_path, data_root, train_cfg=dict(max_iters=max_iters, val_interval=max_iters))
    work_dir = tmp_path / 'run'
    proc = run(train_cmd(config, work_dir))
    return proc, work_dir


def test_missing_corrupt_and_mislabelled_samples_are_skipped_and_counted(tmp_path, seg_copy):
    images, labels = seg_copy / 'images' / 'training', seg_copy / 'annotations' / 'training'
    (labels / 'training_00001.png').unlink()  # images are listed from the folder; its label is gone
    (images / 'training_00002.jpg').write_bytes(b'\xff\xd8 this is not a JPEG')
    label = np.array(Image.open(labels / 'training_00003.png'))
    label[0, 0] = 200  # only 4 classes
    Image.fromarray(label).save(labels / 'training_00003.png')
    for split in ('training/training_00004.png', 'validation/validation_00001.png'):  # truncated label maps
        label = seg_copy / 'annotations' / split
        label.write_bytes(label.read_bytes()[:60])
    proc, work_dir = train_seg(tmp_path, seg_copy, max_iters=6)
    log = read_log(work_dir)
    # validation stops at its truncated label map, naming it (before: OSError: image file is truncated)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert (f'error: validation stopped: {seg_copy}/annotations/validation/validation_00001.png: '
            f'unreadable label maps') in proc.stderr
    assert 'training_00004.png (unreadable label maps): OSError: image file is truncated' in log
    assert 'skipping' in log and 'training_00001.png (missing label maps): no such file' in log
    assert 'training_00002.jpg' in log
    assert 'training_00003.png' in log and 'label values [200] outside the 4 classes' in log
    # one warning per skip, numbered 1, 2, ... by the counter; each bad sample is drawn twice by
    # the sampler (12 draws over 8 samples), replacements drawn at random may hit a bad one again
    counts = [int(n) for n in re.findall(r'^.*skipping .*; (\d+) bad sample\(s\) so far in this process: ',
                                         log, re.MULTILINE)]
    assert counts == list(range(1, len(counts) + 1)) and len(counts) >= 6, counts
    for name, path in (('training_00001', 'annotations/training/training_00001.png'),
                       ('training_00002', 'images/training/training_00002.jpg'),
                       ('training_00003', 'annotations/training/training_00003.png')):
        assert len(re.findall(rf'skipping \S*{path} ', log)) >= 2, name
    assert 'Iter(train) [6/6]' in log  # nothing lost: the run went to the end


def coco(tmp_path, anns, images=None):
    root = tmp_path / 'coco'
    (root / 'img').mkdir(parents=True)
    images = images or [dict(id=1, file_name='a.jpg', width=64, height=64),
                        dict(id=2, file_name='b.jpg', width=64, height=64)]
    for image in images:
        Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(root / 'img' / image['file_name'])
    (root / 'ann.json').write_text(json.dumps(dict(
        images=images, annotations=anns, categories=[dict(id=1, name='box')])))
    return root


def ann(id_, image, bbox, polygon=None):
    x, y, w, h = bbox
    return dict(id=id_, image_id=image, category_id=1, bbox=bbox, area=max(w * h, 0), iscrowd=0,
                segmentation=[polygon or [x, y, x + w, y, x + w, y + h, x, y + h]])


def test_degenerate_annotations_are_named_counted_and_dropped(tmp_path):
    root = coco(tmp_path, [
        ann(1, 1, [5, 5, 20, 20]),
        ann(2, 1, [10, 10, 0, 12]),            # zero width
        ann(3, 1, [10, 10, 8, -3]),            # negative height
        ann(4, 1, [30, 30, 10, 10], polygon=[30, 30, 40, 40]),  # a polygon of two points
    ])  # image 2 has no annotations
    records = Collect()
    MMLogger.get_instance('faults_data', log_level='WARNING').addHandler(records)
    dataset = CheckedCocoDataset(data_root=str(root), ann_file='ann.json', data_prefix=dict(img='img/'),
                                 metainfo=dict(classes=('box',)), filter_cfg=dict(filter_empty_gt=True),
                                 pipeline=[])
    text = '\n'.join(r.getMessage() for r in records.records)
    assert len(dataset) == 1 and len(dataset[0]['instances']) == 1
    assert ('ann.json: image a.jpg: skipped 3 annotation(s): 2 boxes of zero or negative size, e.g. annotation 2: '
            'box [10, 10, 0, 12]; 1 polygons with fewer than three points, e.g. annotation 4: a polygon of 2 '
            'point(s)') in text
    assert 'image(s) without usable annotations are not used for training: ' in text and 'coco/img/b.jpg' in text
    assert dataset.problems == {'boxes of zero or negative size': 2,
                                'polygons with fewer than three points': 1,
                                'images without annotations': 1}


def test_annotation_attacks_are_counted_and_named_once_per_image(tmp_path):
    """tests/support/bad_data.py's annotation attacks, 100 of each on one image of a 10,000-character
    name: 400-digit integers in a box and a polygon (before: an OverflowError ended the load) and RLE
    strings of one long number are counted by kind, and the image is named once in one warning
    (before: once per annotation, its name each time) that counts them and shows the first of each."""
    root = tmp_path / 'coco'
    write_annotation_attacks(root, copies=100)
    records, logger = Collect(), MMLogger.get_instance('annotation_attacks', log_level='WARNING')
    logger.addHandler(records)
    try:
        dataset = CheckedCocoDataset(data_root=str(root), ann_file='ann.json', data_prefix=dict(img='img/'),
                                     metainfo=dict(classes=('box',)), pipeline=[])
    finally:
        logger.removeHandler(records)
    assert len(dataset[0]['instances']) == 1
    assert dataset.problems == {'boxes with NaN or infinite values': 100, 'bad RLE masks': 100,
                                'polygons that are not pairs of finite numbers': 100}
    (warning,) = [r.getMessage() for r in records.records if LONG_FILE_NAME in r.getMessage()]
    assert warning.count(LONG_FILE_NAME) == 1 and len(warning) < len(LONG_FILE_NAME) + 600, warning[-700:]
    assert warning.startswith(f'{root}/ann.json: image {LONG_FILE_NAME}: skipped 300 annotation(s): 100 boxes with '
                              f'NaN or infinite values, e.g. annotation 10: box [8, 8, 1000'), warning[-700:]
    assert ('100 bad RLE masks, e.g. annotation 12: RLE counts that do not decode: a number of 20 characters, '
            'more than 7') in warning


def second_category_named_box(data):
    data['categories'].append(dict(id=7, name='box'))


def image_of_a_huge_height(data):
    data['images'][1]['height'] = HUGE_INT


@pytest.mark.parametrize('damage, message', [
    (second_category_named_box, "categories 1 and 7 are both named 'box': give each category a name of its own"),
    (image_of_a_huge_height, rf'image b.jpg \(id 2\) has height 1{"0" * 76}\.\.\., not a positive number of pixels'),
], ids=['categories', 'image_size'])
def test_a_file_of_two_categories_of_one_name_or_an_image_of_no_size_is_refused(tmp_path, damage, message):
    """Two categories named 'box' (ids 1 and 7): mmdet mapped both to labels of their own without a
    word (the second's annotations as a class past the last). An image whose height is a 400-digit
    integer (before: an OverflowError from the polygon check's margin ended the load; pycocotools'
    metric rasterises at that size too). Each refused when the file is read, naming what."""
    root = coco(tmp_path, [ann(1, 1, [5, 5, 20, 20]), ann(2, 2, [5, 5, 20, 20])])
    data = json.loads((root / 'ann.json').read_text())
    damage(data)
    (root / 'ann.json').write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f'^{root}/ann.json: {message}$'):
        CheckedCocoDataset(data_root=str(root), ann_file='ann.json', data_prefix=dict(img='img/'),
                           metainfo=dict(classes=('box',)), pipeline=[])


def test_broken_annotation_file_stops_before_training(tmp_path):
    root = coco(tmp_path, [ann(1, 1, [5, 5, 20, 20])])
    (root / 'ann.json').write_text('{"images": [1, 2')
    config = tmp_path / 'det.py'
    config.write_text(
        f"_base_ = ['{ROOT}/configs/xcit/mask_rcnn_xcit_tiny_12_p16_3x_coco.py']\n"
        f"train_dataloader = dict(dataset=dict(data_root='{root}', ann_file='ann.json', "
        f"data_prefix=dict(img='img/')))\n"
        f"val_dataloader = train_dataloader\n")
    # refused before a Runner is built: run in this process
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', tmp_path / 'run', cwd=tmp_path)
    assert proc.returncode != 0
    assert f'annotation file {root}/ann.json is not valid JSON' in proc.stderr
    assert not (tmp_path / 'run').exists()  # stopped before the Runner started


def test_missing_image_folder_stops_before_training(tmp_path, seg_copy):
    shutil.rmtree(seg_copy / 'images' / 'validation')
    config = tiny_seg_config(tmp_path, seg_copy)  # refused before a Runner is built: run in this process
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', tmp_path / 'run', cwd=tmp_path)
    assert proc.returncode != 0
    assert f'val_dataloader: folder not found: {seg_copy}/images/validation' in proc.stderr


def test_missing_image_of_a_coco_set_is_skipped_and_counted(tmp_path, monkeypatch):
    root = coco(tmp_path, [ann(1, 1, [5, 5, 20, 20]), ann(2, 2, [8, 8, 30, 30])])
    (root / 'img' / 'a.jpg').unlink()
    records = Collect()
    MMLogger.get_instance('faults_data_coco', log_level='WARNING').addHandler(records)
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_mask=True),
                dict(type='PackDetInputs')]
    monkeypatch.setattr(robust, 'random', Scripted([1]))  # a.jpg's replacement: b.jpg
    with DefaultScope.overwrite_default_scope('mmdet'):
        dataset = SkipBadSamples(dict(type='CheckedCocoDataset', data_root=str(root), ann_file='ann.json',
                                      data_prefix=dict(img='img/'), metainfo=dict(classes=('box',)),
                                      pipeline=pipeline))
        samples = [dataset[i] for i in range(len(dataset))]
    assert all(s['data_samples'].img_path.endswith('b.jpg') for s in samples)
    assert dataset.skipped == 1
    text = '\n'.join(r.getMessage() for r in records.records)
    assert 'skipping' in text and 'img/a.jpg' in text


class Scripted:
    """Stands in for the random module of robust.py: replacement indices from a script."""

    def __init__(self, picks):
        self.picks = list(picks)

    def randrange(self, n):
        pick = self.picks.pop(0)
        assert 0 <= pick < n
        return pick


class Flaky:
    """A dataset of `size` samples whose `bad` indices raise; it records every load that failed."""

    metainfo = dict(classes=('a', 'b'))

    def __init__(self, size, bad):
        self.size, self.bad, self.failed = size, set(bad), []

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        if idx in self.bad:
            self.failed.append(idx)
            raise OSError(f'sample {idx} is unreadable')
        return dict(idx=idx)

    def get_data_info(self, idx):
        return dict(sample_idx=idx)  # no files: only the loading itself fails


def test_skip_count_is_exact_even_when_a_replacement_is_bad(monkeypatch):
    """Sample 1 is bad and so is its first replacement (2); sample 2 is bad, replaced by 3: three skips."""
    flaky = Flaky(5, bad={1, 2})
    monkeypatch.setattr(robust, 'random', Scripted([2, 0, 3]))
    dataset = SkipBadSamples(flaky)
    assert [dataset[i]['idx'] for i in range(5)] == [0, 0, 3, 3, 4]
    assert flaky.failed == [1, 2, 2]
    assert dataset.skipped == 3


def test_skip_gives_up_after_max_tries_counting_every_try(monkeypatch):
    flaky = Flaky(3, bad={0, 1, 2})
    monkeypatch.setattr(robust, 'random', Scripted([1, 2, 0, 1]))
    dataset = SkipBadSamples(flaky, max_tries=4)
    with pytest.raises(RuntimeError, match='4 samples in a row could not be loaded'):
        dataset[0]
    assert dataset.skipped == len(flaky.failed) == 4


# with a worker: the slow stage (a launched run, about 11 s); the main stage keeps the same stop from the
# retry loop in this process's loading (workers=0)
@pytest.mark.parametrize('workers', [0, pytest.param(1, marks=pytest.mark.slow)])
def test_sigterm_in_the_bad_sample_retry_loop_stops_at_once_with_the_last_checkpoint(tmp_path, seg_data, workers):
    """Two good samples (iteration 1), then only bad ones: SIGTERM comes from inside the retry loop (in
    this process, or from a DataLoader worker while the main process waits for the batch). Before the
    fix the signal waited for the next iteration boundary, which never came (100 failed tries, rc 1)."""
    work_dir, sent = tmp_path / 'run', tmp_path / 'signal_sent'
    retries = dict(type='SignalFromRetries', good=2, signal_at=3, signal_sent=str(sent),
                   wait_for=str(work_dir / 'iter_1.done') if workers else None)
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), retries, dict(type='PackSegInputs')]
    config = tiny_seg_config(
        tmp_path, seg_data, custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=[dict(type='MarkIterDoneHook')], train_cfg=dict(max_iters=4, val_interval=100),
        default_hooks=dict(checkpoint=dict(interval=100), logger=dict(interval=1), visualization=dict(draw=False)))
    text = config.read_text().replace("'batch_size': 2, 'num_workers': 0, 'persistent_workers': False",
                                      f"'batch_size': 2, 'num_workers': {workers}, 'persistent_workers': False", 1)
    assert f"'num_workers': {workers}," in text
    config.write_text(text + f"train_dataloader['dataset']['pipeline'] = {pipeline!r}\n")
    proc = run(train_cmd(config, work_dir), timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    if not workers:  # at once: no try after the signal in this process (the retry loop allows 100)
        assert sent.read_text() == '', sent.read_text()
    # with a worker, waiting for its batch would mean its 100 tries, then rc 1 (a worker goes on trying
    # until the stopping process ends it, so its tries tell nothing of the stop)
    log = read_log(work_dir)
    assert 'SIGTERM received: saving a checkpoint at iteration 1' in log
    assert f'checkpoint saved: {work_dir / "iter_1.pth"}; stopping (--resume continues the run)' in log
    checkpoint = torch.load(work_dir / 'iter_1.pth', weights_only=False)
    assert checkpoint['meta']['iter'] == 1 and 'state_dict' in checkpoint
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_1.pth')


def test_every_kind_of_bad_data_is_skipped_in_training_and_stops_validation(tmp_path):
    """The set of tests/support/bad_data.py: one iteration over all its images (each bad one skipped, counted by
    kind), then a validation that stops at the first bad image, naming it, without a traceback."""
    root = tmp_path / 'coco'
    write_bad_coco(root)
    proc = run(train_cmd(tiny_det_config(tmp_path, root), tmp_path / 'run'), timeout=300)
    log = read_log(tmp_path / 'run')
    assert 'Iter(train) [1/1]' in log, proc.stderr[-3000:]
    dropped = re.search(r'ann\.json: skipped (.*)$', log, re.MULTILINE).group(1)
    assert dropped == summary(ANNOTATION_KINDS)
    skipped = re.findall(r'skipping (\S+) \(([^)]+)\): ', log)
    assert {kind for _, kind in skipped} == set(SAMPLE_KINDS)
    assert {path for path, _ in skipped} == {str(root / 'img' / name) for name in
                                             ('garbage.jpg', 'truncated.png', 'bomb.png', '../outside.jpg')} | {
        str(tmp_path / 'outside.jpg')}
    last = re.findall(r'(\d+) bad sample\(s\) so far in this process: (.*)$', log, re.MULTILINE)[-1]
    assert int(last[0]) == len(skipped) and all(kind in last[1] for kind in SAMPLE_KINDS)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert f'error: validation stopped: {root}/img/garbage.jpg: unreadable images' in proc.stderr


def test_decoding_bombs_are_refused_before_decoding_under_a_memory_cap(tmp_path):
    """An RLE mask and a PNG header declaring 262144^2 pixels (64 GiB a mask, 192 GiB an image), an HDR
    image of 12000^2 pixels (a format PIL does not read: before, OpenCV decoded it under its own 2^30
    limit) and a polygon of 4e8 pixels' extent (before, pycocotools' rasteriser failed its allocation
    and the process died with a segfault) go through the real mmdet datasets and pipeline in a
    process whose address space is capped at its size + 1 GiB: each is refused, by kind, before
    anything is allocated for it, and no temporary file is left behind. The validation datasets (test_mode) keep the
    polygon for the
    sample check to stop at."""
    root = tmp_path / 'coco'
    write_bomb_coco(root)
    opencv_temp = tmp_path / 'opencv_temp'  # where OpenCV's decoders that need a file copy a buffer
    opencv_temp.mkdir()
    proc = run([sys.executable, str(SUPPORT / 'capped_load.py'), str(root)], timeout=300,
               env=launch_env(OPENCV_TEMP_PATH=opencv_temp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(opencv_temp.iterdir())  # the refused HDR image left no copy behind
    results = json.loads(proc.stdout.splitlines()[-1])
    # CheckedCocoDataset drops the bomb when it reads the file; behind a plain CocoDataset, the sample
    # guard refuses the image against the real image's size
    refused = {'bomb.png': 'images over the pixel limit', 'bomb.hdr': 'images over the pixel limit',
               'poly.jpg': 'polygons reaching far outside the image'}
    assert results['checked'] == {'dropped': {'bad RLE masks': 1}, 'good.jpg': 'loaded', **refused}
    assert results['plain'] == {'good.jpg': 'bad RLE masks', **refused}
