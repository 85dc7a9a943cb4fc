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


def _taken(tmp: str, st: os.stat_result) -> Optional[str]:
    """Why the existing ``tmp`` may not be written as this write's temporary (None: a stale
    temporary of a dead process that had our pid, a regular file of one name, which is reused)."""
    import stat

    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return "a file with other names (hard links)"
    return None


class TempRefused(OSError):
    """The temporary name of a write is taken by something it may not write through (named as is)."""


def _as_target(e: OSError, tmp: str, path: str) -> OSError:
    """``e`` naming the target ``path`` instead of this write's internal temporary ``tmp`` (a
    failure to create or write it, e.g. a folder that cannot take files or a full disk, is the
    target's), so the one error line a tool prints names the file the user asked for."""
    if isinstance(e, TempRefused) or e.filename != tmp:
        return e
    return OSError(e.errno, e.strerror, path)


def _refuse(tmp: str, why: str) -> None:
    import errno

    raise TempRefused(
        errno.EEXIST, f"the temporary name of this write is {why}; it is not written through: remove it", tmp
    )


def _open_temp(tmp: str, mode: str) -> IO[Any]:
    """``tmp`` opened for writing, never through a link, into a FIFO or device, or into a file that
    has other names: those are refused (OSError naming ``tmp``), never truncated or followed."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except OSError as e:
        try:
            st = os.lstat(tmp)
        except OSError:
            raise e from None
        _refuse(tmp, _taken(tmp, st) or "not writable")
    try:
        why = _taken(tmp, os.fstat(fd))
        if why:
            _refuse(tmp, why)
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


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
        f = _open_temp(tmp, mode)  # refused before anything is written: nothing of ours to remove
    except OSError as e:
        raise _as_target(e, tmp, path) from None
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        commit(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise _as_target(e, tmp, path) from None
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
        why = _taken(tmp, os.lstat(tmp))
    except FileNotFoundError:
        why = None
    if why:
        _refuse(tmp, why)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        commit(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise _as_target(e, tmp, path) from None
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
