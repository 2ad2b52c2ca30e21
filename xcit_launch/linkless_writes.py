"""Files the toolkit writes into a work dir or an output folder, never through a link (stdlib only:
the light tools use it as it is; ``xcit_dense.io.output_files`` gives its refusals as the toolkit's
``UnsafeOutputError``).

Others may create names in a shared work dir, and a link planted where a plain ``open()`` writes
(a config dump, ``results.json``, a picture) would overwrite the file it points to. Every write here
goes to a new file beside the target, under a random name that is created exclusively and never
through a link (``tempfile.mkstemp``: O_EXCL | O_NOFOLLOW), or into a private folder that
``tempfile.mkdtemp`` creates (mode 0700) for libraries that write by file name; the file is then
renamed over the target's name. A rename replaces the name itself, never a link's target, so a link
planted at the name, even while the file is written, never leads a write out of the folder, and a
reader never sees a half-written file. The writers say what a link already at the name means:
checkpoints replace it (a planted name must not stop a run's saving); the others refuse it in one
line naming it.
"""
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from typing import Iterator, Optional, Union

__all__ = ['UnsafeOutput', 'refuse_link', 'write_bytes', 'writing', 'check_log_folder']

PathLike = Union[str, 'os.PathLike[str]']


class UnsafeOutput(Exception):
    """A file to be written is a link, or a log folder is a link, holds one or is another user's."""


def _umask() -> int:
    """The process's umask, read where Linux shows it (``/proc/self/status``) without changing it;
    elsewhere set and restored, at the write only: importing this module leaves the umask alone."""
    try:
        with open('/proc/self/status') as status:
            for line in status:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def refuse_link(path: PathLike) -> None:
    """Raise UnsafeOutput if ``path`` is a link (a dangling one too)."""
    if os.path.islink(path):
        raise UnsafeOutput(f'{os.fspath(path)} is a symbolic link: the toolkit never writes through '
                           f'one (remove it, or write elsewhere)')


def write_bytes(path: PathLike, data: bytes, replace_link: bool = False) -> None:
    """Write ``data`` to ``path`` all or nothing (written, fsynced, renamed into place; its folder made
    if missing), with the mode a plain ``open()`` would give. A link at ``path`` is refused (UnsafeOutput), or replaced
    where ``replace_link``; OSError as the file system reports it."""
    path = os.fspath(path)
    if not replace_link:
        refuse_link(path)
    folder, name = os.path.split(path)
    os.makedirs(folder or '.', exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder or '.', prefix=f'{name}.tmp-')
    try:
        with os.fdopen(fd, 'wb') as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


@contextmanager
def writing(path: PathLike) -> Iterator[str]:
    """For a library that writes by file name (an image encoder, matplotlib, the ONNX exporter): a path
    of the same name in a private new folder beside ``path`` (its folder made if missing); whatever the
    block writes there is renamed into ``path``'s folder when it ends without an error (a file the
    library adds beside it, an ONNX export's external data, moves too). A link at any of these names
    is refused (UnsafeOutput), before the block runs for ``path`` itself."""
    path = os.fspath(path)
    refuse_link(path)
    folder, name = os.path.split(path)
    os.makedirs(folder or '.', exist_ok=True)
    private = tempfile.mkdtemp(dir=folder or '.', prefix=f'.{name}.tmp-')
    try:
        yield os.path.join(private, name)
        for written in sorted(os.listdir(private)):
            refuse_link(os.path.join(folder, written))
            os.replace(os.path.join(private, written), os.path.join(folder, written))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _owner_of_new_files(folder: str) -> Optional[int]:
    """The owner this process's new files in ``folder`` get (not always its uid: an NFS server maps
    root's to nobody), or None where it may not create one there."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix='.owner-')
    except PermissionError:
        return None
    try:
        return os.fstat(fd).st_uid
    finally:
        os.close(fd)
        os.unlink(probe)


def check_log_folder(folder: PathLike) -> None:
    """Refuse (UnsafeOutput) a run's log folder that is a link, belongs to another user or holds a
    link: MMEngine creates it under the run's timestamp, a name others can plant in a shared work dir
    ahead of time, and opens the log in it by name. Checked before the log opens."""
    folder = os.fspath(folder)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeOutput(f'the log folder {folder} is a symbolic link: the toolkit never writes '
                           f'through one (remove it)')
    owner = _owner_of_new_files(folder)
    if owner is not None and info.st_uid != owner:
        raise UnsafeOutput(f'the log folder {folder} belongs to another user (uid {info.st_uid}): '
                           f'remove it, or use a work dir of your own')
    for root, folders, files in os.walk(folder):
        for entry in folders + files:
            refuse_link(os.path.join(root, entry))
