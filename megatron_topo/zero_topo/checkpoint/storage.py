"""Checkpoint files and their durability: names, atomic writes, digests, reading and verifying
``meta.json`` and rank files, cleanup of interrupted saves, pruning, and path checks.

Layout of ``{save}/global_step{N}/``:

* ``meta.json``     format version, step, world size, plan, topology, precision, every unit's
                    parameter table and padded size, the trainer state (consumed samples, ...),
                    which ranks hold the tensors (``shard_holders``) and each rank file's size and
                    SHA-256; written by rank 0 once every rank file is on disk.
* ``rank_XXXXX.pt`` one per rank: for every unit the rank's optimizer-shard range ``[lo, hi)`` in
                    the unit's padded flat buffer (plus ``padded``/``numel``), and -- on the ranks
                    ``0 .. optimizer_factor-1``, which between them hold every shard exactly once --
                    the fp32 master, ``exp_avg``, ``exp_avg_sq`` and Adam ``step``; the other ranks
                    hold replicas of those shards and store only the ranges. Every rank stores its
                    RNG state and the fp16 loss-scaler state.
* ``config.yml``    the effective config (``load_config`` reads it back).

Atomicity: everything is written into ``.tmp_global_step{N}`` (each file: write, flush, fsync,
rename), rank 0 renames the directory to ``global_step{N}`` when all ranks are done, fsyncs the
parent and only then replaces ``latest``; so a crash at any point during a save leaves the
previous checkpoint and ``latest`` untouched. ``keep_last`` prunes old steps afterwards, never
the one ``latest`` names. Leftovers of an interrupted save are removed by the next save.

Loading never runs code from a file: rank files load with ``torch.load(weights_only=True)``,
``meta.json`` is JSON and ``config.yml`` goes through the safe YAML loader. Every file a reader
opens lies inside its folder (``latest`` and the step it names in the checkpoint folder, the rest in
the step folder): a symbolic link out of it is refused, one within it is read, as the HF reader
does (:func:`folder_file`). Any problem with a checkpoint raises :class:`CheckpointError` whose
message is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from typing import Any, Optional, Sequence

import torch

from ... import safe_files
from ...atomic import atomic_open, write_bytes
from ...atomic import remove_quietly as _remove_quietly
from ..engine_state import STATE_KEYS  # the optimizer state a shard holds, as the engine names it
from . import meta_schema

LATEST = "latest"
FORMAT_VERSION = 2
SUPPORTED_FORMATS = (1, 2)  # a missing "format" is 1
# model keys that change the function the weights compute (resuming with another value is refused;
# plan, world size, precision, seq_length, dropout and init keys may change: that is resharding/tuning)
ARCH_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "rotary_pct",
    "rotary_emb_base",
    "gpt_j_residual",
    "no_weight_tying",
    "norm",
    "layernorm_epsilon",
)
LATEST_CAP = 4 * safe_files.KIB  # 'global_stepN' and a newline
META_CAP = 256 * safe_files.MIB  # a unit table of some 10**6 parameters fits many times over


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line for the user."""


def excerpt_value(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else safe_files.excerpt(repr(v))


def _one_line(text: object) -> str:
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    return lines[0] if lines else ""


# ------------------------------------------------------------------------------- names
def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step{step}")


def rank_file(step_path: str, rank: int) -> str:
    return os.path.join(step_path, f"rank_{rank:05d}.pt")


def folder_file(folder: str, name: str) -> str:
    """``folder/name`` for a reader of a checkpoint folder's file (meta.json, a rank file,
    config.yml, latest): refused with one line when it is a symbolic link that resolves outside
    ``folder`` (a link within the folder is read), as the HF reader refuses one
    (:func:`safe_files.not_linked_out`). Whether it exists and is a regular file is the caller's."""
    path = os.path.join(folder, name)
    if os.path.lexists(path):
        safe_files.not_linked_out(folder, name, path, CheckpointError)
    return path


# ------------------------------------------------------------------------------- writing
def _atomic_write_bytes(path: str, data: bytes) -> None:
    """Into a directory that exists: a step directory removed meanwhile is an error, not recreated."""
    write_bytes(path, data, makedirs=False)


def file_digest(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                break
            h.update(b)
            size += len(b)
    return size, h.hexdigest()


def atomic_torch_save(obj: Any, path: str) -> tuple[int, str]:
    """``torch.save`` into ``path`` atomically (a full disk keeps no half-written file); returns the
    size and SHA-256 of what is on disk, not of what we meant to write."""
    with atomic_open(path, "wb", tmp=path + ".part", makedirs=False) as f:
        torch.save(obj, f)
    return file_digest(path)


def write_failure(e: BaseException, where: str) -> str:
    """One line for a failed checkpoint write (ENOSPC, EIO, torch's zip writer...)."""
    if isinstance(e, OSError) and e.strerror:
        why = e.strerror
    else:
        why = re.sub(r"\s+", " ", str(e)).strip()
        why = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", why)[:160] or type(e).__name__
    try:
        st = os.statvfs(where)
        free = f" with {st.f_bavail * st.f_frsize / 2**20:.1f} MiB free on its filesystem"
    except OSError:
        free = ""
    return f"write failed ({why}){free}"


def check_save_dir(root: Optional[str]) -> None:
    """Fail early (before training) when ``checkpoint.save`` cannot be a checkpoint directory."""
    if not root:
        return
    if os.path.exists(root) and not os.path.isdir(root):
        raise CheckpointError(f"checkpoint.save {root} exists and is not a directory; point save at a directory")
    parent = os.path.dirname(os.path.abspath(root))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise CheckpointError(f"checkpoint.save {root}: {parent} is a file, not a directory")
    probe = root if os.path.isdir(root) else parent
    if probe and not os.access(probe, os.W_OK | os.X_OK):
        raise CheckpointError(f"checkpoint.save {root}: {probe} is not writable")


# ------------------------------------------------------------------------------- cleanup
def clean_leftovers(root: str, keep: str) -> None:
    """Remove what interrupted saves left behind (never a complete global_step directory)."""
    for d in os.listdir(root):
        p = os.path.join(root, d)
        if p == keep:
            continue
        # only the exact names a save writes (a user's `.tmp_global_step_x` or `latest.tmp.mine` stays)
        if re.fullmatch(r"\.tmp_global_step[0-9]+", d) and os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        elif re.fullmatch(r"global_step[0-9]+\.old", d) and os.path.isdir(p) and not os.path.islink(p):
            live = p[: -len(".old")]
            if os.path.isfile(os.path.join(live, "meta.json")):  # the new copy is complete
                shutil.rmtree(p, ignore_errors=True)
        elif re.fullmatch(rf"{LATEST}\.tmp\.[0-9]+", d) and os.path.isfile(p) and not os.path.islink(p):
            _remove_quietly(p)


def _step_name(d: str) -> bool:
    """``global_stepN`` with N in ASCII digits: ``str.isdigit`` also takes ``٣`` (int() reads it as
    3: a user's folder pruned as step 3) and ``²`` (int() refuses it: a traceback)."""
    return re.fullmatch(r"global_step[0-9]+", d) is not None


def prune(root: str, keep_last: int, protect: str = "") -> None:
    if keep_last <= 0:
        return
    steps = sorted((int(d[len("global_step") :]), d) for d in os.listdir(root) if _step_name(d))
    for _, d in steps[:-keep_last]:
        if d != protect:
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


# ------------------------------------------------------------------------------- reading
def resolve(path: str) -> str:
    """A ``save`` directory (its latest checkpoint) or one step's directory -> step directory."""
    if not path or not os.path.exists(path):
        raise CheckpointError(f"checkpoint path does not exist: {path}")
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint path {path} is a file; give a save directory or a global_stepN directory")
    meta = os.path.join(path, "meta.json")
    if os.path.isfile(meta):
        return path
    if os.path.lexists(meta):  # a FIFO, folder, device or dangling link: say what it is
        raise CheckpointError(f"{meta} {safe_files.why_not_a_file(meta)}")
    latest = os.path.join(path, LATEST)
    if os.path.lexists(latest):
        latest = safe_files.inside(path, LATEST, latest, CheckpointError)  # no symlink out, no FIFO
        name = safe_files.read_small_text(latest, LATEST_CAP, CheckpointError).strip()
        if not re.fullmatch(r"global_step[0-9]{1,18}", name):
            raise CheckpointError(f"{latest} holds {safe_files.excerpt(name)}, not a global_stepN directory name")
        d = os.path.join(path, name)
        if os.path.lexists(d) and not _inside(os.path.realpath(d), os.path.realpath(path)):
            raise CheckpointError(
                f"{latest} names {name}, a symbolic link out of {path}; only folders inside it are read"
            )
        if os.path.isfile(os.path.join(d, "meta.json")):
            return d
        old = d + ".old"  # a crash while re-saving the same step left the complete old copy here
        if not os.path.exists(d) and os.path.isfile(os.path.join(old, "meta.json")):
            if not _inside(os.path.realpath(old), os.path.realpath(path)):
                raise CheckpointError(
                    f"{old} (the copy {name} was being replaced with) is a symbolic link out of {path}; "
                    f"only folders inside it are read"
                )
            return old
        if os.path.lexists(os.path.join(d, "meta.json")):
            meta = os.path.join(d, "meta.json")
            raise CheckpointError(f"{latest} points to {name}, whose meta.json {safe_files.why_not_a_file(meta)}")
        raise CheckpointError(f"{latest} points to {name}, which is missing or incomplete (no {name}/meta.json)")
    steps = [d for d in os.listdir(path) if _step_name(d)]
    hint = f" (it holds {', '.join(sorted(steps))}; pass one of them)" if steps else ""
    if not steps:
        from ...safe_outputs import artifact_kind

        kind = artifact_kind(path)
        if kind and kind.startswith("a HuggingFace"):  # by its names: a config.json may be a device
            hint = f"; it is {kind}: this tool reads checkpoints written by train.py"
    raise CheckpointError(f"{path}: no meta.json and no '{LATEST}' file; not a checkpoint directory{hint}")


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def check_output_outside(checkpoint: str, output: str, flag: str = "--output", scan_limit: int = 10_000) -> None:
    """For tools that read ``checkpoint`` and write ``output`` (replacing it under --force): refuse
    an output that is, contains or lies inside the checkpoint (the path given, its step directory
    and its save folder), that is the working directory or above it, or an existing directory that
    holds a checkpoint or more than ``scan_limit`` entries (not an earlier export)."""
    out = os.path.realpath(output)
    inputs = {os.path.realpath(checkpoint)}
    try:
        sp = os.path.realpath(resolve(checkpoint))
        inputs.add(sp)
        parent = os.path.dirname(sp)
        if os.path.isfile(os.path.join(parent, LATEST)) or re.fullmatch(
            r"global_step[0-9]+(\.old)?", os.path.basename(sp)
        ):
            inputs.add(parent)
    except CheckpointError:
        pass  # the reader reports what is wrong with the checkpoint itself
    for src in sorted(inputs, key=len):
        if _inside(out, src) or _inside(src, out):
            how = "is" if out == src else "lies inside" if _inside(out, src) else "contains"
            raise CheckpointError(
                f"{flag} {output} {how} the checkpoint it reads ({src}); write it elsewhere (nothing was changed)"
            )
    if _inside(os.path.realpath(os.getcwd()), out):
        raise CheckpointError(f"{flag} {output} is the working directory or above it; write it into a new directory")
    if not os.path.isdir(out):
        return
    seen = 0
    for dirpath, dirs, files in os.walk(out):
        seen += len(dirs) + len(files)
        if seen > scan_limit:
            raise CheckpointError(
                f"{flag} {output} holds more than {scan_limit:,} entries; it is not an earlier "
                f"export, so it is not replaced: write it elsewhere"
            )
        marks = [n for n in files if n in (LATEST, "meta.json")] + [
            d for d in dirs if re.fullmatch(r"global_step[0-9]+", d)
        ]
        if marks:
            raise CheckpointError(
                f"{flag} {output} holds a checkpoint ({os.path.join(dirpath, marks[0])}); "
                f"it is not replaced, even with --force: write it elsewhere"
            )


def holds_checkpoints(root: Optional[str]) -> bool:
    """Whether the ``save`` folder ``root`` has a '{LATEST}' file or a global_stepN directory."""
    if not root or not os.path.isdir(root):
        return False
    return os.path.isfile(os.path.join(root, LATEST)) or any(_step_name(d) for d in os.listdir(root))


def read_meta(step_path: str, unverified: bool = False, ask: str = meta_schema.ASK_UNVERIFIED) -> meta_schema.Meta:
    """meta.json of a step folder, typed and checked against :mod:`.meta_schema` (one line naming
    the field that is wrong). Rank files without a size and SHA-256 record are refused unless
    ``unverified`` (the line says ``ask``: how the reading tool asks for that)."""
    path = folder_file(step_path, "meta.json")
    text = safe_files.read_small_text(path, META_CAP, CheckpointError)
    try:
        meta = json.loads(text)
    except (RecursionError, ValueError) as e:  # ValueError: JSON syntax, an integer of > 4,300 digits
        raise CheckpointError(f"{path} is unreadable: {_one_line(e)[:120]}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    missing = [k for k in meta_schema.REQUIRED if k not in meta]
    if missing:
        raise CheckpointError(f"{path} is incomplete: missing {', '.join(missing)}")
    try:
        return meta_schema.validate(meta, SUPPORTED_FORMATS, unverified, ask)
    except meta_schema.MetaError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _verify_file(path: str, record: Optional[meta_schema.FileRecord]) -> None:
    if not record:
        return
    size = os.path.getsize(path)
    if size != record.bytes:
        raise CheckpointError(f"{path} is truncated or was replaced: {size} bytes, meta.json recorded {record.bytes}")
    if file_digest(path)[1] != record.sha256:
        raise CheckpointError(f"{path} is corrupt: its SHA-256 differs from the one recorded in meta.json")


def load_rank_file(step_path: str, rank: int, meta: Optional[meta_schema.Meta] = None, mmap: bool = True) -> dict:
    """One rank file (checked against meta.json's size and digest when ``meta`` is given). With
    ``mmap`` (the default) the tensors are views of the mapped file: only the bytes a caller touches
    are read (a reader of one unit's master weights never pages in the moments or other units);
    callers copy what they keep, so the mapping goes away with the returned dict."""
    path = folder_file(step_path, os.path.basename(rank_file(step_path, rank)))
    if not os.path.isfile(path):
        why = safe_files.why_not_a_file(path)
        raise CheckpointError(f"missing shard file {path}" if why == "file not found" else f"shard file {path} {why}")
    # Refuse code before anything else looks at the bytes: weights_only rejects every global but
    # tensors and plain containers, so a crafted pickle fails here and runs nothing.
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        m = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global| Please|\.\s|$)", str(e))
        why = m.group(1).strip() if m else _one_line(e)[:120]
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data; refusing to load it ({why})"
        ) from None
    except Exception as e:  # truncated/corrupt
        why = re.sub(r"\s+", " ", str(e)).split(". ")[0].strip()[:160]
        raise CheckpointError(f"{path} is corrupt or truncated ({why})") from None
    if meta is not None:
        _verify_file(path, meta.files.get(os.path.basename(path)))
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise CheckpointError(f"{path} is not a zero_topo rank file (no 'shards' list)")
    if meta is not None and len(data["shards"]) != len(meta.units):
        raise CheckpointError(f"{path} has {len(data['shards'])} unit shards, meta.json lists {len(meta.units)} units")
    if meta is not None:
        _check_unit_sizes(path, data["shards"], meta)
    return data


def _check_unit_sizes(path: str, shards: list, meta: meta_schema.Meta) -> None:
    """Each unit's element count and padded size as the rank file records them must be meta.json's:
    every reader (a resume under the same plan, which takes its ranges from the rank file, and the
    readers that compute them from meta.json) then sees the same layout."""
    for i, (sh, u) in enumerate(zip(shards, meta.units)):
        if not isinstance(sh, dict):
            raise CheckpointError(f"{path}: unit {i}'s shard is {type(sh).__name__}, not a record")
        for k in ("numel", "padded"):
            v = sh.get(k)
            if v is None:
                continue  # not recorded: the ranges are checked where they are used
            if torch.is_tensor(v) and v.numel() == 1 and not v.is_floating_point():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int) or v != getattr(u, k):
                raise CheckpointError(
                    f"{path}: unit {i} {k} is {excerpt_value(v)} in the rank file, meta.json's units[{i}].{k} "
                    f"is {getattr(u, k):,}: meta.json does not describe this rank file"
                )


def _shard_tensors(path: str, sh: dict, unit: int, keys: Sequence[str] = STATE_KEYS) -> dict:
    lo, hi = int(sh["lo"]), int(sh["hi"])
    out = {}
    for k in keys:
        v = sh.get(k)
        if v is None:
            continue
        if not torch.is_tensor(v) or v.dim() != 1 or v.numel() != hi - lo:
            got = tuple(v.shape) if torch.is_tensor(v) else type(v).__name__
            raise CheckpointError(f"{path}: unit {unit} {k} has shape {got}, expected ({hi - lo},) for [{lo}, {hi})")
        out[k] = v.float()
    return out
