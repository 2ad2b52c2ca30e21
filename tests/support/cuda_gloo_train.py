"""tools/train.py under a main process group whose only backend serves CUDA devices.

``init_process_group(backend='cuda:gloo')`` refuses CPU tensors as NCCL does ("No backend type
associated with device type cpu"), so a CPU run of the toolkit meets the GPU path's collective
rules. The gradients' DDP goes over the toolkit's gloo control group (DDP is not a control
collective; on a GPU it runs on NCCL). At exit the script prints how often each collective of
torch.distributed was called (``collective counts: {...}``).
Usage: python tests/support/cuda_gloo_train.py TRAIN_ARGS... (a launched run: RANK, WORLD_SIZE, ... set).
"""
import atexit
import collections
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

CALLS: collections.Counter = collections.Counter()
COUNTED = ('all_reduce', 'all_gather_object', 'broadcast', 'barrier', 'monitored_barrier')


def _count(name: str) -> None:
    real = getattr(dist, name)

    def counted(*args, **kwargs):
        CALLS[name] += 1
        return real(*args, **kwargs)
    setattr(dist, name, counted)


def _cuda_only_backend() -> None:
    real = dist.init_process_group

    def init(backend=None, *args, **kwargs):
        return real('cuda:gloo' if backend == 'gloo' else backend, *args, **kwargs)
    dist.init_process_group = init


def _register_side_group_ddp() -> None:
    from mmengine.model import MMDistributedDataParallel
    from mmengine.registry import MODEL_WRAPPERS

    from xcit_dense.engine.distributed.collectives import control_group

    @MODEL_WRAPPERS.register_module()
    class ControlGroupDDP(MMDistributedDataParallel):
        def __init__(self, module, **kwargs):
            super().__init__(module=module, process_group=control_group()[0], **kwargs)


if __name__ == '__main__':
    for name in COUNTED:
        _count(name)
    _cuda_only_backend()
    _register_side_group_ddp()
    atexit.register(lambda: print(f'collective counts: {dict(sorted(CALLS.items()))}', file=sys.stderr))
    train = Path(__file__).resolve().parents[2] / 'tools/train.py'
    sys.argv = [str(train), *sys.argv[1:]]
    runpy.run_path(str(train), run_name='__main__')
