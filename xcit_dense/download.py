"""Downloading checkpoints: a cache keyed by the whole URL, https only, digests checked and logged.

A URL's file is cached under ``<torch hub dir>/checkpoints/xcit-dense/<hash of the URL>/<name>``,
so a file fetched from one URL is never served for another with the same base name. Plain http
is refused unless ``XCIT_ALLOW_HTTP=1``. The expected SHA-256 is the one a config gives
(``init_cfg=dict(type='Pretrained', checkpoint=URL, sha256=...)``) or the prefix in the file name
(torch.hub's and OpenMMLab's ``name-<sha256 prefix>.pth``); a file that does not match is an error
naming both. Each download's digest is logged so that a user can pin it. The processes of a node
take a file lock, so one of them downloads while the others wait and then read its file.
"""
import fcntl
import hashlib
import logging
import os
import re
import tempfile
from contextlib import contextmanager
from typing import Iterator, Optional
from urllib.parse import unquote, urlparse

import torch
from mmengine.logging import print_log

ALLOW_HTTP = 'XCIT_ALLOW_HTTP'
HASH_IN_NAME = re.compile(r'-([a-f0-9]{8,64})\.[A-Za-z0-9]+$')


class DownloadError(RuntimeError):
    """A URL that is refused, cannot be fetched, or whose file does not match its digest."""


def cache_path(url: str) -> str:
    """Where ``url``'s file is cached: a folder per whole URL, the file under its own base name."""
    name = os.path.basename(unquote(urlparse(url).path))
    if name in ('', '.', '..'):
        name = 'checkpoint.pth'
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


def file_digest(path: str) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _check_digest(url: str, path: str, expected: Optional[str]) -> str:
    actual = file_digest(path)
    if expected and not actual.startswith(expected):
        raise DownloadError(f'{url}: the file {path} has sha256 {actual}, expected {expected}: '
                            f'refused (a corrupt download or another file)')
    return actual


@contextmanager
def _node_lock(folder: str) -> Iterator[None]:
    """An exclusive lock of the cache folder, held by one process of the node at a time."""
    with open(os.path.join(folder, '.lock'), 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_url(url: str) -> None:
    """Refuse any scheme but https (http only with ``XCIT_ALLOW_HTTP=1``)."""
    scheme = urlparse(url).scheme
    if scheme == 'https' or (scheme == 'http' and os.environ.get(ALLOW_HTTP) == '1'):
        return
    if scheme == 'http':
        raise DownloadError(f'{url}: plain http is refused, since anyone on the path can replace '
                            f'the file; use https, or set {ALLOW_HTTP}=1 to allow it')
    raise DownloadError(f'{url}: only https URLs are downloaded')


def download(url: str, sha256: Optional[str] = None) -> str:
    """The local path of ``url``'s file, downloading it once; checked against its digest."""
    check_url(url)
    expected = expected_digest(url, sha256)
    path = cache_path(url)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    with _node_lock(folder):
        if os.path.isfile(path):
            if expected:
                _check_digest(url, path, expected)
            return path
        fd, tmp = tempfile.mkstemp(dir=folder, prefix='.partial-')
        os.close(fd)
        try:
            try:
                torch.hub.download_url_to_file(url, tmp, progress=True)
            except Exception as exc:  # network errors come in many types
                raise DownloadError(f'cannot download {url}: {exc}. Download it elsewhere and point '
                                    f'the config at the local file.') from exc
            actual = _check_digest(url, tmp, expected)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    print_log(f'downloaded {url} to {path}: sha256 {actual} (pin it with sha256=... in init_cfg, '
              f'or a name ending in -{actual[:8]}.pth)', logger='current', level=logging.INFO)
    return path
