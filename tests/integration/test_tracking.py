"""Experiment tracking: --vis-backend tensorboard writes event files whose scalars are the logged values."""
import json
import subprocess
import sys

import pytest
from helpers import ROOT, tiny_seg_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def test_tensorboard_scalars_equal_the_logged_values(tmp_path, seg_data):
    config = tiny_seg_config(tmp_path, seg_data)
    work = tmp_path / 'work'
    proc = subprocess.run([sys.executable, 'tools/train.py', str(config), '--work-dir', str(work),
                           '--vis-backend', 'tensorboard'], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'pkg_resources is deprecated' not in proc.stderr
    # the header states what the run used, not the config's NCCL and a "GPU number"
    log = next(work.glob('*/*.log')).read_text()
    assert 'process group: none (one process)' in log and 'devices: 1 CPU process(es)' in log
    assert 'GPU number' not in log and "'backend': 'nccl'" not in log
    assert '"FileClient" will be deprecated' not in log  # a known notice of the pinned MMEngine
    vis = next(work.glob('*/vis_data'))
    logged = [json.loads(line) for line in (vis / 'scalars.json').read_text().splitlines()]
    events = EventAccumulator(str(vis)).Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()['scalars']}
    for tag in ('loss', 'lr', 'img_per_s', 'mIoU'):
        rows = [row for row in logged if tag in row]
        assert rows, f'{tag} was not logged'
        for row in rows:
            assert scalars[tag][row['step']] == pytest.approx(row[tag], rel=1e-6), tag
    assert len(scalars['loss']) == 4 and len(scalars['mIoU']) == 1
