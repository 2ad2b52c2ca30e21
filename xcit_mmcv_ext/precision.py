"""The dtype the served ops compute in: float32 and float64 as given, float16 and bfloat16 in float32.

mmcv's kernels computed half precision in half (or had no bfloat16 kernel); here a half-precision
input is widened once, computed with autocast off, and the result rounded once into the caller's
tensor, forward and backward alike.
"""
import torch

KERNEL_DTYPES = (torch.float32, torch.float64)  # what torchvision's kernels compute in, on CPUs and GPUs
FLT_MIN = torch.finfo(torch.float32).tiny  # mmcv's focal losses clamp probabilities to C's FLT_MIN
FLT_MAX = torch.finfo(torch.float32).max  # mmcv's roi_pool starts each bin's maximum at -FLT_MAX


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if torchvision's kernels compute in it, else float32."""
    return dtype if dtype in KERNEL_DTYPES else torch.float32


def check_im2col_step(batch: int, im2col_step: int, op: str) -> int:
    """The samples per chunk, as mmcv's kernels take it: ``min(batch, im2col_step)``, dividing the batch."""
    step = min(batch, int(im2col_step))
    if step < 1 or batch % step:
        raise ValueError(f'{op}: the batch ({batch}) must be divisible by im2col_step ({im2col_step})')
    return step
