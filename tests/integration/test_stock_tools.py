"""mmdet's and mmseg's own tools (what `mim train` runs) train, resume and test a user's config that
inherits this toolkit's demo configs, and their checkpoints load in the stock inferencers.

Training and resuming run in this process (as `python TOOL ARGS` would, saving two interpreter
starts); the test tool runs in a fresh interpreter, where only the config's custom_imports can have
allowed MMEngine's types for torch's weights_only loading, beside the stock inferencer in this process.
"""
import contextlib
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import mmdet
import mmseg
import pytest
from helpers import ROOT, hide_payload, own_runner_instances, signal_handlers_kept, spawned

from xcit_dense.datasets.synthetic import write_coco_set, write_segmentation_set
from xcit_dense.io.checkpoint import CheckpointError

TINY_BACKBONE = dict(embed_dims=64, depth=4, num_heads=4, out_indices=(0, 1, 2, 3))


def stock_tool(package, name: str) -> str:
    return os.path.join(os.path.dirname(package.__file__), '.mim', 'tools', f'{name}.py')


def run_here(tool: str, *args, cwd: Path) -> None:
    """Run a stock tool in this process, from a user's folder (not this repository)."""
    with pytest.MonkeyPatch.context() as patch, own_runner_instances(), signal_handlers_kept():
        patch.chdir(cwd)
        patch.setattr(sys, 'argv', [tool, *map(str, args)])
        runpy.run_path(tool, run_name='__main__')


@contextlib.contextmanager
def started(*args, cwd: Path) -> Iterator[Callable[[], str]]:
    """Start a stock tool in a fresh interpreter, from a user's folder, and go on beside it (its
    interpreter imports the stack while this process infers); the function given waits for it and
    returns its output. The process is killed at the end of the block if still running."""
    with spawned([sys.executable, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as proc:
        def output() -> str:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, out[-3000:] + err[-3000:]
            return out + err
        yield output


def read_logs(work: Path) -> str:
    return '\n'.join(p.read_text() for p in sorted(work.glob('*/*.log')))


def user_config(path: Path, base: str, lines: list) -> Path:
    path.write_text('\n'.join([f'_base_ = [{str(ROOT / base)!r}]', *lines]) + '\n')
    return path


def loaders(data: str) -> list:
    """Two-image batches; no validation while training (the test tool evaluates the base's
    validation split)."""
    loader = (f'dict(batch_size=2, num_workers=0, persistent_workers=False, '
              f'dataset=dict(data_root={data!r}))')
    return [f'train_dataloader = {loader}', f'test_dataloader = {loader}', 'val_dataloader = None',
            'val_cfg = None', 'val_evaluator = None']


def test_mmdet_tools_train_resume_test_and_infer(tmp_path):
    data = tmp_path / 'coco'
    write_coco_set(data, 'train', 2, size=(64, 64), seed=0)
    write_coco_set(data, 'val', 2, size=(64, 64), seed=1)
    config = user_config(tmp_path / 'my_mask_rcnn.py', 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py', [
        f'model = dict(backbone={TINY_BACKBONE!r}, neck=dict(in_channels=[64] * 4))',
        *loaders(f'{data}/'),
        f"test_evaluator = dict(ann_file={str(data / 'annotations/instances_val.json')!r})",
        'train_cfg = dict(max_epochs=1)',
        'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))'])
    work = tmp_path / 'work'
    run_here(stock_tool(mmdet, 'train'), config, '--work-dir', work, cwd=tmp_path)
    run_here(stock_tool(mmdet, 'train'), config, '--work-dir', work, '--resume',
             '--cfg-options', 'train_cfg.max_epochs=2', cwd=tmp_path)
    log = read_logs(work)
    assert 'resumed epoch: 1, iter: 1' in log and 'Epoch(train) [2][1/1]' in log
    with started(stock_tool(mmdet, 'test'), config, work / 'epoch_2.pth', '--work-dir', tmp_path / 'test',
                 cwd=tmp_path) as test_output:
        from mmdet.apis import DetInferencer
        inferencer = DetInferencer(model=str(config), weights=str(work / 'epoch_2.pth'), device='cpu')
        image = str(data / 'val/val_00000.jpg')
        prediction = inferencer(image, return_datasamples=True)['predictions'][0]
        assert prediction.pred_instances.bboxes.shape[1] == 4
        # the same trained file with code hidden in its meta: the stock inferencer refuses it
        evil = hide_payload(work / 'epoch_2.pth', tmp_path / 'pwned', tmp_path / 'evil.pth')
        with pytest.raises(CheckpointError, match=r'evil\.pth: refused.*could run code'):
            DetInferencer(model=str(config), weights=str(evil), device='cpu')
        assert not (tmp_path / 'pwned').exists()
        test = test_output()
    assert 'coco/bbox_mAP' in test and 'coco/segm_mAP' in test


def test_mmseg_tools_train_resume_test_and_infer(tmp_path):
    data = tmp_path / 'ade'
    write_segmentation_set(data, 'training', 2, size=(64, 64), seed=0)
    write_segmentation_set(data, 'validation', 2, size=(64, 64), seed=1)
    config = user_config(tmp_path / 'my_upernet.py', 'configs/demo/upernet_xcit_tiny_12_p16_demo.py', [
        f'model = dict(data_preprocessor=dict(size=(64, 64)), backbone={TINY_BACKBONE!r}, '
        'decode_head=dict(in_channels=[64] * 4, channels=32), '
        'auxiliary_head=dict(in_channels=64, channels=16))',
        *loaders(f'{data}/'),
        'train_cfg = dict(max_iters=1)',
        'default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))'])
    work = tmp_path / 'work'
    run_here(stock_tool(mmseg, 'train'), config, '--work-dir', work, cwd=tmp_path)
    run_here(stock_tool(mmseg, 'train'), config, '--work-dir', work, '--resume',
             '--cfg-options', 'train_cfg.max_iters=2', cwd=tmp_path)
    log = read_logs(work)
    assert 'resumed epoch: 0, iter: 1' in log and 'Iter(train) [2/2]' in log
    with started(stock_tool(mmseg, 'test'), config, work / 'iter_2.pth', '--work-dir', tmp_path / 'test',
                 cwd=tmp_path) as test_output:
        from mmseg.apis import MMSegInferencer
        inferencer = MMSegInferencer(model=str(config), weights=str(work / 'iter_2.pth'), device='cpu')
        result = inferencer(str(data / 'images/validation/validation_00000.jpg'), return_datasamples=True)
        assert tuple(result.pred_sem_seg.data.shape[-2:]) == (64, 64)
        test = test_output()
    assert 'mIoU' in test
