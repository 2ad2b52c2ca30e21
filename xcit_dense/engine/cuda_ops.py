"""Run-time check that the installed mmcv's CUDA ops hold code for the GPUs present.

tools/build_mmcv.py writes mmcv/xcit_build_info.py into the wheels it builds (CUDA version and
TORCH_CUDA_ARCH_LIST). A GPU outside that list would fail inside an mmcv kernel launch
("no kernel image is available"); check_mmcv_cuda_arch() says so up front, naming both. Which
architectures run on which GPU is ``xcit_launch.cuda_arch``'s rule, the one the build uses.
"""
import importlib
from typing import Optional

import torch

from xcit_launch.cuda_arch import arch_mismatch_message, arch_runs_on  # noqa: F401  (the rule, shared with the build)


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
