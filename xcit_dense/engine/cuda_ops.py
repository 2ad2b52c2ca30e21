"""Run-time check that the installed ops (mmcv._ext) can run on the GPUs present.

Two installs serve ``mmcv._ext`` (tools/install.sh). The default, mmcv-lite with xcit_mmcv_ext,
runs torchvision's kernels: on a GPU node they must be torchvision's CUDA kernels for this torch,
which a tiny ``nms`` and ``roi_align`` on each GPU proves. A compiled mmcv
(``XCIT_MMCV=compiled``) holds CUDA code for the architectures it was built for:
tools/build_mmcv.py writes mmcv/xcit_build_info.py into its wheels (CUDA version and
TORCH_CUDA_ARCH_LIST), and a GPU outside that list would fail inside an mmcv kernel launch ("no
kernel image is available"). check_cuda_ops() says either up front, naming the GPU and the fix.
Which architectures run on which GPU is ``xcit_launch.cuda_arch``'s rule, the one the build uses.
"""
import importlib
from typing import Optional

import torch
import torchvision

from xcit_launch.cuda_arch import arch_mismatch_message, arch_runs_on  # noqa: F401  (the rule, shared with the build)
from xcit_mmcv_ext.finder import serves_mmcv_ext

CPU_ONLY = ()  # what mmcv_cuda_archs() returns for a build without CUDA ops
REINSTALL_WITH_CUDA = 'XCIT_MMCV=compiled XCIT_MMCV_CUDA=1 bash tools/install.sh'


def mmcv_cuda_archs() -> Optional[tuple[str, ...]]:
    """The architectures the installed compiled mmcv's CUDA ops were built for: ``CPU_ONLY`` for a
    build without them, None when unknown (mmcv-lite, or an mmcv not built by tools/build_mmcv.py)."""
    try:
        info = importlib.import_module('mmcv.xcit_build_info')
    except ImportError:
        return None
    return tuple(info.CUDA_ARCH_LIST) if info.CUDA_VERSION else CPU_ONLY


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
        reason = (str(error).strip().splitlines() or [''])[0][:200]
        raise RuntimeError(f'GPU {index} ({torch.cuda.get_device_name(index)}) cannot run torchvision '
                           f"{torchvision.__version__}'s CUDA ops, which serve mmcv._ext's nms and roi_align "
                           f'({reason}): torchvision must be the CUDA build for torch {torch.__version__} '
                           f'(CUDA {torch.version.cuda}); repair with: bash tools/install.sh') from error


def check_cuda_ops() -> None:
    """Raise RuntimeError if torch sees a GPU that the installed ops cannot serve: torchvision's CUDA
    kernels failing there (mmcv-lite), or a compiled mmcv built without CUDA ops (made where no GPU
    was visible: every detection run would stop at its first NMS, "nms_impl: implementation for
    device cuda:0 not found") or outside its CUDA architectures. Does nothing without a GPU, or with
    a compiled mmcv not built by tools/build_mmcv.py.
    """
    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return
    archs = mmcv_cuda_archs()
    if archs is None:
        if serves_mmcv_ext():
            for index in range(torch.cuda.device_count()):
                check_torchvision_cuda_ops(index)
        return
    if archs == CPU_ONLY:
        raise RuntimeError(f'this node has {torch.cuda.device_count()} GPU(s) ({torch.cuda.get_device_name(0)}), '
                           f"but the installed mmcv was built without CUDA ops: reinstall with "
                           f'{REINSTALL_WITH_CUDA}, or bash tools/install.sh for torchvision\'s kernels')
    for index in range(torch.cuda.device_count()):
        message = arch_mismatch_message(torch.cuda.get_device_capability(index),
                                        torch.cuda.get_device_name(index), archs)
        if message:
            raise RuntimeError(message)
