"""The folders convert_to_hf writes and replaces (split out of convert_to_hf.py): the hidden
temporary folder of a conversion, the marker that makes a folder a conversion's own, which existing
output folder ``--force`` may replace (:func:`not_an_export`), and the clean-up of what killed
conversions left behind (:func:`clean_stale_temporaries`)."""

from __future__ import annotations

import json
import os
import re
import shutil

from megatron_topo.pids import pid_alive

# the names an export holds: --force replaces a folder of these only (never a user's folder)
EXPORT_NAMES = re.compile(
    r"config\.json|generation_config\.json|model(-[0-9]{5}-of-[0-9]{5})?\.safetensors|"
    r"model\.safetensors\.index\.json|tokenizer\.json|tokenizer_config\.json|"
    r"special_tokens_map\.json|vocab\.json|merges\.txt|tokenizer\.model|\.megatron_topo_convert\.json"
)
# written first into every folder a conversion creates or moves aside: only a folder that carries it
# (and holds export files only) is ever removed or moved back by a later conversion
MARKER = ".megatron_topo_convert.json"


def temporary_name(output: str) -> str:
    """The hidden folder this conversion writes ``output`` into: ``.NAME.tmp.PID`` beside it."""
    parent = os.path.dirname(os.path.abspath(output))
    return os.path.join(parent, f".{os.path.basename(os.path.abspath(output))}.tmp.{os.getpid()}")


def _check_own_temporary(tmp: str) -> None:
    """This process's temporary name may hold only what a conversion marked (an earlier one that
    had the same pid); anything else there is a folder or file of someone else: refused, kept."""
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    if not os.path.lexists(tmp):
        return
    why = _marked(tmp) if os.path.isdir(tmp) and not os.path.islink(tmp) else "it is not a folder"
    if why is not None:
        raise CheckpointError(
            f"{tmp}, the temporary folder name of this conversion, is taken and {why}; it is not removed: "
            f"move it away and run again"
        )


def write_marker(folder: str) -> None:
    """Mark ``folder`` as a conversion's own (tool, pid, host, a random token), before anything else
    is written into it or it is moved aside."""
    import secrets
    import socket

    rec = {"tool": "convert_to_hf", "pid": os.getpid(), "host": socket.gethostname(), "token": secrets.token_hex(16)}
    path = os.path.join(folder, MARKER)
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f)


def _remove_marker(folder: str) -> None:
    try:
        os.unlink(os.path.join(folder, MARKER))
    except FileNotFoundError:
        pass


def _marked(folder: str) -> "str | None":
    """Why ``folder`` (a hidden temporary name of a dead conversion) is not a conversion's own, or
    None: it must carry the marker (a regular file, this tool's record, a host and a token) and hold
    export files only (regular files, no links or folders)."""
    import socket
    import stat

    from megatron_topo.safe_files import NotJSON, parse_json, read_small

    path = os.path.join(folder, MARKER)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return f"its {MARKER} is not a file"
        rec = parse_json(read_small(path, 4096, OSError))
    except FileNotFoundError:
        return f"it has no {MARKER} (not made by a conversion)"
    except (OSError, NotJSON):
        return f"its {MARKER} cannot be read as a conversion's record"
    if not (
        isinstance(rec, dict)
        and rec.get("tool") == "convert_to_hf"
        and isinstance(rec.get("token"), str)
        and re.fullmatch(r"[0-9a-f]{32}", rec["token"])
    ):
        return f"its {MARKER} is not a conversion's record"
    if rec.get("host") != socket.gethostname():
        return f"it was made on host {str(rec.get('host'))[:64]!r}, where its conversion may still run"
    try:
        entries = list(os.scandir(folder))
    except OSError as e:
        return f"it cannot be listed ({e.strerror or e})"
    for e in entries:
        if not EXPORT_NAMES.fullmatch(e.name) or not e.is_file(follow_symlinks=False):
            return f"it holds {e.name[:64]!r}, which no conversion writes"
    return None


def not_an_export(folder: str) -> "str | None":
    """Why the non-empty folder ``folder`` is not an export of this tool (None when it is, and
    --force may replace it). An export holds export files only (regular files, no links) and either
    carries the conversion's marker (a crash while it was being replaced) or holds config.json and
    model weights whose safetensors metadata says ``source: megatron_topo`` (every export this tool
    ever wrote). So a user's folder of tokenizer files or a config.json alone, and a HuggingFace
    model folder from elsewhere (e.g. downloaded from the Hub), are never replaced."""
    from megatron_topo.safe_outputs import safetensors_source

    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        return f"cannot be listed ({e.strerror or e})"
    foreign = [e.name for e in entries if not EXPORT_NAMES.fullmatch(e.name)]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        return f"holds {foreign[0][:64]!r}{more}, which no conversion writes"
    for e in entries:
        if not e.is_file(follow_symlinks=False):
            return f"holds {e.name!r}, which is not a regular file (a link, folder or device)"
    names = {e.name for e in entries}
    if MARKER in names and _marker_record(os.path.join(folder, MARKER)):
        return None  # a conversion was replacing it when it stopped
    weights = sorted(n for n in names if n.endswith(".safetensors"))
    if "config.json" not in names or not weights:
        listed = ", ".join(sorted(names)[:4]) + (" ..." if len(names) > 4 else "")
        return (
            f"holds {listed} but not config.json and model weights, so it is no export of convert_to_hf "
            f"(a folder of your own files?)"
        )
    other = [n for n in weights if safetensors_source(os.path.join(folder, n)) != "megatron_topo"]
    if other:
        return (
            f"is a HuggingFace model folder that convert_to_hf did not write ({other[0]} carries no "
            f"source=megatron_topo metadata; e.g. one downloaded from the Hub)"
        )
    return None


def _marker_record(path: str) -> bool:
    """Whether ``path`` is a conversion's marker: a small regular file holding this tool's record."""
    from megatron_topo.safe_files import NotJSON, parse_json, read_small

    try:
        rec = parse_json(read_small(path, 4096, OSError))
    except (OSError, NotJSON):
        return False
    return (
        isinstance(rec, dict)
        and rec.get("tool") == "convert_to_hf"
        and isinstance(rec.get("token"), str)
        and re.fullmatch(r"[0-9a-f]{32}", rec["token"]) is not None
    )


def clean_stale_temporaries(output: str) -> list:
    """Remove the hidden ``.NAME.tmp.PID`` folders of conversions into ``output`` whose process is
    gone, first putting back a previous export a crash left aside (``.NAME.tmp.PID.old`` while
    ``output`` is missing); returns what was done, one line each. Only a folder a conversion marked
    as its own (:func:`write_marker`) and that holds export files only is touched; any other folder
    with such a name is left alone with one line naming it."""
    parent = os.path.dirname(os.path.abspath(output))
    base = os.path.basename(os.path.abspath(output))
    pat = re.compile(rf"\.{re.escape(base)}\.tmp\.([0-9]{{1,18}})(\.old)?")
    try:
        names = sorted(os.listdir(parent), key=lambda n: not n.endswith(".old"))
    except OSError:
        return []
    done = []
    for name in names:
        m = pat.fullmatch(name)
        p = os.path.join(parent, name)
        if not m or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        if not os.path.isdir(p) or os.path.islink(p):
            done.append(f"left {p} alone: it is not a folder a conversion made")
            continue
        why = _marked(p)
        if why is not None:
            done.append(f"left {p} alone: {why}; remove it yourself if it is not yours")
            continue
        if m.group(2) and not os.path.lexists(output):
            os.replace(p, output)
            _remove_marker(output)
            done.append(f"restored {output} from {name} (a conversion was killed while replacing it)")
        else:
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"removed {name}, left by a killed conversion")
    return done
