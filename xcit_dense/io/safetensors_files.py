"""Safetensors files read as checkpoints, by content, through the ``safetensors`` package: no pickle.

A safetensors file opens with its JSON header's length (8 bytes, little-endian) and then the header
itself, a JSON object: its ``{`` is the ninth byte. A torch checkpoint never has one there (a zip
archive's ninth byte is its compression method, a pickle's lies inside its first opcodes' operands),
so :func:`load_weights_file`, the one place where a checkpoint file's bytes become an object, tells
the two apart by those bytes and not by the name. A file whose name says safetensors but whose bytes
do not is refused, never unpickled.

The file is read whole into memory and parsed from those bytes (``safetensors.torch.load``), never
memory-mapped: a mapped file truncated by another process kills the reading one. What that costs is
the file's size twice (its bytes, then the tensors copied out of them), inside the data budget the
checked unpickler allows a file of that size (``checked_unpickler.DATA_PER_FILE_BYTE``). The
``safetensors`` parser refuses a header longer than the file, offsets that overlap, leave gaps or pass
the end, shapes that do not match their bytes and dtypes it does not know; each becomes one line.

A safetensors file is flat (names to tensors): its tensors come back as ``{'state_dict': tensors}``,
which ``weights.py`` reads in any of the layouts it knows (timm's keys, the authors' ``pos_embeder``
names, the toolkit's ``backbone.``-prefixed or whole-model keys).
"""
import os
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes

from .checked_unpickler import MAX_REASON, load_checked

HEADER_LENGTH_BYTES = 8
SUFFIX = '.safetensors'


class SafetensorsRefused(ValueError):
    """A file that is not a readable safetensors file, or that is named like one and is not."""


def opens_as_safetensors(head: bytes) -> bool:
    """Whether a file's first bytes are a safetensors file's: a header length, then ``{``."""
    return head[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + 1] == b'{'


def read_safetensors(data: bytes, map_location: Any = 'cpu') -> dict:
    """``{'state_dict': tensors}`` of a safetensors file's bytes, in their names' order, on
    ``map_location`` when it names a device. Raises :class:`SafetensorsRefused` in one line."""
    try:
        tensors = load_safetensors_bytes(data)
    except Exception as exc:  # the parser's SafetensorError; torch's own for a dtype it has no type for
        text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise SafetensorsRefused(f'not a readable safetensors file ({text[:MAX_REASON]})') from exc
    device = torch.device(map_location) if isinstance(map_location, (str, torch.device)) else None
    # by name: the parser hands them in no fixed order, and messages list keys in the checkpoint's order
    return {'state_dict': {key: tensors[key] if device is None else tensors[key].to(device)
                           for key in sorted(tensors)}}


def load_weights_file(path: str, map_location: Any = 'cpu') -> Any:
    """The object in the checkpoint file ``path``: a safetensors file's tensors (:func:`read_safetensors`),
    anything else read by ``checked_unpickler.load_checked``, except a file named ``*.safetensors`` that
    is not one, which is refused."""
    with open(path, 'rb') as f:
        if opens_as_safetensors(f.read(HEADER_LENGTH_BYTES + 1)):
            f.seek(0)
            return read_safetensors(f.read(), map_location)
    if os.fspath(path).endswith(SUFFIX):
        raise SafetensorsRefused(f'named {SUFFIX} but it does not open with a safetensors header (a pickle or '
                                 f'torch archive?): refused, not unpickled')
    return load_checked(path, map_location)
