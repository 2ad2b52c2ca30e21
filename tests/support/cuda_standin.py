"""``python cuda_standin.py TOOL ARGS...``: run a tool's start with ``torch.cuda`` replaced by a stand-in
that reports 8 GPUs and records every GPU index the process touches; the process group is not made
(``init_process_group`` exits 0 instead). With ``STANDIN_BUSY=1`` the plain allocation fails as on a
GPU in exclusive-process mode held by another process. The probe of torchvision's ops is stubbed
(it records its GPU). Prints ``touched: [...]`` when the process exits."""
import atexit
import os
import runpy
import sys

import torch
import torch.distributed as dist

COUNT = 8
touched = []
current = [0]
real_empty = torch.empty


def touch(device=None) -> int:
    """Record the GPU ``device`` names (None: the current one) and return its index."""
    if device is None:
        index = current[0]
    elif isinstance(device, int):
        index = device
    else:
        index = current[0] if torch.device(device).index is None else torch.device(device).index
    touched.append(index)
    return index


def set_device(device) -> None:
    current[0] = touch(device)


def synchronize(device=None) -> None:
    touch(device)


def get_device_name(device=None) -> str:
    touch(device)
    return 'Stand-in GPU'


def get_device_capability(device=None) -> tuple:
    touch(device)
    return (9, 0)


def unserved(name: str):
    def call(*args, **kwargs):
        raise AssertionError(f'the stand-in does not serve torch.cuda.{name}{args}')
    return call


def empty(*size, device=None, **kwargs):
    if device is not None and torch.device(device).type == 'cuda':
        touch(device)
        if os.environ.get('STANDIN_BUSY') == '1':
            raise RuntimeError('CUDA error: all CUDA-capable devices are busy or unavailable')
        device = 'cpu'
    return real_empty(*size, device=device, **kwargs)


def group_forms(*args, **kwargs):
    sys.exit(0)


torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: COUNT
torch.cuda.current_device = lambda: current[0]
torch.cuda.set_device, torch.cuda.synchronize = set_device, synchronize
torch.cuda.get_device_name, torch.cuda.get_device_capability = get_device_name, get_device_capability
for name in ('get_device_properties', 'mem_get_info', 'init', 'device', 'Stream', 'memory_allocated'):
    setattr(torch.cuda, name, unserved(name))
torch.empty = empty
dist.init_process_group = group_forms
atexit.register(lambda: print(f'touched: {sorted(set(touched))}', flush=True))

from xcit_dense.engine.distributed import cuda_ops  # noqa: E402  (after the stand-in is in place)

cuda_ops.check_torchvision_cuda_ops = touch  # the probe, stubbed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
