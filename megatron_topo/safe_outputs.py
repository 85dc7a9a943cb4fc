"""Where a tool may write (issue 29): outputs never replace what the run did not create.

* :func:`checkpoint_step_above` finds a checkpoint step folder at or above a path: nothing but a
  save writes there (its files are digest-checked).
* :func:`check_output_file` checks a file a tool is about to write: not a symlink, FIFO, device or
  folder; not inside a checkpoint step; not one of the run's inputs; an existing file is replaced
  only when it is the tool's own earlier output or ``--force`` is given, and never (even with
  ``--force``) when it is not a file of the kind the tool writes.

* :func:`artifact_above` finds the folder of another kind of artifact that a path is or lies
  inside: a checkpoint step, a checkpoint save folder (ours or GPT-NeoX's: ``latest`` or
  ``global_stepN`` folders), a HuggingFace model folder (``config.json`` + weights);
  :func:`check_output_folder` refuses an output folder there, or one reached through a symbolic link
  the run made up itself (``log_dir/tensorboard``).

Errors are raised as ``err`` (the caller's one-line error class).
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Callable, Optional, Sequence, Type

from .safe_files import _kind

STEP_DIR = re.compile(r"(\.tmp_)?global_step[0-9]+(\.old)?")


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


HF_WEIGHTS = re.compile(r".+\.safetensors|model\.safetensors\.index\.json|pytorch_model.*\.bin")
LATEST = "latest"


STEP_FILES = re.compile(r"meta\.json|mp_rank_[0-9]+_model_states\.pt|zero_pp_rank_.*\.pt|layer_[0-9]+-model_.*\.pt")


def _latest_file(path: str) -> bool:
    """A checkpoint's ``latest``: a small regular file that names a global_stepN folder."""
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 4096:
            return False
        with open(path, "rb") as f:
            return re.fullmatch(rb"\s*global_step[0-9]+\s*", f.read()) is not None
    except OSError:
        return False


def _step_files(folder: str) -> bool:
    """Whether ``folder`` holds a checkpoint step's files (ours: meta.json; GPT-NeoX/DeepSpeed's:
    mp_rank_NN_model_states.pt, zero_pp_rank_*, layer_NN-model_*)."""
    try:
        return os.path.isdir(folder) and any(STEP_FILES.fullmatch(n) for n in os.listdir(folder))
    except OSError:
        return False


def artifact_kind(folder: str) -> Optional[str]:
    """What kind of artifact the folder ``folder`` is (a phrase), or None for a plain folder."""
    if STEP_DIR.fullmatch(os.path.basename(folder)) or os.path.isfile(os.path.join(folder, "meta.json")):
        return "a checkpoint step folder"
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    if LATEST in names and _latest_file(os.path.join(folder, LATEST)):
        return "a checkpoint save folder (it has a latest file)"
    for n in names:
        if re.fullmatch(r"global_step[0-9]+", n) and _step_files(os.path.join(folder, n)):
            return f"a checkpoint save folder (it holds {n})"
    if "config.json" in names and any(HF_WEIGHTS.fullmatch(n) for n in names):
        return "a HuggingFace model folder (config.json and weights)"
    return None


def artifact_above(path: str, own: Sequence[str] = ()) -> Optional[tuple]:
    """(folder, kind) of the nearest artifact folder (:func:`artifact_kind`) that ``path`` is or lies
    inside, symbolic links resolved; a save folder in ``own`` (the run's own, resolved) is not one."""
    own_real = {os.path.realpath(o) for o in own if o}
    p = os.path.realpath(path)
    while True:
        kind = artifact_kind(p)
        if kind is not None and not (p in own_real and kind.startswith("a checkpoint save folder")):
            return p, kind
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


PROBE = ".megatron_topo_write_probe"


def cannot_write_in(folder: str) -> Optional[str]:
    """Why nothing can be created in ``folder`` (a phrase), or None. The check is real: a probe file
    (a probe folder, where ``folder`` does not exist yet: it is made in its nearest existing folder)
    with a name of our own is created exclusively and removed, so /proc, /sys and read-only mounts
    are caught before any work, not only permission bits."""
    p = os.path.abspath(folder or ".")
    missing = False
    while not os.path.isdir(p):
        if os.path.lexists(p):  # a file where a folder goes: the callers' own checks name that
            return None
        parent = os.path.dirname(p)
        if parent == p:
            return "no folder of it exists"
        p, missing = parent, True
    probe = os.path.join(p, f"{PROBE}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        st = os.stat(p)
    except OSError:
        st = None
    try:
        if missing:
            os.mkdir(probe, 0o700)
            os.rmdir(probe)
        else:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            os.close(fd)
            os.remove(probe)
    except OSError as e:
        return f"cannot create {'a folder' if missing else 'a file'} in {p} ({e.strerror or e})"
    if st is not None:  # the probe leaves no trace: a refused run touches nothing, not even the folder's times
        try:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            pass
    return None


def check_derived(head: str, derived: Sequence[tuple], writer: str, elsewhere: str, err: Type[Exception]) -> None:
    """Refuse a ``derived`` folder ((folder, what ``writer`` writes there): one an output folder's
    writer names itself inside it) that is a symbolic link or not a folder; ``head`` opens the line
    (the key or flag and its value), ``elsewhere`` ends it (what to do instead)."""
    for d, inner in derived:
        if os.path.islink(d):
            raise err(
                f"{head}: {d} is a symbolic link (to {os.readlink(d)[:200]!r}); {writer} would write {inner} "
                f"through it into another folder: remove the link or {elsewhere}"
            )
        if os.path.lexists(d) and not os.path.isdir(d):
            raise err(f"{head}: {d} exists and is not a folder; {writer} writes {inner} there: {elsewhere}")


def log_folder_above(path: str, skip: Optional[str] = None) -> Optional[str]:
    """The run log folder (one holding ``metrics.jsonl``) that ``path`` is or lies inside, links
    resolved, or None; ``skip``: a log folder that does not count (the run's own)."""
    mine = os.path.realpath(skip) if skip else None
    p = os.path.realpath(path)
    while True:
        if p != mine and os.path.isfile(os.path.join(p, "metrics.jsonl")):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def check_output_folder(
    key: str,
    path: str,
    err: Type[Exception],
    own: Sequence[str] = (),
    derived: Sequence[tuple] = (),
    what: str = "its outputs",
    writable: bool = True,
) -> None:
    """Refuse the output folder ``path`` (named by the config key ``key``) when it is or lies inside
    another artifact's folder (:func:`artifact_above`; ``own``: the run's own save folder), or when
    one of the ``derived`` folders ((folder, what the run writes there): those the run names itself
    inside ``path``, as ``log_dir/tensorboard``) is a symbolic link or not a folder."""
    found = artifact_above(path, own)
    if found is not None:
        folder, kind = found
        at = "is" if folder == os.path.realpath(path) else "lies inside"
        raise err(
            f"{key} {path} {at} {folder}, {kind}; the run would write {what} into it: set {key} to a folder of its own"
        )
    check_derived(f"{key} {path}", derived, "the run", f"set {key} elsewhere", err)
    why = cannot_write_in(path) if writable else None  # (False: the caller checks that itself)
    if why:
        raise err(f"{key} {path}: {why}; the run writes {what} there: set {key} to a folder it can write")


def check_output_file(
    path: str,
    flag: str,
    err: Type[Exception],
    force: bool = False,
    ours: Optional[Callable[[str], bool]] = None,
    kind: Optional[Callable[[str], Optional[str]]] = None,
    inputs: Sequence[str] = (),
    artifacts: bool = False,
) -> None:
    """Refuse to write the file ``path`` (given as ``flag``) over anything the run did not create.

    ``ours(path)``: the existing file is this tool's own earlier output (replaced without --force);
    ``kind(path)``: why the existing file is not a file this tool writes (then it is not replaced,
    even with --force); ``inputs``: the paths the run reads (never an output); ``artifacts``: refuse
    a path inside any other artifact's folder too (:func:`artifact_above`: a checkpoint save folder,
    a HuggingFace model folder), not only inside a checkpoint step."""
    step = checkpoint_step_above(os.path.dirname(os.path.abspath(path)) or ".")
    if step is not None:
        raise err(
            f"{flag} {path} lies inside the checkpoint folder {step}; only a save writes there: write it elsewhere"
        )
    found = artifact_above(os.path.dirname(os.path.abspath(path)) or ".") if artifacts else None
    if found is not None:
        raise err(
            f"{flag} {path} lies inside {found[0]}, {found[1]}; its files belong to it and this tool adds "
            f"nothing there, even with --force: write it elsewhere"
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
        _check_writable(path, flag, err)
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
    _check_writable(path, flag, err)


def _check_writable(path: str, flag: str, err: Type[Exception]) -> None:
    """Refuse ``path`` before any work when no file can be created in its folder (:func:`cannot_write_in`)."""
    why = cannot_write_in(os.path.dirname(os.path.abspath(path)))
    if why:
        raise err(f"{flag} {path}: {why}; write it elsewhere")


def head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (b"" when unreadable or not a regular
    file). Opened non-blocking: a FIFO put there (e.g. beside the file a caller checked) is never
    waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(n)
    except OSError:
        return b""
    finally:
        os.close(fd)


def safetensors_source(path: str) -> Optional[str]:
    """The ``source`` of a safetensors file's header metadata (``megatron_topo`` in every file
    convert_to_hf writes), or None: not a regular file, unreadable, no such field."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= min(1 << 26, st.st_size - 8):
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    src = meta.get("source") if isinstance(meta, dict) else None
    return src if isinstance(src, str) else None
