"""Whether an exception is an allocation failure: CUDA's ``OutOfMemoryError``, the CPU allocator's
``RuntimeError`` ("can't allocate memory"), ``MemoryError`` (numpy's ``_ArrayMemoryError`` included), also
when a data loader worker raised it (the main process then re-raises it as a ``RuntimeError`` "Caught ...
in DataLoader worker process"). A leaf module: the data checks (which must never skip such a failure as a
bad sample) and the engine's advice (``engine/planning/out_of_memory.py``) both ask it."""
import re

import torch

# the messages of torch's CUDA and CPU allocators, and of a MemoryError re-raised from a data worker
_MESSAGES = re.compile(r"CUDA out of memory|can't allocate memory|Caught (_Array)?MemoryError")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is an allocation failure."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or _MESSAGES.search(str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
