"""Run-time check that the installed mmcv's CUDA ops hold code for the GPUs present.

tools/build_mmcv.py writes mmcv/xcit_build_info.py into the wheels it builds (CUDA version and
TORCH_CUDA_ARCH_LIST). A GPU outside that list would fail inside an mmcv kernel launch
("no kernel image is available"); check_mmcv_cuda_arch() says so up front, naming both.
"""
import importlib
import re
from typing import Optional, Sequence

import torch

ARCH = re.compile(r'^(\d+)\.(\d+)(\+PTX)?$')


def arch_runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code for one TORCH_CUDA_ARCH_LIST entry runs on a GPU of this compute capability.

    cubin for sm_XY runs on the same major X with minor >= Y; an entry with +PTX also carries
    PTX, which the driver compiles for any newer GPU.
    """
    m = ARCH.match(arch)
    if not m:
        return False
    built = (int(m.group(1)), int(m.group(2)))
    if capability[0] == built[0] and capability[1] >= built[1]:
        return True
    return bool(m.group(3)) and tuple(capability) >= built


def arch_mismatch_message(capability: tuple[int, int], gpu_name: str, archs: Sequence[str]) -> Optional[str]:
    """The error for a GPU none of the built architectures runs on, None when one does."""
    if any(arch_runs_on(a, capability) for a in archs):
        return None
    sm = f'sm_{capability[0]}{capability[1]}'
    built = ', '.join('sm_' + a.replace('.', '').replace('+PTX', ' (+PTX)') for a in archs)
    wanted = ';'.join(list(archs) + [f'{capability[0]}.{capability[1]}'])
    return (f"this GPU is {sm} ({gpu_name}), but the installed mmcv's CUDA ops were built for {built}: "
            f'reinstall with XCIT_MMCV_CUDA=1 TORCH_CUDA_ARCH_LIST="{wanted}" bash tools/install.sh')


CPU_ONLY = ()  # what mmcv_cuda_archs() returns for a build without CUDA ops
REINSTALL_WITH_CUDA = 'XCIT_MMCV_CUDA=1 bash tools/install.sh'


def mmcv_cuda_archs() -> Optional[tuple[str, ...]]:
    """The architectures the installed mmcv's CUDA ops were built for: ``CPU_ONLY`` for a build
    without them, None when unknown (mmcv missing, or not built by tools/build_mmcv.py)."""
    try:
        info = importlib.import_module('mmcv.xcit_build_info')
    except ImportError:
        return None
    return tuple(info.CUDA_ARCH_LIST) if info.CUDA_VERSION else CPU_ONLY


def check_mmcv_cuda_arch() -> None:
    """Raise RuntimeError if torch sees a GPU that the installed mmcv's ops cannot serve: a build
    without CUDA ops (made where no GPU was visible: every detection run would stop at its first
    NMS, "nms_impl: implementation for device cuda:0 not found"), or one outside its CUDA
    architectures. Does nothing without a GPU, or with an mmcv not built by tools/build_mmcv.py.
    """
    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return
    archs = mmcv_cuda_archs()
    if archs is None:
        return
    if archs == CPU_ONLY:
        raise RuntimeError(f'this node has {torch.cuda.device_count()} GPU(s) ({torch.cuda.get_device_name(0)}), '
                           f"but the installed mmcv was built without CUDA ops: reinstall with "
                           f'{REINSTALL_WITH_CUDA}')
    for index in range(torch.cuda.device_count()):
        message = arch_mismatch_message(torch.cuda.get_device_capability(index),
                                        torch.cuda.get_device_name(index), archs)
        if message:
            raise RuntimeError(message)
