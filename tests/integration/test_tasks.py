"""The task table: a segmentation run never imports mmdet, and mmdet's and mmseg's stock
inferencers predict from this toolkit's configs and checkpoints."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, run_tool_in_process, tiny_seg_config
from mmengine.config import Config

from xcit_dense.datasets.synthetic import make_scene, write_coco_set
from xcit_dense.inference import build_inferencer, predict_image
from xcit_dense.io.checkpoint import read_checkpoint_file
from xcit_dense.io.weights import CheckpointError
from xcit_dense.tasks import DETECTION, SEGMENTATION, task_of_config, task_of_state

UPERNET = ROOT / 'configs/xcit/upernet_xcit_tiny_12_p16_160k_ade20k.py'
DET_DEMO = ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'

# import xcit_dense, build both segmentors, train and infer through the tools, all in one
# process, noting the mmdet modules loaded after each step
SEG_RUN = '''
import json, runpy, sys
config, upernet, work, images, out = sys.argv[1:]

def mmdet_modules():
    return sorted(m for m in sys.modules if m == 'mmdet' or m.startswith('mmdet.'))

def tool(name, *args):
    sys.argv = [name, *args]
    try:
        runpy.run_path(name, run_name='__main__')
    except SystemExit as exc:
        assert not exc.code, exc.code

seen = {}
import xcit_dense
seen['import xcit_dense'] = mmdet_modules()
from xcit_dense.builder import build_model
build_model(config, init=False)
build_model(upernet, {'model.backbone.init_cfg': None}, init=False)
seen['build_model'] = mmdet_modules()
tool('tools/train.py', config, '--work-dir', work)
seen['tools/train.py'] = mmdet_modules()
tool('tools/infer.py', config, work + '/iter_1.pth', images, '--out-dir', out)
seen['tools/infer.py'] = mmdet_modules()
print('SEEN', json.dumps(seen))
'''


def run_python(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope='module')
def seg_run(tmp_path_factory, seg_data):
    """A tiny Semantic FPN trained for one iteration and run on images, in one process."""
    tmp = tmp_path_factory.mktemp('seg_run')
    config = tiny_seg_config(tmp, seg_data, train_cfg=dict(max_iters=1, val_interval=1),
                             default_hooks=dict(checkpoint=dict(interval=1), visualization=dict(draw=False)))
    proc = run_python('-c', SEG_RUN, str(config), str(UPERNET), str(tmp / 'work'),
                      str(seg_data / 'images/validation'), str(tmp / 'out'))
    seen = json.loads(proc.stdout.split('SEEN ', 1)[1].splitlines()[0])
    return seen, config, tmp / 'work/iter_1.pth'


@pytest.fixture(scope='module')
def det_run(tmp_path_factory):
    """The Mask R-CNN demo config trained by tools/train.py for one iteration on two 64x64 images."""
    tmp = tmp_path_factory.mktemp('det_run')
    write_coco_set(tmp, 'train', 2, size=(64, 64), seed=0)
    write_coco_set(tmp, 'val', 1, size=(64, 64), seed=1)
    loader = "dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(data_root={!r}))"
    config = tmp / 'det_tiny.py'
    config.write_text(
        f"_base_ = [{str(DET_DEMO)!r}]\n"
        f"train_dataloader = {loader.format(str(tmp))}\n"
        f"val_dataloader = {loader.format(str(tmp))}\n"
        f"test_dataloader = val_dataloader\n"
        f"val_evaluator = dict(ann_file={str(tmp / 'annotations/instances_val.json')!r})\n"
        f"test_evaluator = val_evaluator\n"
        f"train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1, val_interval=100)\n"
        f"param_scheduler = []\n"
        f"default_hooks = dict(checkpoint=dict(interval=1, by_epoch=False))\n"
        # every scored box kept: a model trained one iteration predicts nothing above the usual 0.05
        f"model = dict(test_cfg=dict(rcnn=dict(score_thr=0.0)))\n")
    # in this process: the model's imports are the test's, not the subject (that is seg_run's)
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', tmp / 'work', cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return config, tmp / 'work/iter_1.pth'


def image(seed: int = 5) -> np.ndarray:
    """A 64x64 BGR scene of the synthetic shapes."""
    return np.asarray(make_scene(np.random.default_rng(seed), (64, 64))[0])[..., ::-1].copy()


def test_segmentation_run_imports_no_mmdet(seg_run):
    seen, _, checkpoint = seg_run
    assert checkpoint.is_file()
    steps = ('import xcit_dense', 'build_model', 'tools/train.py', 'tools/infer.py')
    assert seen == {step: [] for step in steps}


def test_task_table():
    assert task_of_config(Config(dict(default_scope='mmseg'))) is SEGMENTATION
    assert task_of_config(Config.fromfile(str(DET_DEMO))) is DETECTION
    with pytest.raises(ValueError, match="needs default_scope 'mmdet' or 'mmseg', got 'mmpretrain'"):
        task_of_config(Config(dict(default_scope='mmpretrain')))
    assert task_of_state({'roi_head.bbox_head.fc_cls.weight': 0}) is DETECTION
    assert task_of_state({'decode_head.conv_seg.weight': 0}) is SEGMENTATION
    assert task_of_state({'backbone.patch_embed.proj.0.0.weight': 0}) is None


def check_stock_inferencer(task, config: Path, checkpoint: Path) -> None:
    """The stock inferencer (after the documented setup) loads every weight and the classes of
    the checkpoint, and predicts as the toolkit's inferencer does."""
    stock = task.inferencer_class()(model=str(config), weights=str(checkpoint), device='cpu')
    state = read_checkpoint_file(str(checkpoint))
    assert list(stock.model.dataset_meta['classes']) == list(state['meta']['dataset_meta']['classes'])
    for key, value in stock.model.state_dict().items():
        torch.testing.assert_close(value, state['state_dict'][key], msg=key)
    result = stock(image(), return_datasamples=True)  # mmdet: a dict of lists; mmseg: the sample
    stock_sample = result['predictions'][0] if isinstance(result, dict) else result
    ours = predict_image(build_inferencer(str(config), str(checkpoint), device='cpu'), image())
    predicted = getattr(ours, task.prediction)
    assert predicted.keys() and all(v.numel() for v in predicted.values()), 'an empty prediction compares equal'
    for key in predicted.keys():
        torch.testing.assert_close(getattr(getattr(stock_sample, task.prediction), key),
                                   getattr(getattr(ours, task.prediction), key))


def test_stock_seg_inferencer_on_a_toolkit_checkpoint(seg_run):
    _, config, checkpoint = seg_run
    check_stock_inferencer(SEGMENTATION, config, checkpoint)


def test_stock_det_inferencer_on_a_toolkit_checkpoint(det_run):
    config, checkpoint = det_run
    check_stock_inferencer(DETECTION, config, checkpoint)


def test_a_checkpoint_of_the_other_task_is_refused(seg_run, det_run):
    _, seg_config, seg_checkpoint = seg_run
    det_config, det_checkpoint = det_run
    with pytest.raises(CheckpointError, match=f'{seg_checkpoint} holds a segmentation model but '
                                              f'{det_config} builds a detection model'):
        build_inferencer(str(det_config), str(seg_checkpoint), device='cpu')
    with pytest.raises(CheckpointError, match='holds a detection model'):
        build_inferencer(str(seg_config), str(det_checkpoint), device='cpu')
