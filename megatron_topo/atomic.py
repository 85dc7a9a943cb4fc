"""Atomic file output: write under a temporary name in the same directory, fsync the file, rename it
over the target, fsync the directory.

A failed or interrupted write never replaces (or half-replaces) what is already on disk, and the
temporary file is removed. :func:`atomic_open` yields an open file, :func:`atomic_path` a path for
writers that take a file name (``torch.save``, ``savefig``); :func:`write_bytes`,
:func:`write_text` and :func:`write_json` write a whole file at once.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import IO, Any, Iterator, Optional


def temp_name(path: str) -> str:
    """A sibling temporary name unique to this process (same filesystem, so rename is atomic)."""
    return f"{path}.tmp.{os.getpid()}"


def fsync_dir(directory: str) -> None:
    """Persist a rename: fsync the directory entry (best effort where unsupported)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str, path: str) -> None:
    """Rename the finished ``tmp`` over ``path`` and persist the rename."""
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def remove_quietly(path: str) -> None:
    """Remove ``path`` if it can be removed; never raises (cleanup must not hide the first error)."""
    try:
        os.remove(path)
    except OSError:
        pass


def _make_parent(path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


@contextmanager
def atomic_open(path: str, mode: str = "wb", *, tmp: Optional[str] = None, makedirs: bool = True) -> Iterator[IO[Any]]:
    """``with atomic_open(p) as f: f.write(...)`` -> ``p`` appears complete or not at all.

    ``tmp`` overrides the temporary name (default :func:`temp_name`); ``makedirs=False`` writes
    only into a directory that exists (a removed directory is an error, not recreated)."""
    if makedirs:
        _make_parent(path)
    tmp = tmp or temp_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        commit(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


@contextmanager
def atomic_path(path: str, *, tmp: Optional[str] = None, makedirs: bool = True) -> Iterator[str]:
    """``with atomic_path(p) as t: writer(t)`` -> the file the writer made at ``t`` is fsynced and
    renamed to ``p``; on any error it is removed and ``p`` is untouched. Options as :func:`atomic_open`."""
    if makedirs:
        _make_parent(path)
    tmp = tmp or temp_name(path)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        commit(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def write_bytes(path: str, data: bytes, *, makedirs: bool = True) -> None:
    """Write ``data`` as the whole of ``path``, atomically."""
    with atomic_open(path, "wb", makedirs=makedirs) as f:
        f.write(data)


def write_text(path: str, text: str, *, makedirs: bool = True) -> None:
    """Write ``text`` (UTF-8) as the whole of ``path``, atomically."""
    write_bytes(path, text.encode(), makedirs=makedirs)


def write_json(path: str, obj: Any, *, indent: int = 1, sort_keys: bool = False, makedirs: bool = True) -> None:
    """Write ``obj`` as JSON followed by a newline, atomically."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n", makedirs=makedirs)
