"""The toolkit's own control collectives (stop flags, restart counts, RNG states, the checkpoint to
resume from, the exit meeting), all in this one module.

A collective must use the device its group's backend serves: NCCL serves CUDA tensors only and
raises "No backend type associated with device type cpu" for a CPU tensor. When the main group's
backend serves CPU tensors (gloo), the control collectives use it with CPU tensors. Otherwise
(NCCL) they use a small gloo side group created with the main one: a CPU tensor needs no device
copy there, and gloo gives what NCCL does not: a failed peer raises a Python error within the
side group's timeout, and ``monitored_barrier`` names the rank that did not arrive.
"""
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist

from .run_context import current_context

# A group's timeout changed after its creation: public as ``set_timeout`` in newer torch; torch 2.6
# (the lowest supported) has only ``distributed_c10d._set_pg_timeout``, with the same arguments.
_SET_TIMEOUT = getattr(dist, 'set_timeout', None) or dist.distributed_c10d._set_pg_timeout


def serves_cpu(backend: str) -> bool:
    """Whether a backend string ('gloo', 'nccl', 'cpu:gloo,cuda:nccl', ...) serves CPU tensors."""
    parts = [part.split(':') for part in backend.lower().split(',')]
    return any(part == ['gloo'] or part == ['mpi'] or part[0] == 'cpu' for part in parts)


def open_control_group(timeout_s: float) -> None:
    """Create the gloo side group when the main group's backend cannot take CPU tensors.

    Every rank calls this right after ``init_process_group`` (creating a group is a collective); the
    run's context keeps it."""
    context = current_context()
    context.side_group = None
    if not serves_cpu(dist.get_backend()):
        context.side_group = dist.new_group(backend='gloo', timeout=timedelta(seconds=timeout_s))


def set_timeouts(seconds: int, nccl_extra_s: int = 0) -> None:
    """How long the main group's and the side group's collectives wait from now on; a main group
    that does not serve CPU tensors (NCCL) waits ``nccl_extra_s`` longer (for its timeout dump)."""
    extra = 0 if serves_cpu(dist.get_backend()) else nccl_extra_s
    _SET_TIMEOUT(timedelta(seconds=seconds + extra))
    side = current_context().side_group
    if side is not None:
        _SET_TIMEOUT(timedelta(seconds=seconds), group=side)


def close_control_group() -> None:
    """Forget the side group (``destroy_process_group`` destroys it with the main group)."""
    current_context().side_group = None


def control_group() -> Tuple[Optional[dist.ProcessGroup], torch.device]:
    """The group the control collectives use (None: the main group) and the device of their tensors."""
    side = current_context().side_group
    if side is not None:
        return side, torch.device('cpu')
    backend = dist.get_backend()
    if serves_cpu(backend):
        return None, torch.device('cpu')
    # a main group that serves CUDA alone, without a side group: the device set for this rank
    return None, torch.device('cuda', torch.cuda.current_device())


def agree_on_max(values: List[float]) -> List[float]:
    """The element-wise maximum of ``values`` over all ranks: one all-reduce of one small tensor.

    Without a process group, ``values`` as they are. Every rank must call it at the same point."""
    if not dist.is_initialized():
        return list(values)
    group, device = control_group()
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


def gather_objects(obj: Any) -> List[Any]:
    """Every rank's ``obj``, indexed by rank (pickled over the control group); [obj] without a group."""
    if not dist.is_initialized():
        return [obj]
    group, _ = control_group()
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def broadcast_from_first(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled over the control group); ``obj`` without a group.
    Every rank must call it at the same point; the others' ``obj`` is ignored."""
    if not dist.is_initialized():
        return obj
    group, _ = control_group()
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def barrier_within(timeout_s: float) -> None:
    """All ranks meet within ``timeout_s``; raises naming a rank that did not arrive (gloo's
    ``monitored_barrier``, on the side group when the main backend is not gloo)."""
    if not dist.is_initialized():
        return
    group, device = control_group()
    if group is None and device.type != 'cpu':  # no gloo here: a plain barrier, without a timeout
        dist.barrier(device_ids=[device.index])
        return
    dist.monitored_barrier(group=group, timeout=timedelta(seconds=timeout_s))
