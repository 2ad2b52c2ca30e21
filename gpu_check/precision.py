"""The numeric settings the check's comparisons run under."""
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def tf32_off() -> Iterator[None]:
    """cuBLAS and cuDNN in full float32 inside the block (TF32 alone moves a float32 result by about
    1e-3, as much as the differences a comparison looks for); the settings before are put back."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
