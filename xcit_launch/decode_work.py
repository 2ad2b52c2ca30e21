"""Bounds on the work of parsing and decoding a JPEG or PNG, checked in one linear pass over its
bytes before any decoder opens it (``xcit_dense/datasets/files.py``'s ``check_image_file``; the torch-free
``onnx_segmentation.read_image``). Standard library only.

The pixel limit bounds a decoder's memory, not its time. A progressive JPEG may repeat a scan of a
hundred bytes thousands of times, and each scan is a pass over the whole picture (about 66 ms at
8192x8192, within the pixel limit): libjpeg-turbo has a scan limit, but neither OpenCV nor PIL
exposes it, so the scans (SOS markers) are counted here and more than ``MAX_SCANS`` refused. And PIL
reads the markers before the first scan one at a time in Python, a byte at a time between them (64
MB of empty comments cost 15 s and 1.1 GB before the image's size was known): a file of more than
``MAX_SEGMENTS`` marker segments, or more than ``MAX_LOOSE_BYTES`` bytes outside segments before its
first scan, is refused. Real files hold a few dozen segments, about 10 scans when progressive.
PIL reads a PNG's chunks before its first image data one at a time too (8 MB of empty private
chunks cost 7 s): more than ``MAX_PNG_HEADER_CHUNKS`` are refused; real files hold a handful. It reads
each image data chunk in Python as well, about 8 us a chunk whatever its length (1 MB of 12-byte chunks
cost 0.7 s, 16 MB 14 s; OpenCV 0.01 and 0.12 s): a file may hold ``MAX_PNG_HEADER_CHUNKS`` chunks and
one more per ``PNG_BYTES_PER_CHUNK`` of its size, so that this work stays within about 8 ms a MB (2 s at
the default ``max_image_bytes``). libpng writes image data in chunks of 8 KiB, Pillow of 64 KiB.

The JPEG pass reads the file once (it is within ``max_image_bytes``) and finds markers with regular
expressions, so the entropy-coded data between them, with its restart markers, is skipped at C speed;
the PNG pass reads the 8-byte head of each chunk, up to the end chunk or the bound.
"""
import os
import re
import struct
from typing import BinaryIO, Optional

MAX_SCANS = 100
MAX_SEGMENTS = 1024
MAX_LOOSE_BYTES = 64 * 1024
MAX_PNG_HEADER_CHUNKS = 1024
PNG_BYTES_PER_CHUNK = 1024
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'

SOI, EOI, SOS = 0xD8, 0xD9, 0xDA
# a marker: any fill bytes, then its code (0x00 after 0xFF is a stuffed data byte, not a marker)
_MARKER = re.compile(rb'\xff+([^\x00\xff])')
# what ends a scan's entropy-coded data: a marker other than a restart marker (0xD0-0xD7)
_SCAN_END = re.compile(rb'\xff+[^\x00\xd0-\xd7\xff]')
_STANDALONE = {0x01, *range(0xD0, 0xD8), SOI}  # markers without a length


def decode_work_problem(path: str) -> Optional[str]:
    """What makes the JPEG or PNG at ``path`` too much work to parse or decode (see the module), else
    None; None for any other format, and for a damaged file within the bounds (the decoders name it)."""
    with open(path, 'rb') as f:
        head = f.read(8)
        if head == PNG_SIGNATURE:
            return _png_problem(f, os.fstat(f.fileno()).st_size)
        if head[:3] != b'\xff\xd8\xff':
            return None
        f.seek(0)
        return _jpeg_problem(f.read())


def _png_problem(f: BinaryIO, size: int) -> Optional[str]:
    """Too many chunks before a PNG's first image data, or in all for its ``size`` in bytes (``f``
    just past the signature)."""
    limit = MAX_PNG_HEADER_CHUNKS + size // PNG_BYTES_PER_CHUNK
    chunks, data_seen = 0, False
    while True:
        head = f.read(8)
        if len(head) < 8 or head[4:] == b'IEND':
            return None
        chunks += 1
        data_seen = data_seen or head[4:] == b'IDAT'
        if not data_seen and chunks > MAX_PNG_HEADER_CHUNKS:
            return f'a PNG of more than {MAX_PNG_HEADER_CHUNKS} chunks before its image data'
        if chunks > limit:
            return (f'a PNG of more than {limit} chunks ({MAX_PNG_HEADER_CHUNKS}, and one for each '
                    f'{PNG_BYTES_PER_CHUNK} of its {size} bytes)')
        f.seek(struct.unpack('>I', head[:4])[0] + 4, 1)  # the chunk's data and its CRC


def _jpeg_problem(data: bytes) -> Optional[str]:
    """Too many scans, marker segments or loose bytes in the JPEG file's ``data``."""
    pos, segments, scans, loose = 2, 0, 0, 0  # past the start-of-image marker
    while True:
        found = _MARKER.search(data, pos)
        if found is None:
            return None  # ends without an end marker: truncated, the decoders say so
        code = found.group(1)[0]
        if code == EOI:
            return None
        if not scans:
            loose += found.end() - 2 - pos  # junk and fill bytes, which PIL reads one at a time
            if loose > MAX_LOOSE_BYTES:
                return (f'a JPEG with more than {MAX_LOOSE_BYTES} bytes outside marker segments before its '
                        f'first scan')
        segments += 1
        if segments > MAX_SEGMENTS:
            return f'a JPEG of more than {MAX_SEGMENTS} marker segments'
        pos = found.end()
        if code in _STANDALONE:
            continue
        pos += int.from_bytes(data[pos:pos + 2], 'big')
        if code == SOS:
            scans += 1
            if scans > MAX_SCANS:
                return f'a JPEG of more than {MAX_SCANS} scans'
            end = _SCAN_END.search(data, pos)
            pos = end.start() if end else len(data)
