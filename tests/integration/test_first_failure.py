"""A launch that cannot work fails once and clearly: missing data is named before torchrun starts,
and a worker's own error is the report, not torchrun's traceback."""
import os
import subprocess
import sys
import time

from helpers import ROOT, free_port, tiny_seg_config


def launch(*args, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(free_port()))
    return subprocess.run(['bash', str(ROOT / 'tools/dist_train.sh'), *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True)


def test_missing_coco_is_one_message_before_torchrun(tmp_path):
    start = time.monotonic()
    proc = launch(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py', 2, cwd=tmp_path)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert 'annotation file not found: data/coco/annotations/instances_train2017.json' in lines[0]
    assert 'see README: Datasets' in lines[0]
    assert elapsed < 60, f'{elapsed:.1f} s'  # a second of CPU; the bound allows for a loaded machine
    # a data_root given with --cfg-options is what is checked
    proc = launch(ROOT / 'configs/xcit/mask_rcnn_xcit_small_12_p16_3x_coco.py', 2, '--cfg-options',
                  'train_dataloader.dataset.data_root=/elsewhere/coco/', cwd=tmp_path)
    assert '/elsewhere/coco/annotations/instances_train2017.json' in proc.stderr


def test_a_worker_failure_shows_the_workers_error(tmp_path, seg_data):
    config = tiny_seg_config(tmp_path, seg_data)
    proc = launch(config, 2, '--cfg-options', 'model.backbone.no_such_key=1', cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert 'Traceback' not in output and 'ChildFailedError' not in output
    assert 'pkg_resources is deprecated' not in output
    assert output.count('model.backbone.no_such_key: XCiT has no such argument') == 1, output
    error = output.index('model.backbone.no_such_key: XCiT has no such argument')
    assert output.rstrip().splitlines()[-1].startswith('error: rank ')
    assert error < output.index('failed first')
