"""Reading small files and following paths taken from files, safely (issue 29).

* :func:`inside` resolves a name read from a file (an HF index's ``weight_map``, a checkpoint's
  ``latest``) inside the folder it belongs to: an absolute path, a ``..`` component, a symlink
  that leads out of the folder, a FIFO, a device or a folder is refused with one line.
* :func:`read_small` reads a small file (``latest``, ``meta.json``, ``config.json``, an index) with a
  size cap, opening it non-blocking so a FIFO cannot hang the reader, and refusing anything but a
  regular file.
* :func:`excerpt` renders a piece of a file's content for an error line: short and escaped.
* :func:`parse_json` / :func:`read_json` parse JSON from a file the run did not just write: a
  syntax error, nesting too deep for the parser (RecursionError), an integer past Python's digit
  limit or bytes that are not UTF-8 all become one :class:`NotJSON` reason (never a traceback);
  :func:`read_json` reads the file capped and non-blocking first.

Errors are raised as ``err`` (the caller's one-line error class: CheckpointError, ConfigError...).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Sequence, Type

KIB, MIB = 1 << 10, 1 << 20


def excerpt(text, limit: int = 40) -> str:
    """A short escaped rendering of file content for an error line (never the whole of it)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    s = str(text)
    cut = len(s) > limit
    r = repr(s[:limit])
    return f"{r[:-1]}...{r[-1]} ({len(s):,} characters)" if cut else r


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def why_not_a_file(path: str) -> str:
    """Why ``path`` (which ``os.path.isfile`` refused) cannot be read, for an error line: ``file not
    found``, or what it is instead (a FIFO is refused, never opened: reading it would block)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "file not found"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return f"is {_kind(st.st_mode)}, not a file; refusing to read it"


def inside(folder: str, name, what: str, err: Type[Exception], also: Sequence[str] = ()) -> str:
    """``folder/name`` for a ``name`` read from ``what``, when it is a regular file inside ``folder``
    (symlinks followed, but only within ``folder`` or the folders in ``also``)."""
    if not isinstance(name, str) or not name:
        raise err(f"{what}: names {excerpt(name)}, not a file name")
    if "\0" in name:
        raise err(f"{what}: names {excerpt(name)}, which holds a NUL character; no file name can")
    bad = next((c for c in name if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:  # a JSON escape such as "\ud800": no UTF-8 file name holds a lone surrogate
        raise err(
            f"{what}: names {excerpt(name)}, which holds the lone surrogate U+{ord(bad):04X} (not a Unicode "
            f"character); no file name can"
        )
    if os.path.isabs(name) or name.startswith("~"):
        raise err(f"{what}: names {excerpt(name)}, an absolute path; only files inside {folder} are read")
    if ".." in name.replace("\\", "/").split("/"):
        raise err(f"{what}: names {excerpt(name)}, which leads out of {folder} ('..'); only files inside it are read")
    path = os.path.join(folder, name)
    not_linked_out(folder, name, what, err, also)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise err(f"{what}: names {excerpt(name)}, which does not exist in {folder}") from None
    except OSError as e:
        raise err(f"{what}: {excerpt(name)} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise err(f"{what}: {excerpt(name)} is {_kind(st.st_mode)}, not a file; refusing to read it")
    return path


def not_linked_out(folder: str, name: str, what: str, err: Type[Exception], also: Sequence[str] = ()) -> None:
    """Refuse ``folder/name`` (one line) when it resolves outside ``folder`` and the folders in
    ``also``: a symbolic link out of its folder. A link within the folder is fine."""
    real = os.path.realpath(os.path.join(folder, name))
    roots = [os.path.realpath(r) for r in (folder, *also)]
    if not any(real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
        raise err(
            f"{what}: {excerpt(name)} is a symbolic link out of {folder} (to {excerpt(real, 80)}); "
            f"only files inside it are read"
        )


class NotAFile(Exception):
    """:func:`read_capped`: the path is not a regular file (``mode``: what it is)."""

    def __init__(self, mode: int):
        super().__init__(_kind(mode))
        self.mode = mode


class OverCap(Exception):
    """:func:`read_capped`: the file holds more than the cap (``size``: its fstat size, or None when
    it grew past the cap while being read)."""

    def __init__(self, size):
        super().__init__(size)
        self.size = size


def read_capped(path: str, cap: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap``: checked by fstat, then by a capped
    read (a file that keeps growing, a /dev/zero-like one, ends too). Opened non-blocking: a FIFO or
    device is refused, never waited on. Raises OSError, :class:`NotAFile` or :class:`OverCap`; the
    callers turn them into their own lines."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(st.st_mode)
        if st.st_size > cap:
            raise OverCap(st.st_size)
        chunks, total = [], 0
        while True:
            b = os.read(fd, min(1 << 20, cap + 1 - total))
            if not b:
                return b"".join(chunks)
            chunks.append(b)
            total += len(b)
            if total > cap:
                raise OverCap(None)
    finally:
        os.close(fd)


def read_small(path: str, cap: int, err: Type[Exception], what: str = "") -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them (a larger file is an error).
    Opened non-blocking: a FIFO or device is refused, not waited on."""
    name = what or path
    try:
        return read_capped(path, cap)
    except NotAFile as e:
        raise err(f"{name} is {_kind(e.mode)}, not a file; refusing to read it") from None
    except OverCap as e:
        if e.size is None:
            raise err(f"{name} grew past {cap:,} bytes while being read") from None
        raise err(f"{name} is {e.size:,} bytes; a file of this kind is at most {cap:,} bytes") from None
    except OSError as e:
        raise err(f"{name} is unreadable: {e.strerror or e}") from None


def read_small_text(path: str, cap: int, err: Type[Exception], what: str = "") -> str:
    raw = read_small(path, cap, err, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise err(f"{what or path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


class NotJSON(ValueError):
    """:func:`parse_json`: the text is not JSON this reader can take; ``str(e)`` is the reason,
    ``cause`` the parser's exception."""

    def __init__(self, reason: str, cause: BaseException):
        super().__init__(reason)
        self.cause = cause


def json_reason(e: BaseException) -> str:
    """A short reason, for an error line, why ``json.loads`` refused a text."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at line {e.lineno} column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    msg = str(e)
    if "integer string conversion" in msg:
        limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
        return f"an integer of more than {limit:,} digits"
    return (msg.splitlines() or [type(e).__name__])[0][:100]


class RepeatedKey(ValueError):
    """:func:`parse_json` with ``unique_keys``: an object names one key twice (``str(e)`` says which)."""


def _unique_pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise RepeatedKey(f"the key {excerpt(k)} appears twice in one object")
        out[k] = v
    return out


def parse_json(text, unique_keys: bool = False):
    """``json.loads(text)`` (``text``: str, or bytes that must be UTF-8, a leading BOM allowed); any
    failure, including a nesting too deep for the parser and an integer past Python's digit limit,
    is :class:`NotJSON`. ``unique_keys``: an object naming a key twice (which json.loads reads as
    the last one, silently) is refused too (the cause a :class:`RepeatedKey`)."""
    try:
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8-sig")
        return json.loads(text, object_pairs_hook=_unique_pairs if unique_keys else None)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise NotJSON(json_reason(e), e) from None


def read_json(path: str, cap: int, err: Type[Exception], what: str = ""):
    """The JSON value in the regular file ``path`` (at most ``cap`` bytes, opened non-blocking; see
    :func:`read_small`); anything else is ``err`` naming the file and the reason."""
    raw = read_small(path, cap, err, what)
    try:
        return parse_json(raw)
    except NotJSON as e:
        raise err(f"{what or path}: not valid JSON ({e})") from None
