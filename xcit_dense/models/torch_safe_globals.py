"""What torch's own weights-only loading accepts of MMEngine's checkpoints, process-wide.

The toolkit reads checkpoints with its own checked unpickler (``xcit_dense/checked_unpickler.py``).
Other readers in the process (a stock tool's or a user's ``torch.load``, weights only by default;
timm's hub) use torch's weights-only unpickler, whose list of allowed globals is process-wide.
:func:`allow_mmengine_checkpoints` adds what MMEngine's checkpoints hold: its ``HistoryBuffer``,
numpy arrays, scalars and dtypes of numeric types, and ``getattr`` for the buffer's statistics
methods. Under torch's unpickler every listed name may be called and every listed type gets its
state set, so each entry checks itself:

- ``builtins.getattr`` resolves only ``HistoryBuffer``'s statistics methods (any attribute of any
  object would reach the builtins module through ``getattr(getattr, '__self__')``);
- ``numpy.ndarray`` names :class:`CheckpointArray`, which only numpy's ``_reconstruct`` makes and
  whose state must be numeric: called directly, ``ndarray((1,), 'O', b'AAAAAAAA')`` would be an
  object array whose element is the raw pointer 0x4141... (a crash on first use);
- ``numpy.dtype`` takes numeric type codes only; numpy scalars are of numeric dtypes.
"""
from typing import Any

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

from ..checked_unpickler import Refused, check_array_state, history_buffer_method, numeric_dtype, numeric_scalar

__all__ = ['CheckpointArray', 'allow_mmengine_checkpoints']

_NUMERIC_CODES = ('f2', 'f4', 'f8', 'c8', 'c16', 'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8', 'b1')


class CheckpointArray(np.ndarray):
    """A numpy array as torch's weights-only unpickler rebuilds one: made by numpy's
    ``_reconstruct`` only (calling the type refuses), its state numeric. It is a plain ndarray in
    all but its type, and pickles as one."""

    def __new__(cls, *args: Any, **kwargs: Any) -> 'CheckpointArray':
        raise Refused('numpy.ndarray is called directly: a checkpoint may rebuild arrays only through '
                      "numpy's _reconstruct (an empty array, then its data)")

    def __setstate__(self, state: Any) -> None:
        check_array_state(state)
        super().__setstate__(state)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.view(np.ndarray).__reduce_ex__(protocol)


def rebuild_array(array_type: Any, shape: Any, code: Any) -> CheckpointArray:
    """numpy's ``_reconstruct(ndarray, (0,), b'b')``: an empty array, filled by the pickle's BUILD."""
    if array_type is not CheckpointArray or shape != (0,) or code not in (b'b', 'b'):
        raise Refused(f'_reconstruct({array_type!r:.40}, {shape!r:.40}, {code!r:.40}) is refused: numpy pickles '
                      f"its arrays as _reconstruct(ndarray, (0,), b'b')")
    return np._core.multiarray._reconstruct(CheckpointArray, (0,), b'b')


def allow_mmengine_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` read MMEngine's checkpoints, and nothing more (see above)."""
    names = {'mmengine.logging.history_buffer.HistoryBuffer': HistoryBuffer,
             'builtins.getattr': history_buffer_method, 'numpy.ndarray': CheckpointArray,
             'numpy.dtype': numeric_dtype, 'numpy._core.multiarray._reconstruct': rebuild_array,
             'numpy.core.multiarray._reconstruct': rebuild_array,
             'numpy._core.multiarray.scalar': numeric_scalar, 'numpy.core.multiarray.scalar': numeric_scalar}
    # the dtypes' own types, so that a dtype's BUILD (its byte order) is allowed
    dtype_types = {type(np.dtype(code)) for code in _NUMERIC_CODES}
    torch.serialization.add_safe_globals([(obj, name) for name, obj in names.items()] + sorted(dtype_types, key=str))
