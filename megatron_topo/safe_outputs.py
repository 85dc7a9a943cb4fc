"""Where a tool may write (issue 29): outputs never replace what the run did not create.

* :func:`checkpoint_step_above` finds a checkpoint step folder at or above a path: nothing but a
  save writes there (its files are digest-checked).
* :func:`check_output_file` checks a file a tool is about to write: not a symlink, FIFO, device or
  folder; not inside a checkpoint step; not one of the run's inputs; an existing file is replaced
  only when it is the tool's own earlier output or ``--force`` is given, and never (even with
  ``--force``) when it is not a file of the kind the tool writes.

Errors are raised as ``err`` (the caller's one-line error class).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Callable, Optional, Sequence, Type

from .safe_files import _kind

STEP_DIR = re.compile(r"(\.tmp_)?global_step\d+(\.old)?")


def checkpoint_step_above(path: str) -> Optional[str]:
    """The checkpoint step folder (``global_stepN``, or any folder holding a ``meta.json``) that
    ``path`` is or lies inside, or None."""
    p = os.path.realpath(path)
    while True:
        if STEP_DIR.fullmatch(os.path.basename(p)) or os.path.isfile(os.path.join(p, "meta.json")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def check_output_file(
    path: str,
    flag: str,
    err: Type[Exception],
    force: bool = False,
    ours: Optional[Callable[[str], bool]] = None,
    kind: Optional[Callable[[str], Optional[str]]] = None,
    inputs: Sequence[str] = (),
) -> None:
    """Refuse to write the file ``path`` (given as ``flag``) over anything the run did not create.

    ``ours(path)``: the existing file is this tool's own earlier output (replaced without --force);
    ``kind(path)``: why the existing file is not a file this tool writes (then it is not replaced,
    even with --force); ``inputs``: the paths the run reads (never an output)."""
    step = checkpoint_step_above(os.path.dirname(os.path.abspath(path)) or ".")
    if step is not None:
        raise err(
            f"{flag} {path} lies inside the checkpoint folder {step}; only a save writes there: write it elsewhere"
        )
    real = os.path.realpath(path)
    for i in inputs:
        if i and os.path.realpath(i) == real:
            raise err(f"{flag} {path} is an input of this run ({i}); it is not overwritten: write it elsewhere")
    if os.path.islink(path):
        raise err(f"{flag} {path} is a symbolic link; it is not replaced (nor what it points to): give another path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise err(f"{flag} {path} cannot be checked ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise err(f"{flag} {path} is {_kind(st.st_mode)}, not a file; it is not replaced")
    why = kind(path) if kind is not None else None
    if why:
        raise err(f"{flag} {path} exists and {why}; it is not replaced, even with --force: write it elsewhere")
    if not force and not (ours is not None and ours(path)):
        raise err(f"{flag} {path} already exists; pass --force to replace it")


def head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (b"" when unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""
