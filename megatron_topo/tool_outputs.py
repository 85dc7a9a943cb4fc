"""Where a benchmark or measurement tool writes its results (issue 29: an output never replaces what
the run did not create). One rule for bench_data, bench_kernels, bench_model, bench_sharding,
bench_convergence, measure_collectives and emulate_cluster:

* An output FILE (``--json``, ``--stats-json``, ``DIR/collectives.json``, ``DIR/results.json`` ...)
  is checked before any benchmark work (:func:`check_file`) and written atomically
  (:func:`write_result`: a new temporary file renamed over it, so it is never written through a
  symbolic link, into a FIFO, a device or a folder). It is refused when it is a symbolic link, a
  FIFO, a device or a folder, an input of the run, or lies inside a checkpoint, a HuggingFace export
  or another run's log folder (one holding ``metrics.jsonl``). An existing file is replaced only
  when it is the tool's own earlier output: a JSON object with ``"tool": NAME`` (every JSON result
  of these tools carries it) or, for results written before that field, one holding the fields the
  tool writes. Anything else is one ``error:`` line naming the path and what it is; nothing is
  written, and there is no flag to force it (the results go to a new path instead).
* An output FOLDER (``--out DIR``) is refused when it is not a folder, is or lies inside a
  checkpoint, a HuggingFace export or another run's log folder (:func:`check_folder`). A tool that
  removes or replaces what lies in its folder (bench_sharding's ``runs/ROW`` logs,
  bench_convergence's ``VARIANT/metrics.jsonl``) takes only a folder that is new, empty or its own:
  it holds :data:`MARKER` (``{"tool": NAME}``, written when the tool first claims the folder,
  :func:`claim_folder`) or the tool's own results file. Inside its own folder the tool's files are
  replaced without further checks of their content (links, FIFOs and folders still refused).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import Any, Callable, Sequence

from .atomic import commit, remove_quietly
from .safe_files import NotAFile, OverCap, read_capped
from .safe_outputs import check_derived, log_folder_above

MARKER = "tool.json"  # {"tool": NAME} in a folder the tool created or found empty
READ_CAP = 64 << 20  # an earlier result of ours is at most a few MB (bench_model --profile: tables)


class OutputError(Exception):
    """A refused output path: its message is the one ``error:`` line."""


def _load(path: str) -> Any:
    """The JSON value in the regular file ``path`` (read capped and non-blocking), or None."""
    try:
        return json.loads(read_capped(path, READ_CAP))
    except (OSError, NotAFile, OverCap, ValueError, RecursionError):
        return None


def is_own(path: str, tool: str, legacy: Sequence[str] = ()) -> bool:
    """Whether the file ``path`` is ``tool``'s own JSON result: an object with ``"tool": tool``,
    or (``legacy``: the keys every result of the tool holds) one written before that field."""
    v = _load(path)
    if not isinstance(v, dict):
        return False
    if "tool" in v:
        return v["tool"] == tool
    return bool(legacy) and all(k in v for k in legacy)


def _what(path: str) -> str:
    """What the existing regular file ``path`` is, for the refusal line."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    if size == 0:
        return "an empty file"
    v = _load(path)
    n = f"a file of {size:,} bytes" if size is not None else "a file"
    if v is None:
        return f"{n}, not JSON"
    if isinstance(v, dict):
        t = v.get("tool")
        return f"{n}, a JSON object of {t!r}" if isinstance(t, str) else f"{n}, a JSON object without its fields"
    return f"{n}, JSON but not an object"


def check_file(
    path: str,
    flag: str,
    tool: str,
    legacy: Sequence[str] = (),
    inputs: Sequence[str] = (),
    own_folder: bool = False,
    err: type = OutputError,
) -> None:
    """Refuse (raise ``err``) to write ``path`` (given as ``flag``) unless it is new or the tool's
    own earlier output (:func:`is_own`); ``own_folder``: ``path`` lies in a folder the tool owns
    (:func:`check_folder`), where an existing regular file is the tool's."""
    from .safe_outputs import check_output_file

    if not path or path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
        raise err(f"{flag} {path!r} names no file: give a file path")
    if own_folder:  # check_folder looked above it (its meta.json is no checkpoint's)
        _plain_file(path, flag, inputs, err)
        return
    parent = os.path.dirname(os.path.abspath(path)) or "."
    check_output_file(path, flag, err, force=True, inputs=inputs, artifacts=True)
    log = log_folder_above(parent)
    if log is not None:
        raise err(
            f"{flag} {path} lies inside {log}, another run's log folder (it holds metrics.jsonl); "
            f"{tool} adds nothing there: write it elsewhere"
        )
    if own_folder or not os.path.exists(path) or is_own(path, tool, legacy):
        return
    raise err(
        f"{flag} {path} exists and is not an earlier output of {tool} ({_what(path)}); it is not "
        f'replaced: give a new path (an earlier {tool} result, a JSON object with "tool": "{tool}", is replaced)'
    )


def _plain_file(path: str, flag: str, inputs: Sequence[str], err: type) -> None:
    """Refuse ``path`` when it is an input, a symbolic link, or exists and is not a regular file."""
    from .safe_files import _kind

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


def write_result(path: str, obj: Any, tool: str, indent: int = 1, makedirs: bool = True, **dumps) -> None:
    """Write the JSON object ``obj`` with ``"tool": tool`` first, atomically (:func:`write_bytes`)."""
    text = json.dumps({"tool": tool, **{k: v for k, v in obj.items() if k != "tool"}}, indent=indent, **dumps)
    write_bytes(path, (text + "\n").encode(), makedirs=makedirs)


def _mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file (0666 less the umask), not mkstemp's 0600."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes(path: str, data: bytes, makedirs: bool = True) -> None:
    """``data`` as the whole of ``path``: written to a new file of a fresh name beside it (O_EXCL:
    never a link or FIFO someone placed), fsynced and renamed over ``path``."""
    d = os.path.dirname(os.path.abspath(path))
    if makedirs:
        os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode())
        commit(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def save_figure(fig, path: str, tool: str, dpi: int = 110) -> None:
    """``fig`` as the PNG ``path``, atomically (drawn into a fresh file beside it, renamed over it)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp.png", dir=d)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, format="png", metadata={"Software": f"megatron_topo {tool}"})
        os.chmod(tmp, _mode())
        commit(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def folder_is_own(path: str, tool: str, results: str = "", legacy: Sequence[str] = ()) -> bool:
    """Whether the folder ``path`` is ``tool``'s: it holds :data:`MARKER` naming the tool, or its
    own ``results`` file (:func:`is_own` with ``legacy``)."""
    if is_own(os.path.join(path, MARKER), tool):
        return True
    return bool(results) and is_own(os.path.join(path, results), tool, legacy)


def check_folder(
    path: str,
    flag: str,
    tool: str,
    owned: bool = False,
    results: str = "",
    legacy: Sequence[str] = (),
    derived: Sequence[tuple] = (),
    err: type = OutputError,
) -> None:
    """Refuse (raise ``err``) the output folder ``path``: not a folder; is or lies inside another
    artifact's folder or a run's log folder; ``derived`` ((folder, what goes there) that the tool
    makes inside it) a link or not a folder; ``owned``: a folder holding anything when it is not
    the tool's own (:func:`folder_is_own`)."""
    from .safe_outputs import STEP_DIR, artifact_above, artifact_kind

    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a symbolic link to nothing" if not os.path.exists(path) else "not a folder"
        raise err(f"{flag} {path} exists and is {what}; {tool} writes a folder there: give a folder")
    own = os.path.isdir(path) and folder_is_own(path, tool, results, legacy)
    real = os.path.realpath(path)
    kind = artifact_kind(real) if os.path.isdir(real) else None
    ours_meta = (  # bench_sharding's meta.json makes its folder look like a checkpoint step
        own and not STEP_DIR.fullmatch(os.path.basename(real)) and is_own(os.path.join(real, "meta.json"), tool, legacy)
    )
    found = (real, kind) if kind and not ours_meta else artifact_above(os.path.dirname(real))
    if found is not None:
        at = "is" if found[0] == real else "lies inside"
        raise err(
            f"{flag} {path} {at} {found[0]}, {found[1]}; {tool} would write its results into it: "
            f"give a folder of its own"
        )
    check_derived(f"{flag} {path}", derived, tool, f"give another {flag}", err)
    log = log_folder_above(path)
    if log is not None:
        at = "is" if log == os.path.realpath(path) else "lies inside"
        raise err(
            f"{flag} {path} {at} {log}, another run's log folder (it holds metrics.jsonl); {tool} would "
            f"write its results into it: give a folder of its own"
        )
    if not owned or not os.path.isdir(path) or own:
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise err(f"{flag} {path} cannot be listed ({e.strerror or e})") from None
    if names:
        shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")
        raise err(
            f"{flag} {path} holds what {tool} did not write ({shown}) and no {MARKER} of {tool}; it removes "
            f"and replaces what lies in its folder: give a new or empty folder, or an earlier --out of {tool}"
        )


def claim_folder(path: str, tool: str) -> None:
    """Create the output folder ``path`` (checked by :func:`check_folder`) and mark it the tool's."""
    os.makedirs(path, exist_ok=True)
    marker = os.path.join(path, MARKER)
    if not is_own(marker, tool):
        write_result(marker, {"note": f"this folder holds {tool}'s outputs; a rerun replaces them"}, tool)


def lines_of(fn: Callable[[], Any]):
    """``fn()``'s value and the warnings it raised, as text lines."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in caught]
