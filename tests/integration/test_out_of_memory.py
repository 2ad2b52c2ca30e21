"""An out-of-memory error explained: the advice with its own exit status, never a skipped sample, and a rank
killed by the kernel named by the launcher."""
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, launch_env, run_tool_in_process, tiny_seg_config

from xcit_dense.allocation_failures import is_out_of_memory
from xcit_dense.datasets import SkipBadSamples
from xcit_dense.engine.out_of_memory import OUT_OF_MEMORY_STATUS, smaller_batches


def test_an_allocation_failure_in_training_exits_with_the_advice_for_the_same_effective_batch(tmp_path, seg_data):
    """2 images per process where the allocator fails above 1: the advice names rank, host, device and the
    memory, and proposes 1 image with accumulation 4 (the same effective batch as 2 x 2), checkpointing,
    and no --amp on a CPU (it would train in fp32 there)."""
    config = tiny_seg_config(
        tmp_path, seg_data, custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=[dict(type='AllocationLimitHook', max_images=1)])
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', 'run', '--accumulation', '2', cwd=tmp_path)
    assert proc.returncode == OUT_OF_MEMORY_STATUS, proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr
    advice = proc.stderr[proc.stderr.index('error: out of memory on rank 0 (host '):]
    assert ', CPU) at 2 images per GPU, accumulation 2: ' in advice
    assert 'GiB resident at the peak in this process' in advice and "can't allocate memory" in advice
    assert ('same effective batch 4, learning rate and schedule: '
            '--cfg-options train_dataloader.batch_size=1 --accumulation 4') in advice
    assert '--cfg-options model.backbone.with_cp=True' in advice
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
