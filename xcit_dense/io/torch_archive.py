"""The zip layout of a torch checkpoint, parsed once and strictly, the way torch's reader finds it.

Python's ``zipfile`` and torch's reader (miniz) can read two different archives in one file:
``zipfile`` takes the central directory that lies directly before the end record, miniz the one
the end record points at; miniz finds a record by its name regardless of case, so of two names that
differ only in case either may be read; and it inflates a deflated record whole, to the size its
central record declares, before anything in it is checked. A check made with one reader therefore
says nothing about what the other reads. :func:`read_layout` accepts only the layout ``torch.save``
writes, in which every reader finds the same records at the same places:

- the end record is the file's last 22 bytes (no archive comment, nothing appended), with the zip64
  end record and its locator directly before it when present, as ``torch.save`` writes them, and
  the central directory directly before those, filled exactly by its entries; one disk;
- every record is stored (``torch.save`` compresses nothing, so nothing is ever inflated), its
  sizes agree, it has no comment, no encryption or other flag than a data descriptor and UTF-8
  names, and no two names are equal ignoring ASCII case;
- each local header agrees with its central record (name, flags, method, CRC and sizes, or a data
  descriptor that agrees), and the records lie end to end from the file's first byte to the
  central directory: none overlaps another or the central directory, none reaches past the file.

It reads the end records, the central directory and each local header (a few dozen bytes a record),
never a record's data. What torch's reader then finds is compared with this parse by the caller
(``checked_unpickler.check_torch_view``).
"""
import os
import struct
from typing import IO, Dict, List, NamedTuple, Sequence, Tuple

END = struct.Struct('<4s4H2LH')  # signature, disk, directory's disk, entries on it, entries, size, offset, comment
LOCATOR = struct.Struct('<4sLQL')  # signature, zip64 end record's disk, its offset, disks
END64 = struct.Struct('<4sQ2H2L4Q')  # signature, size after this field, versions, disks, entries (x2), size, offset
CENTRAL = struct.Struct('<4s6H3L5H2L')  # signature, versions, flags, method, time, date, CRC, sizes, name,
# extra and comment lengths, disk, attributes, local header's offset
LOCAL = struct.Struct('<4s5H3L2H')  # signature, version, flags, method, time, date, CRC, sizes, name, extra lengths
DESCRIPTOR = struct.Struct('<4sL2L')  # signature, CRC, sizes (zip64: DESCRIPTOR64)
DESCRIPTOR64 = struct.Struct('<4sL2Q')
END_SIGNATURE, LOCATOR_SIGNATURE, END64_SIGNATURE = b'PK\x05\x06', b'PK\x06\x07', b'PK\x06\x06'
CENTRAL_SIGNATURE, LOCAL_SIGNATURE, DESCRIPTOR_SIGNATURE = b'PK\x01\x02', b'PK\x03\x04', b'PK\x07\x08'
ZIP64_FIELD = 0x0001  # the extra field holding sizes and offsets of 4 GiB and more
WIDE = 0xFFFFFFFF  # a 32-bit size or offset whose value is in the zip64 field
# the flags torch.save writes: a data descriptor follows the data (bit 3), names are UTF-8 (bit 11)
FLAGS = 0x0008 | 0x0800
HAS_DESCRIPTOR = 0x0008
# zip readers look for the end record in the file's last 64 KiB (the longest comment) and 22 bytes
SEARCHED = 0xFFFF + END.size
SHOWN_CHARS = 40
EXTRA_READ = 128  # bytes of a local header's extra field read with it


class ArchiveRefused(ValueError):
    """A zip archive in which readers could find different records, or compressed ones."""


class ArchiveDamaged(ValueError):
    """A file that is no complete zip archive (truncated, or another format)."""


class Record(NamedTuple):
    """A stored record: its name, the offset of its data, its size in bytes."""

    name: str
    data: int
    size: int


def shown(name: str) -> str:
    """A record's name in a message: at most SHOWN_CHARS characters (names may be 64 KiB long)."""
    return repr(name[:SHOWN_CHARS]) + (f'... ({len(name)} long)' if len(name) > SHOWN_CHARS else '')


def read_layout(f: IO[bytes], size: int) -> List[Record]:
    """The records of the zip archive ``f`` (``size`` bytes), in the central directory's order (the
    order torch's reader lists them), if it is laid out as ``torch.save`` writes archives (see the
    module's docstring); raises :class:`ArchiveRefused` or :class:`ArchiveDamaged`."""
    end = _end_record(f, size)
    entries, directory_size, directory_at = _directory_of(f, end)
    central = _central_entries(_read_at(f, directory_at, directory_size, 'the central directory'), entries)
    data = _check_local_headers(f, size, central, directory_at)
    return [Record(entry.name, data[entry.header], entry.size) for entry in central]


class _Entry(NamedTuple):
    """What a central directory entry says of a record (its name as stored, in bytes)."""

    raw_name: bytes
    name: str
    header: int
    size: int
    flags: int
    crc: int


def _read_at(f: IO[bytes], offset: int, length: int, what: str) -> bytes:
    data = os.pread(f.fileno(), length, offset)  # no seek, no read-ahead: most reads are a few dozen bytes
    if len(data) != length:
        raise ArchiveRefused(f'{what} reaches past the end of the file')
    return data


def _end_record(f: IO[bytes], size: int) -> int:
    """The end record's offset: it must be the last 22 bytes, and the last end record in the searched
    tail (the one miniz takes: it scans back for the first signature with a whole record after it)."""
    searched = min(size, SEARCHED)
    tail = _read_at(f, size - searched, searched, 'the end record')
    found = tail.rfind(END_SIGNATURE, 0, searched - END.size + len(END_SIGNATURE))
    if found < 0:
        raise ArchiveDamaged('no end record: a truncated file, or not a zip archive')
    if found != searched - END.size or END.unpack_from(tail, found)[-1]:
        raise ArchiveRefused(f'{searched - found - END.size} bytes after the end record or an archive comment '
                             f'(torch.save writes neither)')
    return size - END.size


def _directory_of(f: IO[bytes], end: int) -> Tuple[int, int, int]:
    """(entries, size, offset) of the central directory, checked to lie directly before the end
    record (or before the zip64 end record and its locator, directly before the end record)."""
    _, disk, directory_disk, on_disk, entries, directory_size, directory_at, _ = END.unpack(
        _read_at(f, end, END.size, 'the end record'))
    if disk or directory_disk or on_disk != entries:
        raise ArchiveRefused('an archive on several disks')
    directory_end = end
    if end >= LOCATOR.size + END64.size:  # where miniz looks for a zip64 locator
        signature, end64_disk, end64_at, disks = LOCATOR.unpack(
            _read_at(f, end - LOCATOR.size, LOCATOR.size, 'the zip64 locator'))
        if signature == LOCATOR_SIGNATURE:
            directory_end = end - LOCATOR.size - END64.size
            if end64_disk or disks != 1 or end64_at != directory_end:
                raise ArchiveRefused(f'a zip64 locator pointing at offset {end64_at}, not at the zip64 end record '
                                     f'directly before it ({directory_end})')
            (signature, record_size, _, _, disk, directory_disk, on_disk, *wide) = END64.unpack(
                _read_at(f, directory_end, END64.size, 'the zip64 end record'))
            if signature != END64_SIGNATURE or record_size != END64.size - 12:
                raise ArchiveRefused('a zip64 locator without a zip64 end record of the standard size before it')
            if disk or directory_disk or on_disk != wide[0]:
                raise ArchiveRefused('an archive on several disks')
            if any(short not in (value, full) for short, value, full in zip(
                    (entries, directory_size, directory_at), wide, (0xFFFF, WIDE, WIDE))):
                raise ArchiveRefused('end records that disagree on the central directory')
            entries, directory_size, directory_at = wide
    if directory_at + directory_size != directory_end:
        raise ArchiveRefused(f'a central directory at offset {directory_at} of {directory_size} bytes, not directly '
                             f'before the end record ({directory_end}): readers could each read another directory')
    if entries * CENTRAL.size > directory_size:
        raise ArchiveRefused(f'{entries} entries declared in a central directory of {directory_size} bytes')
    return entries, directory_size, directory_at


def _extra_fields(extra: bytes, name: str) -> Dict[int, bytes]:
    """An extra field's parts by id: each (id, length, data) whole, no id twice (``name``: the record's)."""
    fields, at = {}, 0
    while at < len(extra):
        kind, length = struct.unpack_from('<2H', extra, at) if at + 4 <= len(extra) else (None, 0)
        if kind is None or at + 4 + length > len(extra) or kind in fields:
            raise ArchiveRefused(f'the record {shown(name)}: an extra field cut short or repeated')
        fields[kind] = extra[at + 4:at + 4 + length]
        at += 4 + length
    return fields


def _widened(values: Sequence[int], extra: bytes, name: str) -> List[int]:
    """``values`` (sizes, offset) with each 0xFFFFFFFF replaced by the next value of the zip64 field,
    in the order miniz reads them."""
    if WIDE not in values:  # miniz reads the zip64 field only then
        return list(values)
    wide = _extra_fields(extra, name).get(ZIP64_FIELD)
    if wide is None:
        return list(values)
    out, at = [], 0
    for value in values:
        if value == WIDE:
            if at + 8 > len(wide):
                raise ArchiveRefused(f'the record {shown(name)}: a zip64 field shorter than its sizes')
            value = int.from_bytes(wide[at:at + 8], 'little')
            at += 8
        out.append(value)
    return out


def _central_entries(directory: bytes, entries: int) -> List[_Entry]:
    """The central directory's entries, checked one by one; they fill the directory exactly."""
    out: List[_Entry] = []
    names: Dict[bytes, str] = {}
    at = 0
    for _ in range(entries):
        if at + CENTRAL.size > len(directory):
            raise ArchiveRefused('a central directory shorter than its entries')
        (signature, _, _, flags, method, _, _, crc, compressed, size, name_length, extra_length, comment_length,
         disk, _, _, header) = CENTRAL.unpack_from(directory, at)
        name_at, extra_at = at + CENTRAL.size, at + CENTRAL.size + name_length
        at = extra_at + extra_length + comment_length
        if signature != CENTRAL_SIGNATURE or at > len(directory):
            raise ArchiveRefused('a damaged central directory entry')
        raw_name = directory[name_at:extra_at]
        try:
            name = raw_name.decode('utf-8')
        except UnicodeDecodeError:
            raise ArchiveRefused(f'a record name that is not UTF-8 ({raw_name[:SHOWN_CHARS]!r})') from None
        size, compressed, header = _widened((size, compressed, header), directory[extra_at:extra_at + extra_length],
                                            name)
        if method:
            raise ArchiveRefused(f'the record {shown(name)} is compressed (method {method}): torch.save stores '
                                 f'every record, and a compressed one would be inflated whole before anything in '
                                 f'it is checked')
        if flags & ~FLAGS or compressed != size or disk or comment_length:
            raise ArchiveRefused(f'the record {shown(name)} has flags {flags:#06x}, sizes {compressed} and {size}, '
                                 f'disk {disk} or a comment: torch.save writes none of these')
        folded = raw_name.lower()  # ASCII letters only, as miniz compares names
        if folded in names:
            raise ArchiveRefused(f'two records named {shown(names[folded])} and {shown(name)}: torch\'s reader '
                                 f'finds a name regardless of case, so it could read either')
        names[folded] = name
        out.append(_Entry(raw_name, name, header, size, flags, crc))
    if at != len(directory):
        raise ArchiveRefused(f'{len(directory) - at} bytes in the central directory after its entries')
    return out


def _check_local_headers(f: IO[bytes], size: int, entries: List[_Entry], directory_at: int) -> Dict[int, int]:
    """Each record's local header agrees with its central entry, and the records (header, data,
    data descriptor) lie end to end from offset 0 to the central directory. Returns each record's
    data offset by its header's."""
    data: Dict[int, int] = {}
    expected = 0
    for entry in sorted(entries, key=lambda e: e.header):
        if entry.header != expected:
            raise ArchiveRefused(f'the record {shown(entry.name)} starts at offset {entry.header}, not where the '
                                 f'record before it ends ({expected}): records overlap or leave bytes none holds')
        # one read for the header, its name and (mostly) its extra field: torch.save's padding is under 68 bytes
        available = directory_at - entry.header
        if available < LOCAL.size:
            raise ArchiveRefused(f'the local header of the record {shown(entry.name)} runs into the central directory')
        head = _read_at(f, entry.header, min(LOCAL.size + len(entry.raw_name) + EXTRA_READ, available),
                        'a local header')
        (signature, _, flags, method, _, _, crc, compressed, local_size, name_length, extra_length) = LOCAL.unpack(
            head[:LOCAL.size])
        local = head[LOCAL.size:LOCAL.size + name_length + extra_length]
        if len(local) < name_length + extra_length:
            local = _read_at(f, entry.header + LOCAL.size, name_length + extra_length, 'a local header')
        if signature != LOCAL_SIGNATURE or local[:name_length] != entry.raw_name or flags != entry.flags or method:
            raise ArchiveRefused(f'the local header of the record {shown(entry.name)} does not agree with its '
                                 f'central entry (name, flags or method): readers could read different data')
        declared = [crc, *_widened((local_size, compressed), local[name_length:], entry.name)]
        # with a data descriptor (torch.save's way) the local header may leave them 0
        if declared != [entry.crc, entry.size, entry.size] and not (flags & HAS_DESCRIPTOR and declared == [0, 0, 0]):
            raise ArchiveRefused(f'the local header of the record {shown(entry.name)} declares CRC {crc:#010x} and '
                                 f'sizes {declared[1:]}, its central entry {entry.crc:#010x} and {entry.size}')
        data[entry.header] = entry.header + LOCAL.size + name_length + extra_length
        expected = data[entry.header] + entry.size
        if expected > directory_at:
            raise ArchiveRefused(f'the record {shown(entry.name)} ({entry.size} bytes at offset '
                                 f'{data[entry.header]}) runs into the central directory or past the end of the '
                                 f'file ({size} bytes)')
        if flags & HAS_DESCRIPTOR:
            expected += _descriptor_length(f, expected, directory_at, entry)
    if expected != directory_at:
        raise ArchiveRefused(f'{directory_at - expected} bytes between the last record and the central directory '
                             f'that no record holds')
    return data


def _descriptor_length(f: IO[bytes], offset: int, directory_at: int, entry: _Entry) -> int:
    """The length of the data descriptor at ``offset``: it repeats the record's CRC and sizes, 32- or
    64-bit (miniz writes 64-bit ones after 4 GiB, Python's zipfile for large records), and is followed
    by the next local header or the central directory (which tells the two apart for an empty record)."""
    found = _read_at(f, offset, min(DESCRIPTOR64.size + len(LOCAL_SIGNATURE), directory_at - offset),
                     'a data descriptor')
    for layout in (DESCRIPTOR, DESCRIPTOR64):
        if len(found) >= layout.size and \
                layout.unpack_from(found) == (DESCRIPTOR_SIGNATURE, entry.crc, entry.size, entry.size) and \
                (offset + layout.size == directory_at or found[layout.size:layout.size + 4] == LOCAL_SIGNATURE):
            return layout.size
    raise ArchiveRefused(f'the data descriptor of the record {shown(entry.name)} does not repeat its central '
                         f'entry\'s CRC and sizes')
