"""An out-of-memory error in training, explained: where it happened, the memory measured, and what would fit.

The guides' recipe for a run that does not fit is fewer images per GPU with gradient accumulation to
keep the total batch (so the learning rate and schedule keep their meaning), then mixed precision, then
activation checkpointing. ``OutOfMemoryAdvice`` carries that advice for this run's plan; the tools turn
it into the exit status ``OUT_OF_MEMORY_STATUS``.

What counts as an allocation failure: ``xcit_dense/allocation_failures.py``.
"""
import resource
import socket
from contextlib import contextmanager
from typing import Iterator, List, Tuple

import torch
import torch.distributed as dist
from mmengine.config import Config

from ...allocation_failures import is_out_of_memory
from ...errors import ToolkitError
from ..distributed.process_group import gpus_present
from .batch_plan import BatchPlan

OUT_OF_MEMORY_STATUS = 3  # the tools' exit status for OutOfMemoryAdvice


class OutOfMemoryAdvice(ToolkitError):
    """Training ran out of memory; the message names the rank, host, device, memory and what would fit."""

    exit_status = OUT_OF_MEMORY_STATUS


def smaller_batches(images: int, accumulation: int) -> List[Tuple[int, int]]:
    """(images per GPU, accumulation) with the same product and fewer images, the most images first."""
    total = images * accumulation
    return [(d, total // d) for d in range(images - 1, 0, -1) if total % d == 0]


def _memory_measured(device: torch.device) -> str:
    if device.type == 'cuda':
        free, total = torch.cuda.mem_get_info(device)
        return (f'{torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB reserved at the peak by this process, '
                f'{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB')
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return f'{peak / 2**30:.2f} GiB resident at the peak in this process (data workers not counted), ' \
           f'{_host_memory_gib():.1f} GiB on the host'


def _host_memory_gib() -> float:
    with open('/proc/meminfo') as meminfo:
        for line in meminfo:
            if line.startswith('MemTotal:'):
                return int(line.split()[1]) / 2**20
    return float('nan')


def _device_name(device: torch.device) -> str:
    if device.type == 'cuda':
        return f'GPU {device.index} ({torch.cuda.get_device_name(device)})'
    return 'CPU'


def advice(plan: BatchPlan, mixed_precision: bool, with_cp: bool, on_gpu: bool) -> List[str]:
    """What would fit: the options the batch plan accepts together, then mixed precision (GPUs only) and
    activation checkpointing, each where the run does not use it yet."""
    lines = ['--auto-fit: the run probes before its first step and trains with what fits (same effective batch)']
    options = smaller_batches(plan.images_per_gpu, plan.accumulation)
    if options:
        images, accumulation = options[0]
        others = ', '.join(f'{i} x {a}' for i, a in options[1:])
        lines.append(f'fewer images per GPU with the same effective batch {plan.effective_batch}, learning rate '
                     f'and schedule: --cfg-options train_dataloader.batch_size={images} --accumulation {accumulation}'
                     + (f' (or images x accumulation: {others})' if others else ''))
    else:
        lines.append('already 1 image per GPU: the batch cannot shrink further')
    if on_gpu and not mixed_precision:
        lines.append('mixed precision: --amp bf16 (or fp16 on GPUs without bf16)')
    if not with_cp:
        lines.append('activation checkpointing: --cfg-options model.backbone.with_cp=True')
    return lines


def _uses_mixed_precision(cfg: Config) -> bool:
    wrapper = cfg.get('optim_wrapper') or {}
    return 'Amp' in wrapper.get('type', '') or 'BF16' in wrapper.get('type', '')


def explain(exc: BaseException, cfg: Config, plan: BatchPlan) -> OutOfMemoryAdvice:
    """The ``OutOfMemoryAdvice`` for ``exc`` (an allocation failure) in this process's run of ``cfg`` under
    ``plan`` (the assembled run: its optimizer wrapper says whether mixed precision is on)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device('cuda', torch.cuda.current_device()) if gpus_present() else torch.device('cpu')
    with_cp = bool((cfg.model.get('backbone') or {}).get('with_cp'))
    gist = ' '.join(str(exc).split())[:300] or type(exc).__name__
    what = '\n'.join(f'  - {line}' for line in advice(plan, _uses_mixed_precision(cfg), with_cp,
                                                       device.type == 'cuda'))
    return OutOfMemoryAdvice(
        f'out of memory on rank {rank} (host {socket.gethostname()}, {_device_name(device)}) at '
        f'{plan.images_per_gpu} images per GPU, accumulation {plan.accumulation}: {_memory_measured(device)} '
        f'({type(exc).__name__}: {gist}).\nWhat would fit:\n{what}')


@contextmanager
def explained(cfg: Config, plan: BatchPlan) -> Iterator[None]:
    """Turn an allocation failure inside the block into ``OutOfMemoryAdvice`` (other errors pass)."""
    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise explain(exc, cfg, plan) from exc
