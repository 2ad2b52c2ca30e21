"""mmcv 2.1.0's ``roi_align_forward`` and ``roi_align_backward`` (average pooling) on torchvision's kernels.

Both write into the tensor mmcv's ``RoIAlignFunction`` hands them (``output``, ``grad_input``), as
mmcv's kernels do (the backward by taking torchvision's result as the storage of a ``grad_input``
that owns its memory). torchvision's RoIAlign is mmcv's algorithm (the same bilinear sampling,
``aligned`` half-pixel shift, adaptive ``sampling_ratio`` 0, RoIs clamped to at least 1x1 when not
aligned); what differs is decided here:
- Layout: torchvision makes its input contiguous, so a channels_last feature map is read right
  (mmcv's kernels read its memory as NCHW).
- Dtypes: float16 and bfloat16 inputs are computed in float32, autocast off, forward and backward
  alike, and rounded once into the output's dtype (mmcv computed float16 in float16 and had no
  bfloat16 kernel; torchvision's autocast rule would cast the forward only).
- Determinism: torchvision's CUDA backward adds with atomics. Under
  ``torch.use_deterministic_algorithms(True)`` it raises (or warns with ``warn_only=True``), as
  PyTorch's own non-deterministic ops do; the CPU kernels are deterministic.
- Max pooling (``pool_mode=0``) is refused: torchvision has no such RoIAlign.
"""
import warnings

import torch
import torchvision  # noqa: F401  (registers the torch.ops.torchvision kernels called here)
from torch import Tensor

from .left_out import not_served
from .precision import compute_dtype

AVG_POOL = 1  # mmcv's pool_mode code for average pooling (0: max)


def _check_avg(pool_mode: int) -> None:
    if pool_mode != AVG_POOL:
        raise not_served('roi_align_forward', ' with max pooling')


def alert_nondeterministic(device: torch.device) -> None:
    """Raise (or warn, with ``warn_only``) when deterministic algorithms are asked for and the
    backward would run torchvision's atomics-based CUDA kernel."""
    if device.type != 'cuda' or not torch.are_deterministic_algorithms_enabled():
        return
    message = ('roi_align_backward (torchvision\'s CUDA kernel, used as mmcv._ext) does not have a '
               'deterministic implementation, but torch.use_deterministic_algorithms(True) is set')
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message)
    else:
        raise RuntimeError(message)


def roi_align_forward(input: Tensor, rois: Tensor, output: Tensor, argmax_y: Tensor, argmax_x: Tensor,
                      aligned_height: int, aligned_width: int, spatial_scale: float, sampling_ratio: int,
                      pool_mode: int, aligned: bool) -> None:
    """Average-pool each RoI (batch index, x1, y1, x2, y2) of ``input`` into ``output`` (K, C, h, w)."""
    _check_avg(pool_mode)
    dtype = compute_dtype(input.dtype)
    with torch.autocast(input.device.type, enabled=False):
        pooled = torch.ops.torchvision.roi_align(input.to(dtype), rois.to(dtype), float(spatial_scale),
                                                 int(aligned_height), int(aligned_width),
                                                 int(sampling_ratio), bool(aligned))
    output.copy_(pooled)


def roi_align_backward(grad_output: Tensor, rois: Tensor, argmax_y: Tensor, argmax_x: Tensor,
                       grad_input: Tensor, aligned_height: int, aligned_width: int, spatial_scale: float,
                       sampling_ratio: int, pool_mode: int, aligned: bool) -> None:
    """Write the gradient of ``roi_align_forward`` with respect to its input into ``grad_input``."""
    _check_avg(pool_mode)
    alert_nondeterministic(grad_output.device)
    dtype = compute_dtype(grad_output.dtype)
    batch, channels, height, width = grad_input.shape
    with torch.autocast(grad_output.device.type, enabled=False):
        grad = torch.ops.torchvision._roi_align_backward(
            grad_output.to(dtype), rois.to(dtype), float(spatial_scale), int(aligned_height),
            int(aligned_width), batch, channels, height, width, int(sampling_ratio), bool(aligned))
    if grad.dtype == grad_input.dtype and _owns_its_storage(grad_input):
        # mmcv's fresh zeros take torchvision's result as their storage: no copy of a map-sized
        # gradient (140 MB at 800x1333's stride 4: a fifth of the mask head's backward)
        grad_input.set_(grad)
    else:
        grad_input.copy_(grad)


def _owns_its_storage(tensor: Tensor) -> bool:
    """Whether ``tensor`` is the whole of its storage (no view into another tensor's memory)."""
    return (tensor.is_contiguous() and tensor.storage_offset() == 0
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())
