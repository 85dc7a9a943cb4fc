"""The compiled-kernel cache, kept private: nothing executable is loaded from a place another user
can write (issue 29).

* A cache folder is used only when it is a real directory (not a symlink) owned by this user with
  no access for group or others (mode 0700): it is created so, an existing one of ours that nobody
  else can write is tightened to 0700, and anything else (another owner, group- or world-writable,
  a symlink, a file) is refused with the reason. Every existing folder above it must be owned by
  this user or root and, where others can write it, carry the sticky bit (so nobody else can
  rename the cache away and put their own in its place). Symbolic links on the way are followed:
  the folders they lead to (and every folder above those) are checked the same way, and a link
  owned by another user is refused.
* A library is loaded only when its SHA-256 equals the one recorded next to it when it was built
  (``NAME.so.sha256``, in the same private folder); a missing or different record means rebuild. A
  record that is not a small regular file (a FIFO, a device, a link) counts as missing: it is read
  non-blocking with a size cap, never waited on.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Optional

RECORD_SUFFIX = ".sha256"
RECORD_CAP = 4096  # a record is 64 hex digits and a newline


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def _describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _folder_problem(p: str, st: os.stat_result, me: int) -> Optional[str]:
    if st.st_uid not in (me, 0):
        return f"its parent {p} is owned by {_describe_owner(st.st_uid)}"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"its parent {p} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
    return None


def _chain_problem(path: str, me: int) -> Optional[str]:
    """Walk ``path`` (absolute) component by component as the kernel resolves it, following every
    symbolic link: each folder passed through (the link's targets and their parents included) must
    pass :func:`_folder_problem`, and each link must be owned by this user or root (whoever owns a
    link in a sticky folder can replace it). The walk stops at the first component that does not
    exist yet (it will be created by this user, inside a folder already checked)."""
    todo = [c for c in path.split(os.sep) if c]
    cur = os.sep
    try:
        why = _folder_problem(cur, os.stat(cur), me)
    except OSError as e:
        return f"its parent {cur} cannot be inspected ({e.strerror or e})"
    if why:
        return why
    hops = 0
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"its parent {nxt} cannot be inspected ({e.strerror or e})"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (me, 0):
                return f"its parent {nxt} is a symbolic link owned by {_describe_owner(st.st_uid)}"
            hops += 1
            if hops > 40:
                return f"its parent {nxt} passes through too many symbolic links"
            try:
                target = os.readlink(nxt)
            except OSError as e:
                return f"its parent {nxt} cannot be inspected ({e.strerror or e})"
            todo[:0] = [c for c in target.split(os.sep) if c]
            if os.path.isabs(target):
                cur = os.sep
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None  # a file in the way: creating the cache fails, with its own reason
        why = _folder_problem(nxt, st, me)
        if why:
            return why
        cur = nxt
    return None


def _ancestors_problem(d: str) -> Optional[str]:
    """Why a folder above the cache ``d`` could let another user swap the cache, or None: checked
    along the path as written, symbolic links followed (a link to a folder others can write, or a
    link inside the chain owned by someone else, is refused), and along its real path."""
    me = _uid()
    parent = os.path.dirname(os.path.join(os.getcwd(), d))
    why = _chain_problem(parent, me)
    if why:
        return why
    real = os.path.realpath(parent)
    while os.path.lexists(real) is False and os.path.dirname(real) != real:
        real = os.path.dirname(real)
    p = real
    while True:
        try:
            st = os.stat(p)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            why = _folder_problem(p, st, me)
            if why:
                return why
        up = os.path.dirname(p)
        if up == p:
            return None
        p = up


def private_dir(d: str) -> Optional[str]:
    """Make ``d`` a usable private cache folder; None when it is, else why it cannot be used."""
    why = _ancestors_problem(d)
    if why:
        return why
    try:
        os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
        os.mkdir(d, 0o700)
        created = True
    except FileExistsError:
        created = False
    except OSError as e:
        return f"cannot be created ({e.strerror or e})"
    try:
        st = os.lstat(d)
    except OSError as e:
        return f"cannot be inspected ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != _uid():
        return f"is owned by {_describe_owner(st.st_uid)}, not by this user"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not created:
        return f"is writable by group or others (mode {mode:04o}); its contents cannot be trusted"
    if mode != 0o700:
        try:
            os.chmod(d, 0o700)
        except OSError as e:
            return f"cannot be made private ({e.strerror or e})"
    if not os.access(d, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def write_record(lib_path: str, digest: str) -> None:
    """Record ``digest`` for ``lib_path`` (atomically; the folder is private)."""
    rec = lib_path + RECORD_SUFFIX
    tmp = f"{rec}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(digest + "\n")
    os.replace(tmp, rec)


def read_record(lib_path: str) -> tuple[Optional[str], str]:
    """(the SHA-256 recorded for ``lib_path``, "") or (None, why there is no usable record): it is
    missing, or anything but a small regular file (a FIFO, a device, a folder, a symbolic link, a
    large file), which counts as missing. Opened non-blocking and without following a link, so
    nothing at that name can block the reader."""
    rec = lib_path + RECORD_SUFFIX
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(rec, flags)
    except FileNotFoundError:
        return None, "has no recorded SHA-256"
    except OSError as e:  # a symbolic link (ELOOP), unreadable
        kind = "is a symbolic link" if os.path.islink(rec) else f"cannot be read ({e.strerror or e})"
        return None, f"has no usable SHA-256 record ({os.path.basename(rec)} {kind})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"has no usable SHA-256 record ({os.path.basename(rec)} is not a regular file)"
        if st.st_size > RECORD_CAP:
            return None, f"has no usable SHA-256 record ({os.path.basename(rec)} is {st.st_size:,} bytes)"
        return os.read(fd, RECORD_CAP).decode("ascii", "replace").strip(), ""
    except OSError as e:
        return None, f"has no usable SHA-256 record ({os.path.basename(rec)} cannot be read: {e.strerror or e})"
    finally:
        os.close(fd)


def verified(lib_path: str) -> tuple[bool, Optional[str]]:
    """(True, None): the library matches its record; (False, None): there is nothing to verify
    (not built yet, or built without a record); (False, why): it is there but must not be loaded."""
    if not os.path.lexists(lib_path):
        return False, None
    try:
        st = os.lstat(lib_path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_mode & 0o022:
            return False, "is not a regular file of this user that only this user can write"
    except OSError as e:
        return False, f"cannot be checked ({e.strerror or e})"
    want, why = read_record(lib_path)
    if want is None:  # missing, or not a small regular file: as good as missing (rebuilt, recorded anew)
        return False, why
    try:
        got = file_sha256(lib_path)
    except OSError as e:
        return False, f"cannot be read ({e.strerror or e})"
    if got != want:
        return False, "differs from the SHA-256 recorded when it was built"
    return True, None
