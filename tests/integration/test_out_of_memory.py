"""An out-of-memory error explained: the advice with its own exit status, never a skipped sample, and a rank
killed by the kernel named by the launcher."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import (
    ROOT,
    assert_matches,
    free_port,
    launch_env,
    rank_weights,
    read_log,
    run,
    run_tool_in_process,
    tiny_seg_config,
    train_cmd,
)
from mmengine.config import Config

from xcit_dense.allocation_failures import is_out_of_memory
from xcit_dense.datasets import SkipBadSamples
from xcit_dense.engine.planning.auto_fit import fit
from xcit_dense.engine.planning.batch_plan import BatchPlan
from xcit_dense.engine.planning.out_of_memory import OUT_OF_MEMORY_STATUS, smaller_batches


def limited_config(tmp_path, seg_data, max_images, **overrides):
    """The tiny segmentation config whose model runs out of memory above ``max_images`` images per batch."""
    return tiny_seg_config(
        tmp_path, seg_data, custom_imports=dict(imports=['xcit_dense', 'allocation_limit'], allow_failed_imports=False),
        model=dict(type='AllocationLimitedSegmentor', max_images=max_images), **overrides)


def test_an_allocation_failure_in_training_exits_with_the_advice_for_the_same_effective_batch(tmp_path, seg_data):
    """2 images per process where the allocator fails above 1: the advice names rank, host, device and the
    memory, and proposes 1 image with accumulation 4 (the same effective batch as 2 x 2), checkpointing,
    and no --amp on a CPU (it would train in fp32 there)."""
    config = limited_config(tmp_path, seg_data, max_images=1)
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', 'run', '--accumulation', '2', cwd=tmp_path)
    assert proc.returncode == OUT_OF_MEMORY_STATUS, proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr
    advice = proc.stderr[proc.stderr.index('error: out of memory on rank 0 (host '):]
    assert ', CPU) at 2 images per GPU, accumulation 2: ' in advice
    assert 'GiB resident at the peak in this process' in advice and "can't allocate memory" in advice
    assert ('same effective batch 4, learning rate and schedule: '
            '--cfg-options train_dataloader.batch_size=1 --accumulation 4') in advice
    assert '--cfg-options model.backbone.with_cp=True' in advice and '--auto-fit: the run probes' in advice
    assert '--amp' not in advice
    assert not list((tmp_path / 'run').glob('*.pth'))


def test_smaller_batches_keep_the_product_most_images_first():
    assert smaller_batches(4, 2) == [(2, 4), (1, 8)]
    assert smaller_batches(6, 1) == [(3, 2), (2, 3), (1, 6)]
    assert smaller_batches(2, 1) == [(1, 2)]
    assert smaller_batches(1, 4) == []


def numpy_allocation_failure() -> MemoryError:
    """numpy's own error for an array it cannot allocate (its ``_ArrayMemoryError``)."""
    try:
        np.empty(2**62, np.uint8)
    except MemoryError as exc:
        return exc
    raise AssertionError('numpy allocated 4 EiB')


class Allocating:
    """A dataset whose sample 1 fails to allocate (``error``), the others load."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.calls = error, 0

    def __len__(self):
        return 4

    def __getitem__(self, idx):
        self.calls += 1
        if idx == 1:
            raise self.error
        return dict(idx=idx)

    def get_data_info(self, idx):
        return dict(sample_idx=idx)


@pytest.mark.parametrize('error', [
    MemoryError(),
    numpy_allocation_failure(),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8796093022208 bytes."),
], ids=['MemoryError', 'numpy', 'torch-cpu'])
def test_an_allocation_failure_in_the_data_pipeline_is_raised_not_skipped(error):
    dataset = SkipBadSamples(Allocating(error))
    assert dataset[0] == dict(idx=0)
    with pytest.raises(type(error)) as raised:
        dataset[1]
    assert raised.value is error
    assert dataset.skipped == 0 and dataset.dataset.calls == 2


def test_allocation_failures_are_told_from_other_errors():
    worker = RuntimeError('Caught MemoryError in DataLoader worker process 0.\nOriginal Traceback ...')
    chained = ValueError('a transform failed')
    chained.__cause__ = MemoryError()
    assert is_out_of_memory(worker) and is_out_of_memory(chained)
    assert not is_out_of_memory(RuntimeError('shape mismatch')) and not is_out_of_memory(OSError('bad file'))


@pytest.mark.slow
def test_a_rank_killed_by_signal_9_is_named_as_likely_out_of_memory(tmp_path):
    script = tmp_path / 'killed.py'
    script.write_text('import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n')
    proc = subprocess.run([sys.executable, str(ROOT / 'tools/torchrun.py'), '--nproc-per-node', '1',
                           '--master-port', '0', str(script)], cwd=tmp_path, env=launch_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1].startswith('error: rank 0 (pid ')
    assert 'was killed by signal 9: likely out of memory' in proc.stderr.rstrip().splitlines()[-1], proc.stderr


def fitting_config(tmp_path, seg_data, max_images, max_iters=2):
    """``limited_config`` that dumps every rank's final weights (launch_hooks) and trains ``max_iters``
    optimizer steps."""
    return tiny_seg_config(
        tmp_path, seg_data,
        custom_imports=dict(imports=['xcit_dense', 'allocation_limit', 'launch_hooks'], allow_failed_imports=False),
        model=dict(type='AllocationLimitedSegmentor', max_images=max_images),
        custom_hooks=[dict(type='DumpRankWeightsHook')],
        auto_fit=dict(probe_shape=(64, 64)),  # the tiny pipeline does not resize: its images are 64 x 64
        train_cfg=dict(max_iters=max_iters, val_interval=max_iters),
        default_hooks=dict(checkpoint=dict(interval=max_iters), logger=dict(interval=1),
                           visualization=dict(draw=False)))


def dumped_config(work_dir):
    return Config.fromfile(next(work_dir.glob('*/vis_data/config.py'), None) or next(work_dir.glob('*.py')))


@pytest.mark.slow
def test_auto_fit_replans_to_what_fits_and_trains_as_that_plan_would(tmp_path, seg_data):
    """2 images per process where 1 fits: --auto-fit trains 1 image x accumulation 2 (same lr), with the
    weights a run started with that plan ends with; a resume reuses the recorded fit without probing.
    The fitted run's backbone has ``compile=True`` (TORCHDYNAMO_DISABLE=1 spares the compile): the probe
    builds the model as the runner does, without the option (XCiT takes no ``compile`` argument)."""
    config = fitting_config(tmp_path, seg_data, max_images=1)
    fitted = run(train_cmd(config, tmp_path / 'fitted', '--auto-fit', '--cfg-options', 'model.backbone.compile=True'),
                 env=launch_env(TORCHDYNAMO_DISABLE=1))
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    log = read_log(tmp_path / 'fitted')
    assert 'auto-fit: the probe measures the eager backbone' in log
    assert 'auto-fit: 2 images per GPU x accumulation 1: out of memory on rank(s) 0' in log
    assert 'auto-fit: 1 images per GPU x accumulation 2: fits on every rank' in log
    assert '1 images per GPU, accumulation 2, effective batch 2' in log
    dumped = dumped_config(tmp_path / 'fitted')
    assert dumped.train_dataloader.batch_size == 1 and dumped.optim_wrapper.accumulative_counts == 2
    planned = run(train_cmd(config, tmp_path / 'planned', '--accumulation', '2', '--cfg-options',
                            'train_dataloader.batch_size=1'), env=launch_env())
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert dumped.optim_wrapper.optimizer.lr == dumped_config(tmp_path / 'planned').optim_wrapper.optimizer.lr
    assert_matches(rank_weights(tmp_path / 'fitted', 1)[0], rank_weights(tmp_path / 'planned', 1)[0], rtol=1e-6)
    checkpoint = torch.load(tmp_path / 'fitted' / 'iter_4.pth', weights_only=False)
    assert checkpoint['meta']['auto_fit'] == dict(requested=[2, 1], fitted=[1, 2], world_size=1, device='cpu',
                                                  total_memory=checkpoint['meta']['auto_fit']['total_memory'])
    longer = fitting_config(tmp_path, seg_data, max_images=1, max_iters=3)
    resumed = run(train_cmd(longer, tmp_path / 'fitted', '--auto-fit', '--resume'), env=launch_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = read_log(tmp_path / 'fitted')
    assert ('auto-fit: 1 images per GPU x accumulation 2, as the checkpoint recorded for the same request, '
            'world size and device (not probed)') in log
    assert log.count('auto-fit: probing') == 1


@pytest.mark.slow
def test_auto_fit_on_two_ranks_adopts_the_plan_of_the_rank_that_needs_the_least(tmp_path, seg_data):
    """Rank 0 fits 2 images, rank 1 only 1: both train 1 x 2 (equal weights on both ranks); resumed on one
    process (another world size), the run probes again and says why."""
    config = fitting_config(tmp_path, seg_data, max_images=[2, 1])
    env = launch_env(PORT=free_port(), XCIT_WAIT_TIMEOUT=120, XCIT_STEP_TIMEOUT=120)  # no hang: bounds low
    proc = run(['bash', str(ROOT / 'tools/dist_train.sh'), str(config), '2', '--work-dir', str(tmp_path / 'two'),
                '--auto-fit'], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = read_log(tmp_path / 'two')
    assert 'auto-fit: 2 images per GPU x accumulation 1: out of memory on rank(s) 1 (' in log
    assert 'auto-fit: 1 images per GPU x accumulation 2: fits on every rank' in log
    rank_weights(tmp_path / 'two', 2)  # equal on both ranks
    longer = fitting_config(tmp_path, seg_data, max_images=[2, 1], max_iters=3)
    resumed = run(train_cmd(longer, tmp_path / 'two', '--auto-fit', '--resume'), env=launch_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "probing again, not reusing the checkpoint's fit: the world size changed (2 -> 1)" in read_log(
        tmp_path / 'two')


def test_auto_fit_where_one_image_does_not_fit_gives_the_advice_before_training(tmp_path, seg_data):
    config = fitting_config(tmp_path, seg_data, max_images=0)
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', 'run', '--auto-fit', cwd=tmp_path)
    assert proc.returncode == OUT_OF_MEMORY_STATUS, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert 'error: auto-fit: even 1 image per GPU does not fit:' in proc.stderr
    assert 'auto-fit: 1 images per GPU x accumulation 2: out of memory on rank(s) 0' in proc.stderr
    assert '--cfg-options model.backbone.with_cp=True' in proc.stderr and '--auto-fit: the run' not in proc.stderr
    assert not (tmp_path / 'run').exists() or not list((tmp_path / 'run').rglob('*.pth'))


@pytest.mark.slow
def test_the_probe_runs_a_real_mask_rcnn_on_its_synthetic_batch(tmp_path):
    """The detector's probe batch (boxes, masks, metainfo) goes through the real data preprocessor, RPN,
    RoI heads and backward; on a CPU the planned 2 images fit at once."""
    from bad_data import tiny_det_config

    from xcit_dense.tasks import task_of_config
    cfg = Config.fromfile(tiny_det_config(tmp_path, tmp_path))
    task_of_config(cfg).import_models()
    fitted, lines = fit(cfg, cfg.model, BatchPlan(1, 2, 1, reference_batch=16, base_lr=1e-4, scale_lr=False),
                        amp=None)
    assert (fitted.images_per_gpu, fitted.accumulation) == (2, 1)
    assert lines[1:] == ['auto-fit: 2 images per GPU x accumulation 1: fits on every rank']
    assert lines[0].startswith('auto-fit: probing ') and 'with 50 instances each (amp off' in lines[0]
