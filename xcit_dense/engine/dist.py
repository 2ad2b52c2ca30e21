"""Process-group setup that also works without GPUs (gloo on CPU), before MMEngine's Runner.

MMEngine 0.10.7's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally and defaults to
NCCL, so it fails on a machine without GPUs. Initialising the group here first makes the Runner
skip its own initialisation.
"""
import atexit
import os
import subprocess
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

LAUNCHERS = ('none', 'pytorch', 'slurm')


def gpus_present() -> bool:
    """True only when CUDA devices really exist (a set CUDA_VISIBLE_DEVICES is not enough)."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def _slurm_env() -> None:
    """Translate Slurm's task variables into the ones torch.distributed reads."""
    nodes = os.environ['SLURM_NODELIST']
    master = subprocess.run(['scontrol', 'show', 'hostnames', nodes], check=True,
                            capture_output=True, text=True).stdout.split()[0]
    os.environ.setdefault('MASTER_ADDR', master)
    os.environ.setdefault('MASTER_PORT', os.environ.get('PORT', '29500'))
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']


def init_distributed(launcher: str, timeout_s: int = 1800) -> Optional[str]:
    """Join the process group for ``launcher``; returns the backend, or None for one process."""
    if launcher not in LAUNCHERS:
        raise ValueError(f'launcher must be one of {LAUNCHERS}, got {launcher!r}')
    if launcher == 'none' or dist.is_initialized():
        return dist.get_backend() if dist.is_initialized() else None
    if launcher == 'slurm':
        _slurm_env()
    missing = [v for v in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if v not in os.environ]
    if missing:
        raise RuntimeError(f'launcher {launcher!r} needs the environment variables {missing}: start '
                           f'the run with tools/dist_train.sh (torchrun) or tools/slurm_train.sh')
    local_rank = int(os.environ.get('LOCAL_RANK', 0))
    if gpus_present():
        backend = 'nccl'
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    else:
        backend = 'gloo'
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    atexit.register(_leave_group)
    return backend


def _leave_group() -> None:
    """Destroy the group while the interpreter is still alive: left to interpreter teardown, gloo's
    worker threads can abort the process (SIGABRT) after a run that otherwise succeeded."""
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def describe_topology(backend: Optional[str]) -> str:
    """'N nodes, M processes, backend B' for the run plan line."""
    if not dist.is_initialized():
        return '1 node, 1 process, no process group'
    processes = dist.get_world_size()
    per_node = int(os.environ.get('LOCAL_WORLD_SIZE') or os.environ.get('SLURM_NTASKS_PER_NODE', '0')
                   .split('(')[0] or processes)
    nodes = int(os.environ.get('SLURM_JOB_NUM_NODES') or max(1, processes // max(per_node, 1)))
    return f'{nodes} node(s), {processes} processes, backend {backend}'
