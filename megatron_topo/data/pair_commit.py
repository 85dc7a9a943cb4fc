"""Replacing a dataset's ``.bin`` and ``.idx`` as a unit (issue 29).

Two renames cannot be one atomic step, so the switch is journalled: both new files are complete and
fsynced under temporary names, then ``PREFIX.replacing`` (a small JSON naming them) is written
atomically, then the two renames, then the journal is removed. A crash before the journal leaves the
previous pair untouched (only temporary files, which the next writer removes once their process is
gone: :func:`sweep_leftovers`); a crash after it is
finished by the next reader or writer of ``PREFIX`` (:func:`finish_interrupted`), which completes the
renames the journal names: no reader ever sees a new ``.bin`` with an old ``.idx``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time

from ..atomic import fsync_dir, remove_quietly, write_text
from ..safe_files import KIB, NotJSON, parse_json, read_small_text
from .errors import DataError

SUFFIX = ".replacing"


def journal_path(prefix: str) -> str:
    return prefix + SUFFIX


def commit_pair(prefix: str, bin_tmp: str, idx_tmp: str) -> None:
    """Move the finished ``bin_tmp`` / ``idx_tmp`` over ``PREFIX.bin`` / ``PREFIX.idx`` as a unit."""
    write_text(journal_path(prefix), json.dumps({"bin": os.path.basename(bin_tmp), "idx": os.path.basename(idx_tmp)}))
    _roll_forward(prefix, bin_tmp, idx_tmp)


def _roll_forward(prefix: str, bin_tmp: str, idx_tmp: str) -> None:
    for tmp, final in ((bin_tmp, prefix + ".bin"), (idx_tmp, prefix + ".idx")):
        try:
            os.replace(tmp, final)
        except FileNotFoundError:  # renamed already (before a crash, or by a concurrent finisher)
            pass
    folder = os.path.dirname(os.path.abspath(prefix))
    fsync_dir(folder)
    remove_quietly(journal_path(prefix))
    fsync_dir(folder)


def _read_journal(journal: str, prefix: str) -> str:
    """The journal's text. :func:`commit_pair` writes it as a regular file in the dataset's folder;
    a symbolic link there (to anywhere) is not one of ours and is neither followed nor removed."""
    if os.path.islink(journal):
        raise DataError(
            f"{journal}: a symbolic link, not a replacement journal of {prefix} (those are plain files); "
            f"remove it if no replacement of the dataset is running"
        )
    return read_small_text(journal, 4 * KIB, DataError)


def finish_interrupted(prefix: str) -> bool:
    """Complete a replacement of ``PREFIX`` that a crash interrupted; True when there was one.
    DataError when the journal is not ours or the files cannot be moved (read-only folder)."""
    journal = journal_path(prefix)
    if not os.path.lexists(journal):
        return False
    text = _read_journal(journal, prefix)
    base = re.escape(os.path.basename(prefix))
    try:
        names = parse_json(text)
        ok = isinstance(names, dict) and all(
            isinstance(names.get(k), str) and re.fullmatch(rf"{base}\.{k}\.tmp\.[0-9]+", names[k])
            for k in ("bin", "idx")
        )
    except NotJSON:
        ok = False
    if not ok:
        raise DataError(
            f"{journal}: not a replacement journal of {prefix} (it names other files); remove it if no "
            f"replacement of the dataset is running"
        )
    folder = os.path.dirname(os.path.abspath(prefix))
    try:
        _roll_forward(prefix, os.path.join(folder, names["bin"]), os.path.join(folder, names["idx"]))
    except OSError as e:
        raise DataError(
            f"{prefix}: a replacement of its .bin/.idx was interrupted ({journal} is there) and cannot be "
            f"finished here ({e.strerror or e}); run again where the folder is writable"
        ) from None
    return True


def hold_writer_lock(path: str):
    """Mark the temporary ``path`` as being written: an exclusive ``flock`` on a descriptor of its
    own, held until :func:`release_writer_lock` (after the rename: the lock goes with the file).
    The kernel drops it when the writer dies, however it dies. None where the file system has no
    ``flock`` (then :func:`sweep_leftovers` falls back to the file's age)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release_writer_lock(fd) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _abandoned(path: str, min_age_s: float) -> bool:
    """Whether nobody writes the regular file ``path`` any more: no process holds its writer lock
    (:func:`hold_writer_lock`), or, where the file system has no ``flock``, it has not changed for
    ``min_age_s`` (a writer on another host of a shared file system keeps its file fresh)."""
    import fcntl

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # nobody holds it: its writer is gone
    except BlockingIOError:
        return False  # a live writer (on any host) holds it
    except OSError:  # no flock here
        return _abandoned_by_age(path, min_age_s)
    finally:
        os.close(fd)


def sweep_leftovers(prefix: str, min_age_s: float = 30.0) -> list[str]:
    """Remove the temporary ``PREFIX.bin.tmp.PID`` / ``PREFIX.idx.tmp.PID`` of a writer that died
    without cleaning up (SIGKILL, a crash of the machine): its process is gone from this host and
    its ``.bin`` temporary's writer lock is free (:func:`_abandoned`). An ``.idx`` temporary goes
    with its ``.bin`` (it is written last, under the same lock); without one, by its age. Files a
    journal names are left to :func:`finish_interrupted`. Returns the removed names (the caller
    says so)."""
    from ..pids import pid_alive

    folder = os.path.dirname(os.path.abspath(prefix))
    base = os.path.basename(prefix)
    pattern = re.compile(rf"{re.escape(base)}\.(bin|idx)\.tmp\.([0-9]{{1,10}})")
    named: set[str] = set()
    if os.path.lexists(journal_path(prefix)):
        try:
            named = set(parse_json(_read_journal(journal_path(prefix), prefix)).values())
        except (DataError, NotJSON, AttributeError, TypeError):
            return []  # finish_interrupted reports a journal that is not ours
    try:
        names = set(os.listdir(folder))
    except OSError:
        return []
    dead: dict[int, list[str]] = {}
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if m and name not in named and int(m.group(2)) != os.getpid() and not pid_alive(int(m.group(2))):
            dead.setdefault(int(m.group(2)), []).append(name)
    removed = []
    for pid, group in sorted(dead.items()):
        bin_tmp = f"{base}.bin.tmp.{pid}"
        if bin_tmp in names:
            gone = _abandoned(os.path.join(folder, bin_tmp), min_age_s)
        else:  # an .idx alone: no lock to ask
            gone = all(_abandoned_by_age(os.path.join(folder, n), min_age_s) for n in group)
        if not gone:
            continue
        for name in group:
            path = os.path.join(folder, name)
            try:
                regular = stat.S_ISREG(os.lstat(path).st_mode)
            except OSError:  # gone meanwhile (another run's sweep got there first): not ours to name
                continue
            if regular:
                remove_quietly(path)
                if not os.path.lexists(path):
                    removed.append(name)
    return removed


def _abandoned_by_age(path: str, min_age_s: float) -> bool:
    """The fallback where no lock can be asked: a regular file unchanged for ``min_age_s``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime >= min_age_s


__all__ = [
    "SUFFIX",
    "commit_pair",
    "finish_interrupted",
    "hold_writer_lock",
    "journal_path",
    "release_writer_lock",
    "sweep_leftovers",
]
