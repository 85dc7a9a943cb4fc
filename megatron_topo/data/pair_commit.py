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
from ..safe_files import KIB, read_small_text
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


def finish_interrupted(prefix: str) -> bool:
    """Complete a replacement of ``PREFIX`` that a crash interrupted; True when there was one.
    DataError when the journal is not ours or the files cannot be moved (read-only folder)."""
    journal = journal_path(prefix)
    if not os.path.lexists(journal):
        return False
    text = read_small_text(journal, 4 * KIB, DataError)
    base = re.escape(os.path.basename(prefix))
    try:
        names = json.loads(text)
        ok = isinstance(names, dict) and all(
            isinstance(names.get(k), str) and re.fullmatch(rf"{base}\.{k}\.tmp\.\d+", names[k]) for k in ("bin", "idx")
        )
    except ValueError:
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


def sweep_leftovers(prefix: str, min_age_s: float = 30.0) -> list[str]:
    """Remove the temporary ``PREFIX.bin.tmp.PID`` / ``PREFIX.idx.tmp.PID`` of a writer that died
    without cleaning up (SIGKILL, a crash of the machine): its process is gone from this host and the
    file has not changed for ``min_age_s`` (a writer on another host of a shared file system keeps
    its file fresh). Files a journal names are left to :func:`finish_interrupted`. Returns the
    removed names (the caller says so)."""
    from ..pids import pid_alive

    folder = os.path.dirname(os.path.abspath(prefix))
    base = os.path.basename(prefix)
    pattern = re.compile(rf"{re.escape(base)}\.(bin|idx)\.tmp\.(\d+)")
    named: set[str] = set()
    if os.path.lexists(journal_path(prefix)):
        try:
            named = set(json.loads(read_small_text(journal_path(prefix), 4 * KIB, DataError)).values())
        except (DataError, ValueError, AttributeError, TypeError):
            return []  # finish_interrupted reports a journal that is not ours
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    now = time.time()
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if not m or name in named or int(m.group(2)) == os.getpid() or pid_alive(int(m.group(2))):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= min_age_s:
            remove_quietly(path)
            if not os.path.lexists(path):
                removed.append(name)
    return removed


__all__ = ["SUFFIX", "commit_pair", "finish_interrupted", "journal_path", "sweep_leftovers"]
