"""Run-time check that this process's GPU can be used and runs the installed ops (mmcv._ext).

It runs once per process, on the process's own GPU only (``torch.cuda.current_device()``, which
``init_distributed`` has set for the rank): a rank that touched every GPU of its node would create
a CUDA context on each (several hundred MB of every GPU, and a refusal on GPUs in exclusive-process
mode). Failures are told apart by the order of the tries, not by CUDA's error text:

1. a plain allocation and ``synchronize`` on the GPU: failing, the GPU cannot be used by this
   process at all (:class:`GpuUnusable`: exclusive mode with another process on it, memory full,
   a GPU fallen off the bus), whatever the ops;
2. the installed ops. Two installs serve ``mmcv._ext`` (tools/install.sh). The default, mmcv-lite
   with xcit_mmcv_ext, runs torchvision's kernels: they must be torchvision's CUDA kernels for this
   torch, which a tiny ``nms`` and ``roi_align`` proves. A compiled mmcv (``XCIT_MMCV=compiled``)
   holds CUDA code for the architectures it was built for: tools/misc/build_mmcv.py writes
   mmcv/xcit_build_info.py into its wheels (CUDA version and TORCH_CUDA_ARCH_LIST), and a GPU
   outside that list would fail inside an mmcv kernel launch ("no kernel image is available").
   Which architectures run on which GPU is ``xcit_launch.cuda_arch``'s rule, the one the build uses.
"""
import importlib
import os
import socket
from typing import Optional

import torch
import torchvision

from xcit_launch.cuda_arch import arch_mismatch_message, arch_runs_on  # noqa: F401  (the rule, shared with the build)
from xcit_mmcv_ext.finder import serves_mmcv_ext

CPU_ONLY = ()  # what mmcv_cuda_archs() returns for a build without CUDA ops
REINSTALL_WITH_CUDA = 'XCIT_MMCV=compiled XCIT_MMCV_CUDA=1 bash tools/install.sh'


class GpuUnusable(RuntimeError):
    """This process cannot allocate on its GPU or wait for it: nothing about the installed ops."""


def mmcv_cuda_archs() -> Optional[tuple[str, ...]]:
    """The architectures the installed compiled mmcv's CUDA ops were built for: ``CPU_ONLY`` for a
    build without them, None when unknown (mmcv-lite, or an mmcv not built by tools/misc/build_mmcv.py)."""
    try:
        info = importlib.import_module('mmcv.xcit_build_info')
    except ImportError:
        return None
    return tuple(info.CUDA_ARCH_LIST) if info.CUDA_VERSION else CPU_ONLY


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [''])[0][:200]


def check_gpu_usable(index: int) -> None:
    """Allocate a little on GPU ``index`` and wait for it; :class:`GpuUnusable` naming the host,
    the rank (``RANK``, 0 without one) and the GPU if that fails."""
    try:
        torch.empty(256, device=torch.device('cuda', index))
        torch.cuda.synchronize(index)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as error:  # CUDA's errors are RuntimeErrors
        raise GpuUnusable(f"GPU {index} of host {socket.gethostname()} cannot be used by rank "
                          f"{os.environ.get('RANK', '0')}: {_first_line(error)} (is the GPU in exclusive-process "
                          f"mode with another process on it, or its memory taken? nvidia-smi shows both)") from error


def check_torchvision_cuda_ops(index: int) -> None:
    """Run torchvision's ``nms`` and ``roi_align`` on GPU ``index``; RuntimeError saying so if they cannot."""
    device = torch.device('cuda', index)
    try:
        boxes = torch.tensor([[0., 0., 4., 4.], [1., 1., 5., 5.]], device=device)
        torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8], device=device), 0.5)
        rois = torch.tensor([[0., 0., 0., 3., 3.]], device=device)
        torch.ops.torchvision.roi_align(torch.ones(1, 1, 4, 4, device=device), rois, 1.0, 2, 2, 2, True)
        torch.cuda.synchronize(device)
    except (RuntimeError, NotImplementedError) as error:
        raise RuntimeError(f'GPU {index} ({torch.cuda.get_device_name(index)}) cannot run torchvision '
                           f"{torchvision.__version__}'s CUDA ops, which serve mmcv._ext's nms and roi_align "
                           f'({_first_line(error)}): torchvision must be the CUDA build for torch '
                           f'{torch.__version__} (CUDA {torch.version.cuda}); repair with: '
                           'bash tools/install.sh') from error


def check_cuda_ops(index: Optional[int] = None) -> None:
    """Raise if this process cannot use its GPU (``index``, default the current device) or the
    installed ops cannot serve it: :class:`GpuUnusable` when a plain allocation there fails, else
    RuntimeError when torchvision's CUDA kernels fail there (mmcv-lite), or the compiled mmcv was
    built without CUDA ops (made where no GPU was visible: every detection run would stop at its
    first NMS, "nms_impl: implementation for device cuda:0 not found") or outside its CUDA
    architectures. Touches no other GPU. Does nothing without a GPU."""
    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return
    index = torch.cuda.current_device() if index is None else index
    check_gpu_usable(index)
    archs = mmcv_cuda_archs()
    if archs is None:
        if serves_mmcv_ext():
            check_torchvision_cuda_ops(index)
        return
    if archs == CPU_ONLY:
        raise RuntimeError(f'GPU {index} ({torch.cuda.get_device_name(index)}) is present, but the installed '
                           f'mmcv was built without CUDA ops: reinstall with {REINSTALL_WITH_CUDA}, or bash '
                           "tools/install.sh for torchvision's kernels")
    message = arch_mismatch_message(torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index), archs)
    if message:
        raise RuntimeError(message)
