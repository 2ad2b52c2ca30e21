"""Downloading checkpoints: a cache keyed by the whole URL, https only, links never followed, sizes
capped, digests checked and logged.

A URL's file is cached under ``<torch hub dir>/checkpoints/xcit-dense/<hash of the URL>/<name>``,
so a file fetched from one URL is never served for another with the same base name. Plain http
is refused unless ``XCIT_ALLOW_HTTP=1``, for the URL and for every redirect (https may only redirect
to https), and the log names the URL the file finally came from. The cache's folders are created
and opened without following links and must belong to the user: a co-user of a group-shared
``TORCH_HOME`` who plants the (predictable) folder of a URL, or a link in its place, gets an error,
never a download written where the link points. A download stops at ``XCIT_MAX_DOWNLOAD_BYTES``
(default 8 GiB, far above any released checkpoint), whether or not the server declares a length,
and when, after its first ``RATE_GRACE_S`` seconds, it has averaged fewer than
``XCIT_MIN_DOWNLOAD_RATE`` bytes a second (default 16 KiB; 0 for no floor): each read waits at most
60 s, but a server that sends a byte every few seconds would otherwise hold the cache's lock, and
every process waiting on it, without end.
The expected SHA-256 is the one a config gives
(``init_cfg=dict(type='Pretrained', checkpoint=URL, sha256=...)``) or the prefix in the file name
(torch.hub's and OpenMMLab's ``name-<sha256 prefix>.pth``); a file that does not match is an error
naming both. Each download's digest is logged so that a user can pin it.

The processes that share the cache folder of a URL (a node's, where the cache is on a local disk)
take turns under a file lock in it: the first downloads the file, hashes it and writes a marker beside
it (``.sha256``: the digest and the file's size, mtime, ctime and inode, written to a temporary file
and renamed into place); the others trust the marker's digest while the file's stat is the one it
records, and hash the file again (rewriting the marker) when it is not. A cached file is not hashed
at all when no digest is expected.
"""
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
import urllib.request
from contextlib import contextmanager
from typing import BinaryIO, Iterator, Optional
from urllib.parse import unquote, urlparse

import torch
from mmengine.logging import print_log

ALLOW_HTTP = 'XCIT_ALLOW_HTTP'
MAX_BYTES = 'XCIT_MAX_DOWNLOAD_BYTES'
DEFAULT_MAX_BYTES = 8 << 30
MIN_RATE = 'XCIT_MIN_DOWNLOAD_RATE'
DEFAULT_MIN_RATE = 16 << 10  # bytes a second: a 500 MB checkpoint in 9 hours
RATE_GRACE_S = 60  # before the floor applies: a connection's slow start, a server's first reply
READ_TIMEOUT_S = 60
_CHUNK = 1 << 20
HASH_IN_NAME = re.compile(r'-([a-f0-9]{8,64})\.[A-Za-z0-9]+$')
MARKER = '.sha256'  # beside the cached file: its digest and the stat of the file it was taken of
_MARKER_MAX_BYTES = 4096


class DownloadError(RuntimeError):
    """A URL that is refused, cannot be fetched, or whose file does not match its digest."""


def cache_path(url: str) -> str:
    """Where ``url``'s file is cached: a folder per whole URL, the file under its own base name."""
    name = os.path.basename(unquote(urlparse(url).path))
    if name in ('', '.', '..'):
        name = 'checkpoint.pth'
    elif name.startswith('.'):  # the folder's own entries (the lock, the marker) start with a dot
        name = f'checkpoint{name}'
    key = hashlib.sha256(url.encode()).hexdigest()[:24]
    return os.path.join(torch.hub.get_dir(), 'checkpoints', 'xcit-dense', key, name)


def expected_digest(url: str, sha256: Optional[str]) -> Optional[str]:
    """The digest (or digest prefix) the file must have: the given one, else the file name's."""
    if sha256:
        if not re.fullmatch(r'[a-fA-F0-9]{8,64}', sha256):
            raise DownloadError(f'sha256 {sha256!r} for {url} is not a hex digest (8 to 64 digits)')
        return sha256.lower()
    match = HASH_IN_NAME.search(os.path.basename(urlparse(url).path))
    return match.group(1) if match else None


def _digest(f: BinaryIO) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(_CHUNK), b''):
        digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: str) -> str:
    """The SHA-256 of a file, read in chunks."""
    with open(path, 'rb') as f:
        return _digest(f)


def _check_digest(url: str, path: str, actual: str, expected: Optional[str]) -> str:
    if expected and not actual.startswith(expected):
        raise DownloadError(f'{url}: the file {path} has sha256 {actual}, expected {expected}: '
                            f'refused (a corrupt download or another file)')
    return actual


def _stat_record(info: os.stat_result) -> dict:
    """What the marker records of a file: enough that a file replaced or written since is told apart."""
    return dict(size=info.st_size, mtime_ns=info.st_mtime_ns, ctime_ns=info.st_ctime_ns, inode=info.st_ino)


def _marked_digest(folder: int, info: os.stat_result) -> Optional[str]:
    """The digest the folder's marker records for the file of stat ``info``; None where there is no
    marker, it cannot be read or parsed (a half-written one), or it was taken of another file."""
    try:
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(fd, 'rb') as f:
        text = f.read(_MARKER_MAX_BYTES + 1)
    try:
        record = json.loads(text)
    except ValueError:
        return None
    expected = _stat_record(info)
    if not isinstance(record, dict) or {key: record.get(key) for key in expected} != expected:
        return None
    digest = record.get('sha256')
    return digest if isinstance(digest, str) and re.fullmatch(r'[0-9a-f]{64}', digest) else None


def _write_marker(folder: int, digest: str, info: os.stat_result) -> None:
    """Record ``digest`` with the stat ``info`` of the file it was taken of: written to a temporary
    file and renamed over the marker, so that a reader finds the whole record or the one before."""
    tmp = f'{MARKER}.tmp-{secrets.token_hex(8)}'
    fd = _open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, folder)
    try:
        with os.fdopen(fd, 'w') as f:
            json.dump(dict(sha256=digest, **_stat_record(info)), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, MARKER, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as exc:
        raise DownloadError(f'cannot write the digest marker in the download cache: {exc.strerror or exc}') from exc
    finally:
        try:
            os.unlink(tmp, dir_fd=folder)
        except FileNotFoundError:
            pass


def _known_digest(f: BinaryIO, folder: int) -> str:
    """The digest of the cached file open as ``f``: the marker's while the file's stat is the one it
    records, else hashed and the marker rewritten (for the processes after this one)."""
    info = os.fstat(f.fileno())
    digest = _marked_digest(folder, info)
    if digest is None:
        digest = _digest(f)
        _write_marker(folder, digest, info)
    return digest


def _open_nofollow(name: str, flags: int, folder_fd: int, mode: int = 0o644) -> int:
    """``os.open`` of ``name`` in ``folder_fd`` that refuses a link in its place (the error names it)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder_fd)
    except OSError as exc:
        raise DownloadError(f'cannot open {name} in the download cache: {exc.strerror} (a link or '
                            f'another kind of file in its place is refused)') from exc


def _own_folder(parent_fd: int, name: str, where: str) -> int:
    """Open (creating it if needed) folder ``name`` of ``parent_fd``: never through a link, and only
    one that belongs to this user and that nobody else may write to."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = _open_nofollow(name, os.O_RDONLY | os.O_DIRECTORY, parent_fd)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise DownloadError(f'the download cache folder {where} belongs to another user (uid {info.st_uid}) '
                            f'or others may write to it: refused, since its files could be replaced; '
                            f'remove it, or set TORCH_HOME to a folder of your own')
    return fd


@contextmanager
def _cache_folder(path: str) -> Iterator[int]:
    """The folder of ``path`` (``.../checkpoints/xcit-dense/<key>``), opened as checked by
    :func:`_own_folder` at its two toolkit levels, and exclusively locked: one process at a time of
    those that share the folder."""
    key_folder = os.path.dirname(path)
    toolkit_folder = os.path.dirname(key_folder)
    os.makedirs(os.path.dirname(toolkit_folder), exist_ok=True)  # the hub's own: as the user set it
    hub_fd = os.open(os.path.dirname(toolkit_folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        toolkit_fd = _own_folder(hub_fd, os.path.basename(toolkit_folder), toolkit_folder)
    finally:
        os.close(hub_fd)
    try:
        folder_fd = _own_folder(toolkit_fd, os.path.basename(key_folder), key_folder)
    finally:
        os.close(toolkit_fd)
    try:
        lock = _open_nofollow('.lock', os.O_RDWR | os.O_CREAT, folder_fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield folder_fd
        finally:
            os.close(lock)  # releases the lock
    finally:
        os.close(folder_fd)


def max_download_bytes() -> int:
    """The size cap of one download: ``XCIT_MAX_DOWNLOAD_BYTES``, else 8 GiB."""
    value = os.environ.get(MAX_BYTES)
    try:
        return int(value) if value else DEFAULT_MAX_BYTES
    except ValueError:
        raise DownloadError(f'{MAX_BYTES}={value!r} is not a number of bytes') from None


def min_download_rate() -> int:
    """The floor of a download's average rate after its first ``RATE_GRACE_S`` seconds, in bytes a
    second: ``XCIT_MIN_DOWNLOAD_RATE``, else 16 KiB; 0 for none."""
    value = os.environ.get(MIN_RATE)
    try:
        rate = int(value) if value else DEFAULT_MIN_RATE
    except ValueError:
        rate = -1
    if rate < 0:
        raise DownloadError(f'{MIN_RATE}={value!r} is not a number of bytes a second')
    return rate


class _RedirectsChecked(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL :func:`check_url` accepts (https to http is refused)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_url(newurl, redirected_from=req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(url: str, out: BinaryIO) -> str:
    """Write ``url``'s body to ``out``, redirects checked, at most :func:`max_download_bytes`
    bytes and no slower on average than :func:`min_download_rate` after ``RATE_GRACE_S``; returns
    the URL the body came from."""
    cap, floor = max_download_bytes(), min_download_rate()
    opener = urllib.request.build_opener(_RedirectsChecked)
    request = urllib.request.Request(url, headers={'User-Agent': 'xcit-dense'})
    with opener.open(request, timeout=READ_TIMEOUT_S) as response:
        declared = response.headers.get('Content-Length')
        if declared and declared.isdigit() and int(declared) > cap:
            raise DownloadError(f'{url} declares {int(declared)} bytes, over the limit of {cap} ({MAX_BYTES})')
        size, start = 0, time.monotonic()
        # read1: what has arrived, up to a chunk, so that a trickle is measured as it comes
        for chunk in iter(lambda: response.read1(_CHUNK), b''):
            size += len(chunk)
            if size > cap:
                raise DownloadError(f'{url} sent more than {cap} bytes, the limit ({MAX_BYTES}): stopped')
            out.write(chunk)
            elapsed = time.monotonic() - start
            if elapsed > RATE_GRACE_S and size < floor * elapsed:
                raise DownloadError(f'{url} sent {size} bytes in {elapsed:.0f} s, under the floor of {floor} '
                                    f'bytes a second ({MIN_RATE}): stopped')
        return response.geturl()


def check_url(url: str, redirected_from: Optional[str] = None) -> None:
    """Refuse any scheme but https (http only with ``XCIT_ALLOW_HTTP=1``)."""
    scheme = urlparse(url).scheme
    if scheme == 'https' or (scheme == 'http' and os.environ.get(ALLOW_HTTP) == '1'):
        return
    via = f' (redirected from {redirected_from})' if redirected_from else ''
    if scheme == 'http':
        raise DownloadError(f'{url}{via}: plain http is refused, since anyone on the path can replace '
                            f'the file; use https, or set {ALLOW_HTTP}=1 to allow it')
    raise DownloadError(f'{url}{via}: only https URLs are downloaded')


def download(url: str, sha256: Optional[str] = None) -> str:
    """The local path of ``url``'s file, downloading it once; checked against its digest where one is
    expected (hashed once: see :data:`MARKER`)."""
    check_url(url)
    expected = expected_digest(url, sha256)
    path = cache_path(url)
    name = os.path.basename(path)
    with _cache_folder(path) as folder:
        try:
            cached = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:
            cached = None
        except OSError as exc:
            raise DownloadError(f'cannot read the cached {path}: {exc.strerror} (a link in its place is '
                                f'refused)') from exc
        if cached is not None:
            with os.fdopen(cached, 'rb') as f:
                if expected:
                    _check_digest(url, path, _known_digest(f, folder), expected)
            return path
        partial = f'.partial-{secrets.token_hex(8)}'
        out = os.fdopen(_open_nofollow(partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, folder), 'w+b')
        try:
            with out:
                print_log(f'downloading {url}', logger='current', level=logging.INFO)
                try:
                    source = _fetch(url, out)
                except DownloadError:
                    raise
                except Exception as exc:  # network errors come in many types
                    raise DownloadError(f'cannot download {url}: {exc}. Download it elsewhere and point '
                                        f'the config at the local file.') from exc
                out.flush()
                os.fsync(out.fileno())
                out.seek(0)
                actual = _check_digest(url, path, _digest(out), expected)
            os.replace(partial, name, src_dir_fd=folder, dst_dir_fd=folder)
            _write_marker(folder, actual, os.stat(name, dir_fd=folder, follow_symlinks=False))
        finally:
            try:
                os.unlink(partial, dir_fd=folder)
            except FileNotFoundError:
                pass
    came_from = f' (redirected to {source})' if source != url else ''
    print_log(f'downloaded {url}{came_from} to {path}: sha256 {actual} (pin it with sha256=... in init_cfg, '
              f'or a name ending in -{actual[:8]}.pth)', logger='current', level=logging.INFO)
    return path
