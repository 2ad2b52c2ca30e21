"""A downloaded file is hashed once: the first reader hashes it and writes a marker beside it, the
others trust the marker while the file's stat is the one it records, and a file read with no digest
expected is not hashed at all. The hash calls are counted through the module's hash function; the
file is served over plain http (allowed) on loopback."""
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict

import pytest
import torch

from xcit_dense.io import download
from xcit_dense.io.download import ALLOW_HTTP, MARKER, DownloadError, cache_path


@pytest.fixture
def served(file_server, monkeypatch) -> Dict:
    """A checkpoint on the http server: its URL, digest, cached path and marker; ``hashes`` counts the
    calls of the hash function."""
    monkeypatch.setenv(ALLOW_HTTP, '1')
    source = file_server['root'] / 'model.pth'
    torch.save({'state_dict': {'w': torch.arange(3.0)}}, source)
    hashes = []
    real_digest = download._digest

    def counted(f):
        hashes.append(1)
        return real_digest(f)

    monkeypatch.setattr(download, '_digest', counted)
    url = f"{file_server['url']}/model.pth"
    cached = Path(cache_path(url))
    return dict(url=url, digest=hashlib.sha256(source.read_bytes()).hexdigest(), cached=cached,
                marker=cached.parent / MARKER, hashes=hashes, hits=file_server['hits'])


def stat_record(path: Path) -> dict:
    info = os.stat(path)
    return dict(size=info.st_size, mtime_ns=info.st_mtime_ns, ctime_ns=info.st_ctime_ns, inode=info.st_ino)


def test_the_first_reader_hashes_and_the_others_trust_the_marker(served):
    """Before: every read hashed the file (three here), also with no digest expected."""
    url, digest = served['url'], served['digest']
    assert download.download(url, digest) == str(served['cached'])
    assert len(served['hashes']) == 1 and served['hits'] == {'/model.pth': 1}
    assert json.loads(served['marker'].read_text()) == dict(sha256=digest, **stat_record(served['cached']))
    assert download.download(url, digest) == str(served['cached'])
    assert download.download(url, digest[:8]) == str(served['cached'])
    assert len(served['hashes']) == 1
    served['marker'].unlink()
    assert download.download(url) == str(served['cached'])  # no digest expected: nothing to hash
    assert len(served['hashes']) == 1 and not served['marker'].exists()
    assert download.download(url, digest) == str(served['cached'])  # no marker: hashed, marked again
    assert len(served['hashes']) == 2 and json.loads(served['marker'].read_text())['sha256'] == digest
    assert sorted(p.name for p in served['cached'].parent.iterdir()) == ['.lock', MARKER, 'model.pth']


def test_a_file_whose_stat_changed_is_hashed_again(served, tmp_path):
    """A marker that differs from the file's stat in one field, a file touched, a file replaced by a
    copy of the same bytes and mtime (another inode): each hashed again, then marked with its stat."""
    url, digest, cached, marker = served['url'], served['digest'], served['cached'], served['marker']
    download.download(url, digest)
    changes = ('size', 'mtime_ns', 'ctime_ns', 'inode', 'touched', 'replaced')
    for n, change in enumerate(changes, 2):
        if change == 'touched':
            info = os.stat(cached)
            os.utime(cached, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
        elif change == 'replaced':
            shutil.copy2(cached, tmp_path / 'copy')
            os.replace(tmp_path / 'copy', cached)
        else:
            record = json.loads(marker.read_text())
            record[change] += 1
            marker.write_text(json.dumps(record))
        download.download(url, digest)
        assert len(served['hashes']) == n, change
        assert json.loads(marker.read_text()) == dict(sha256=digest, **stat_record(cached)), change
    download.download(url, digest)
    assert len(served['hashes']) == 1 + len(changes)


def test_a_tampered_file_or_a_marker_with_another_digest_is_refused(served):
    """The file rewritten in place with other bytes of its size and its mtime put back (only its
    ctime tells): hashed again and refused. A marker of the file's stat with another digest: refused."""
    url, digest, cached, marker = served['url'], served['digest'], served['cached'], served['marker']
    download.download(url, digest)
    good = cached.read_bytes()
    info = os.stat(cached)
    with open(cached, 'r+b') as f:
        f.write(b'\0' * len(good))
    os.utime(cached, ns=(info.st_atime_ns, info.st_mtime_ns))
    with pytest.raises(DownloadError, match=f'has sha256 {hashlib.sha256(bytes(len(good))).hexdigest()}, '
                                            f'expected {digest}: refused'):
        download.download(url, digest)
    assert len(served['hashes']) == 2
    with open(cached, 'r+b') as f:
        f.write(good)
    marker.write_text(json.dumps(dict(sha256='0' * 64, **stat_record(cached))))
    with pytest.raises(DownloadError, match=f'has sha256 {"0" * 64}, expected {digest}: refused'):
        download.download(url, digest)
    assert len(served['hashes']) == 2  # the marker's digest, trusted as the file's, does not match


def test_a_half_written_marker_is_not_trusted(served):
    """Every cut of a whole marker (as a write stopped part-way would leave it): the file is hashed
    again and read, and the marker rewritten whole."""
    url, digest, marker = served['url'], served['digest'], served['marker']
    download.download(url, digest)
    whole = marker.read_bytes()
    cuts = range(0, len(whole), 7)
    for cut in cuts:
        marker.write_bytes(whole[:cut])
        assert download.download(url, digest) == str(served['cached'])
        assert marker.read_bytes() == whole
    assert len(served['hashes']) == 1 + len(cuts)
