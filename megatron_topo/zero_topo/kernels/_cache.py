"""The compiled-kernel cache, kept private: nothing executable is loaded from a place another user
can write (issue 29).

* A cache folder is used only when it is a real directory (not a symlink) owned by this user with
  no access for group or others (mode 0700): it is created so, an existing one of ours that nobody
  else can write is tightened to 0700, and anything else (another owner, group- or world-writable,
  a symlink, a file) is refused with the reason. Every existing folder above it must be owned by
  this user or root and, where others can write it, carry the sticky bit (so nobody else can
  rename the cache away and put their own in its place).
* A library is loaded only when its SHA-256 equals the one recorded next to it when it was built
  (``NAME.so.sha256``, in the same private folder); a missing or different record means rebuild.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Optional

RECORD_SUFFIX = ".sha256"


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else 0


def _describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _ancestors_problem(d: str) -> Optional[str]:
    me = _uid()
    p = os.path.dirname(os.path.abspath(d))
    while True:
        try:
            st = os.lstat(p)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            if st.st_uid not in (me, 0):
                return f"its parent {p} is owned by {_describe_owner(st.st_uid)}"
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                return f"its parent {p} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


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


def verified(lib_path: str) -> tuple[bool, Optional[str]]:
    """(True, None): the library matches its record; (False, None): there is nothing to verify
    (not built yet, or built without a record); (False, why): it is there but must not be loaded."""
    if not os.path.lexists(lib_path):
        return False, None
    try:
        st = os.lstat(lib_path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != _uid() or st.st_mode & 0o022:
            return False, "is not a regular file of this user that only this user can write"
        with open(lib_path + RECORD_SUFFIX) as f:
            want = f.read(100).strip()
    except FileNotFoundError:
        return False, "has no recorded SHA-256"
    except OSError as e:
        return False, f"cannot be checked ({e.strerror or e})"
    try:
        got = file_sha256(lib_path)
    except OSError as e:
        return False, f"cannot be read ({e.strerror or e})"
    if got != want:
        return False, "differs from the SHA-256 recorded when it was built"
    return True, None
