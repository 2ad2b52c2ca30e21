"""The toolkit's writes into a work dir or an output folder, never through a link: the writers of
``xcit_launch/linkless_writes.py`` (where the way they write is described), their refusals raised as
:class:`~xcit_dense.errors.UnsafeOutputError`, which the tools turn into ``error: ...`` and status 1.
"""
from contextlib import contextmanager
from typing import Iterator

from xcit_launch import linkless_writes
from xcit_launch.linkless_writes import PathLike, UnsafeOutput

from ..errors import UnsafeOutputError

__all__ = ['refuse_link', 'write_bytes', 'writing', 'check_log_folder']


@contextmanager
def _refusals_as_toolkit_errors() -> Iterator[None]:
    try:
        yield
    except UnsafeOutput as exc:
        raise UnsafeOutputError(str(exc)) from exc


def refuse_link(path: PathLike) -> None:
    """``linkless_writes.refuse_link``: a link at ``path`` refused before the work that would write there."""
    with _refusals_as_toolkit_errors():
        linkless_writes.refuse_link(path)


def write_bytes(path: PathLike, data: bytes, replace_link: bool = False) -> None:
    """``linkless_writes.write_bytes``: ``data`` written to ``path`` all or nothing; a link at ``path``
    refused, or replaced where ``replace_link``."""
    with _refusals_as_toolkit_errors():
        linkless_writes.write_bytes(path, data, replace_link)


@contextmanager
def writing(path: PathLike) -> Iterator[str]:
    """``linkless_writes.writing``: the path a library writes ``path`` to by name, renamed into place."""
    with _refusals_as_toolkit_errors(), linkless_writes.writing(path) as written:
        yield written


def check_log_folder(folder: PathLike) -> None:
    """``linkless_writes.check_log_folder``: a run's log folder, refused if a link, another user's or
    holding a link."""
    with _refusals_as_toolkit_errors():
        linkless_writes.check_log_folder(folder)
