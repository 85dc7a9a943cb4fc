"""Sharded checkpoints: each rank writes its optimizer shards with their ranges in the global flat
buffers; loading rebuilds any rank's shards from any other plan or world size.

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
``meta.json`` is JSON and ``config.yml`` goes through the safe YAML loader. Any problem with a
checkpoint raises :class:`CheckpointError` whose message is one line naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from dataclasses import asdict
from typing import Callable, Optional

import torch

from .. import faults

LATEST = "latest"
FORMAT_VERSION = 2
SUPPORTED_FORMATS = (1, 2)  # a missing "format" is 1
# model keys that change the function the weights compute (resuming with another value is refused;
# plan, world size, precision, seq_length, dropout and init keys may change: that is resharding/tuning)
ARCH_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "rotary_pct", "rotary_emb_base",
             "gpt_j_residual", "no_weight_tying", "norm", "layernorm_epsilon")
_FAILED = (1 << 64) - 1  # a rank's size record when its write failed
STATE_KEYS = ("master", "exp_avg", "exp_avg_sq")
_META_KEYS = ("step", "world_size", "plan", "units", "trainer")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line for the user."""


def _one_line(text) -> str:
    lines = [s.strip() for s in str(text).splitlines() if s.strip()]
    return lines[0] if lines else ""


# ------------------------------------------------------------------------------- file helpers
def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step{step}")


def rank_file(step_path: str, rank: int) -> str:
    return os.path.join(step_path, f"rank_{rank:05d}.pt")


def _fsync_dir(path: str):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _atomic_write_bytes(path: str, data: bytes):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove_quietly(tmp)
        raise
    os.replace(tmp, path)


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


def _atomic_torch_save(obj, path: str) -> tuple[int, str]:
    part = path + ".part"
    try:
        with open(part, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove_quietly(part)  # a full disk must not keep the half-written file
        raise
    size, digest = file_digest(part)  # of what is on disk, not of what we meant to write
    os.replace(part, path)
    return size, digest


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _write_failure(e: BaseException, where: str) -> str:
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


# ------------------------------------------------------------------------------- tables
def unit_table(engine) -> list[dict]:
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return [
        {"padded": u.layout.padded, "numel": u.numel,
         "params": [[names[id(s.param)], s.offset, s.numel, list(s.shape)] for s in u.specs]}
        for u in engine.units
    ]


def _holders(plan: dict) -> int:
    """Ranks 0..os-1 hold every optimizer shard exactly once (shard index depends on rank % os)."""
    return int(plan["optimizer_factor"])


# ------------------------------------------------------------------------------- save
def _gather_digests(engine, item: bytes) -> list[bytes]:
    """All ranks' (size, digest) records on every rank; doubles as the 'all files written' barrier.
    Uses torch.distributed directly so the engine's traffic counters are not disturbed."""
    if not engine.comm.distributed:
        return [item]
    import torch.distributed as dist

    dev = engine.comm.device  # NCCL/RCCL only take tensors on the runtime device
    t = torch.tensor(list(item), dtype=torch.uint8, device=dev)
    out = torch.empty(t.numel() * engine.topo.world_size, dtype=torch.uint8, device=dev)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, t)
    raw = engine.comm.to_host(out).numpy().tobytes()
    n = len(item)
    records = [raw[i * n:(i + 1) * n] for i in range(engine.topo.world_size)]
    records[engine.comm.rank] = item  # exact even where the gather carries no data (dry run)
    return records


def _clean_leftovers(root: str, keep: str) -> None:
    """Remove what interrupted saves left behind (never a complete global_step directory)."""
    for d in os.listdir(root):
        p = os.path.join(root, d)
        if p == keep:
            continue
        if d.startswith(".tmp_global_step") and os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif d.startswith("global_step") and d.endswith(".old") and os.path.isdir(p):
            live = p[:-len(".old")]
            if os.path.isfile(os.path.join(live, "meta.json")):  # the new copy is complete
                shutil.rmtree(p, ignore_errors=True)
        elif d.startswith(f"{LATEST}.tmp."):
            try:
                os.remove(p)
            except OSError:
                pass


def save(engine, root: str, step: int, trainer_state: dict, config_yaml: str, rank: int,
         barrier: Callable[[], None], keep_last: int = 2) -> str:
    """Collective: every rank calls it. Returns the final step directory."""
    final = step_dir(root, step)
    tmp = os.path.join(root, f".tmp_global_step{step}")
    if rank == 0:
        check_save_dir(root)
        os.makedirs(root, exist_ok=True)
        _clean_leftovers(root, keep="")
        os.makedirs(tmp)
    barrier()
    holder = rank < engine.plan.optimizer_factor
    shards = []
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        entry = {"unit": i, "lo": lo, "hi": hi, "padded": u.layout.padded, "numel": u.numel}
        if holder:
            st = engine.optimizer.shard_state(i)
            entry.update({k: (engine.comm.to_host(v).clone() if torch.is_tensor(v) else v) for k, v in st.items()})
        shards.append(entry)
    payload = {
        "format": FORMAT_VERSION,
        "rank": rank,
        "step": step,
        "holder": holder,
        "shards": shards,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "scaler": engine.scaler.state_dict() if engine.scaler else None,
        # this rank's error-feedback residuals (zero_topo.error_feedback); only a resume on the
        # same world and plan restores them (resharded, they start from zero)
        "error_feedback": [{k: None if t is None else engine.comm.to_host(t).clone()
                            for k, t in (("reduce", u.ef_reduce), ("combine", u.ef_combine))}
                           for u in engine.units] if engine.plan.error_feedback else None,
    }
    try:
        size, digest = _atomic_torch_save(payload, rank_file(tmp, rank))
        failure = None
    except (OSError, RuntimeError) as e:  # a full disk: every rank learns of it through the gather
        size, digest, failure = _FAILED, "00" * 32, _write_failure(e, tmp)
    faults.maybe_fail("save", rank=rank, step=step)
    records = _gather_digests(engine, size.to_bytes(8, "little") + bytes.fromhex(digest))
    failed = [r for r, rec in enumerate(records) if int.from_bytes(rec[:8], "little") == _FAILED]
    if failed:
        _abandon_save(root, tmp, rank, step, failed, failure)
    try:
        if rank == 0:
            _publish(engine, root, tmp, final, step, trainer_state, config_yaml, records, keep_last)
        ok = True
    except OSError as e:
        ok, failure = False, _write_failure(e, root)
    status = _gather_digests(engine, bytes([0 if ok else 1]))  # doubles as the closing barrier
    if any(s[0] for s in status):
        _abandon_save(root, tmp, rank, step, [r for r, s in enumerate(status) if s[0]], failure)
    return final


def _abandon_save(root: str, tmp: str, rank: int, step: int, failed: list, failure: Optional[str]) -> None:
    """Every rank calls it after a failed write: rank 0 removes the partial step; all raise."""
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        with open(os.path.join(root, LATEST)) as f:
            prev = f"the previous checkpoint ({f.read().strip()}) is intact"
    except OSError:
        prev = "there is no previous checkpoint"
    who = f"rank {failed[0]}" + (f" and {len(failed) - 1} more" if len(failed) > 1 else "")
    why = failure or "another rank could not write its file"
    raise CheckpointError(f"saving step {step} into {root} failed on {who}: {why}; the partial files were "
                          f"removed and {prev}; free disk space (or set save elsewhere) and resume")


def _publish(engine, root, tmp, final, step, trainer_state, config_yaml, records, keep_last) -> None:
    """Rank 0: meta.json + config.yml, then the atomic renames and ``latest``."""
    files = {os.path.basename(rank_file(tmp, r)): {"bytes": int.from_bytes(rec[:8], "little"),
                                                   "sha256": rec[8:].hex()}
             for r, rec in enumerate(records)}
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "world_size": engine.topo.world_size,
        "topology": asdict(engine.topo),
        "plan": asdict(engine.plan),
        "precision": engine.precision,
        "shard_holders": engine.plan.optimizer_factor,
        "units": unit_table(engine),
        "trainer": trainer_state,
        "files": files,
    }
    cfg_bytes = config_yaml.encode()
    meta["config"] = {"file": "config.yml", "bytes": len(cfg_bytes), "sha256": hashlib.sha256(cfg_bytes).hexdigest()}
    _atomic_write_bytes(os.path.join(tmp, "config.yml"), cfg_bytes)
    _atomic_write_bytes(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1).encode())
    _fsync_dir(tmp)
    faults.maybe_fail("publish", rank=0, step=step)
    if os.path.isdir(final):  # re-saving the same step: move the old one aside first
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
        _fsync_dir(root)
    _atomic_write_bytes(os.path.join(root, LATEST), f"global_step{step}\n".encode())
    _fsync_dir(root)
    _prune(root, keep_last, protect=os.path.basename(final))


def _prune(root: str, keep_last: int, protect: str = ""):
    if keep_last <= 0:
        return
    steps = sorted(
        (int(d[len("global_step"):]), d) for d in os.listdir(root)
        if d.startswith("global_step") and d[len("global_step"):].isdigit()
    )
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
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    latest = os.path.join(path, LATEST)
    if os.path.isfile(latest):
        try:
            with open(latest) as f:
                name = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{latest} is unreadable: {_one_line(e)}") from None
        if not name or os.sep in name or name in (".", ".."):
            raise CheckpointError(f"{latest} holds {name!r}, not a global_stepN directory name")
        d = os.path.join(path, name)
        if os.path.isfile(os.path.join(d, "meta.json")):
            return d
        old = d + ".old"  # a crash while re-saving the same step left the complete old copy here
        if not os.path.exists(d) and os.path.isfile(os.path.join(old, "meta.json")):
            return old
        raise CheckpointError(f"{latest} points to {name}, which is missing or incomplete (no {name}/meta.json)")
    steps = [d for d in os.listdir(path) if d.startswith("global_step") and d[len("global_step"):].isdigit()]
    hint = f" (it holds {', '.join(sorted(steps))}; pass one of them)" if steps else ""
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
        if os.path.isfile(os.path.join(parent, LATEST)) or re.fullmatch(r"global_step\d+(\.old)?", os.path.basename(sp)):
            inputs.add(parent)
    except CheckpointError:
        pass  # the reader reports what is wrong with the checkpoint itself
    for src in sorted(inputs, key=len):
        if _inside(out, src) or _inside(src, out):
            how = "is" if out == src else "lies inside" if _inside(out, src) else "contains"
            raise CheckpointError(f"{flag} {output} {how} the checkpoint it reads ({src}); write it elsewhere "
                                  f"(nothing was changed)")
    if _inside(os.path.realpath(os.getcwd()), out):
        raise CheckpointError(f"{flag} {output} is the working directory or above it; write it into a new directory")
    if not os.path.isdir(out):
        return
    seen = 0
    for dirpath, dirs, files in os.walk(out):
        seen += len(dirs) + len(files)
        if seen > scan_limit:
            raise CheckpointError(f"{flag} {output} holds more than {scan_limit:,} entries; it is not an earlier "
                                  f"export, so it is not replaced: write it elsewhere")
        marks = [n for n in files if n in (LATEST, "meta.json")] + [d for d in dirs if re.fullmatch(r"global_step\d+", d)]
        if marks:
            raise CheckpointError(f"{flag} {output} holds a checkpoint ({os.path.join(dirpath, marks[0])}); "
                                  f"it is not replaced, even with --force: write it elsewhere")


def holds_checkpoints(root: Optional[str]) -> bool:
    """Whether the ``save`` folder ``root`` has a '{LATEST}' file or a global_stepN directory."""
    if not root or not os.path.isdir(root):
        return False
    return os.path.isfile(os.path.join(root, LATEST)) or any(
        d.startswith("global_step") and d[len("global_step"):].isdigit() for d in os.listdir(root))


def read_meta(step_path: str) -> dict:
    path = os.path.join(step_path, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is unreadable: {_one_line(e)}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    missing = [k for k in _META_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{path} is incomplete: missing {', '.join(missing)}")
    fmt = meta.get("format", 1)
    if isinstance(fmt, bool) or fmt not in SUPPORTED_FORMATS:
        raise CheckpointError(f"{path}: checkpoint format {fmt!r} is not supported; this megatron_topo reads formats "
                              f"{', '.join(map(str, SUPPORTED_FORMATS))} (saved by another version?)")
    try:
        ws = int(meta["world_size"])
        units = meta["units"]
        ok = ws >= 1 and isinstance(units, list) and all(
            isinstance(u, dict) and int(u["numel"]) >= 0 and int(u["padded"]) >= int(u["numel"])
            and isinstance(u["params"], list) for u in units)
        _holders(meta.get("plan") or {"optimizer_factor": ws})
    except (TypeError, ValueError, KeyError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path} is malformed: bad world_size, plan or unit table")
    return meta


def _verify_file(path: str, record: Optional[dict]) -> None:
    if not record:
        return
    size = os.path.getsize(path)
    if size != record.get("bytes"):
        raise CheckpointError(
            f"{path} is truncated or was replaced: {size} bytes, meta.json recorded {record.get('bytes')}")
    if file_digest(path)[1] != record.get("sha256"):
        raise CheckpointError(f"{path} is corrupt: its SHA-256 differs from the one recorded in meta.json")


def load_rank_file(step_path: str, rank: int, meta: Optional[dict] = None, mmap: bool = True) -> dict:
    """One rank file (checked against meta.json's size and digest when ``meta`` is given). With
    ``mmap`` (the default) the tensors are views of the mapped file: only the bytes a caller touches
    are read (a reader of one unit's master weights never pages in the moments or other units);
    callers copy what they keep, so the mapping goes away with the returned dict."""
    path = rank_file(step_path, rank)
    if not os.path.isfile(path):
        raise CheckpointError(f"missing shard file {path}")
    # Refuse code before anything else looks at the bytes: weights_only rejects every global but
    # tensors and plain containers, so a crafted pickle fails here and runs nothing.
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        m = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global| Please|\.\s|$)", str(e))
        why = m.group(1).strip() if m else _one_line(e)[:120]
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data; refusing to load it ({why})") from None
    except Exception as e:  # truncated/corrupt
        why = re.sub(r"\s+", " ", str(e)).split(". ")[0].strip()[:160]
        raise CheckpointError(f"{path} is corrupt or truncated ({why})") from None
    if meta is not None:
        _verify_file(path, (meta.get("files") or {}).get(os.path.basename(path)))
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise CheckpointError(f"{path} is not a zero_topo rank file (no 'shards' list)")
    if meta is not None and len(data["shards"]) != len(meta["units"]):
        raise CheckpointError(f"{path} has {len(data['shards'])} unit shards, meta.json lists {len(meta['units'])} units")
    return data


def _shard_tensors(path: str, sh: dict, unit: int, keys=STATE_KEYS) -> dict:
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


def _holder_ranges(meta: dict, unit: int) -> Optional[list[tuple[int, int, int]]]:
    """(rank, lo, hi) of every holder's optimizer shard of ``unit``, computed from the saved plan
    (no file opened); None for checkpoints that do not record their holders."""
    from . import layout as L

    if not meta.get("shard_holders"):
        return None
    u, plan = meta["units"][unit], meta["plan"]
    try:
        lay = L.UnitLayout(int(u["numel"]), int(u["padded"]), int(plan["weight_factor"]),
                           int(plan["grad_factor"]), int(plan["optimizer_factor"]))
        return [(r, *lay.optim_range(r)) for r in range(int(meta["shard_holders"]))]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CheckpointError(f"meta.json: plan {plan} does not describe unit {unit}'s layout") from None


def unit_state_range(step_path: str, meta: dict, unit: int, a: int, b: int, files: Optional[dict] = None,
                     keys=STATE_KEYS) -> dict:
    """master/exp_avg/exp_avg_sq of elements ``[a, b)`` of ``unit``'s flat buffer (zeros beyond
    the real parameters) and the Adam step, reading only the shard files that overlap. ``keys``
    (which must include ``master``) limits what is read: ``("master",)`` never touches the moments
    (the rank files are memory-mapped, so the bytes of other keys and units are not read)."""
    if "master" not in keys:
        raise ValueError(f"keys {keys!r} must include 'master'")
    n = int(meta["units"][unit]["numel"])
    out = {k: torch.zeros(b - a, dtype=torch.float32) for k in keys}
    end = min(b, n)
    have = torch.zeros(max(end - a, 0), dtype=torch.bool)
    files = files if files is not None else {}
    step = None
    ranges = _holder_ranges(meta, unit)
    if ranges is None:  # older checkpoints: every rank file, ranges from the files themselves
        ranges = [(r, None, None) for r in range(int(meta["world_size"]))]
    for r, olo, ohi in ranges:
        if olo is not None and (min(ohi, end) <= max(olo, a)):
            continue
        if r not in files:
            files[r] = load_rank_file(step_path, r, meta)
        sh = files[r]["shards"][unit]
        lo, hi = int(sh["lo"]), int(sh["hi"])
        if olo is not None and (lo, hi) != (olo, ohi):
            raise CheckpointError(f"{rank_file(step_path, r)}: unit {unit} range [{lo}, {hi}) does not match "
                                  f"the saved plan's [{olo}, {ohi})")
        x, y = max(a, lo), min(end, hi)
        if x >= y or bool(have[x - a:y - a].all()):
            continue
        tens = _shard_tensors(rank_file(step_path, r), sh, unit, keys)
        if "master" not in tens:
            raise CheckpointError(f"{rank_file(step_path, r)}: unit {unit} has no master weights")
        for k, v in tens.items():
            out[k][x - a:y - a] = v[x - lo:y - lo]
        have[x - a:y - a] = True
        if sh.get("step") is not None:
            step = sh["step"]
    if not bool(have.all()):
        raise CheckpointError(f"{step_path}: unit {unit} is not fully covered by the shard files")
    if step is None and ranges:  # [a, b) is all padding: the Adam step is still the unit's step
        r = ranges[0][0]
        if r not in files:
            files[r] = load_rank_file(step_path, r, meta)
        step = files[r]["shards"][unit].get("step")
    out["step"] = step.clone() if torch.is_tensor(step) else step  # not a view of the mapped file
    return out


def full_unit_state(step_path: str, meta: dict, unit: int, files: Optional[dict] = None,
                    keys=STATE_KEYS) -> dict:
    """Reassemble a unit's unpadded flat master/exp_avg/exp_avg_sq (+ Adam step) from the shards;
    ``keys=("master",)`` reads the master weights only."""
    return unit_state_range(step_path, meta, unit, 0, int(meta["units"][unit]["numel"]), files, keys)


def check_compatible(sp: str, meta: dict, mine: list[dict]) -> None:
    """The checkpoint's unit parameter tables must equal the model's (names, offsets, shapes)."""
    if len(meta["units"]) != len(mine):
        raise CheckpointError(
            f"{sp}: checkpoint has {len(meta['units'])} units, the model has {len(mine)} (different num_layers?)"
        )
    for i, (a, b) in enumerate(zip(meta["units"], mine)):
        pa = [[p[0], p[1], p[2], list(p[3])] for p in a["params"]]
        pb = [[p[0], p[1], p[2], list(p[3])] for p in b["params"]]
        if pa != pb:
            if len(pa) != len(pb):
                raise CheckpointError(f"{sp}: unit {i} has {len(pa)} parameters in the checkpoint, "
                                      f"{len(pb)} in the model")
            x, y = next((x, y) for x, y in zip(pa, pb) if x != y)
            raise CheckpointError(
                f"{sp}: parameter {y[0]} has shape {tuple(x[3])} in the checkpoint but {tuple(y[3])} in the "
                f"model (unit {i}); the model config differs from the one that was saved")


# ------------------------------------------------------------------------------- load
def read_config_yaml(sp: str, meta: dict) -> Optional[str]:
    """The step's config.yml text, checked against the digest meta.json records (None if absent)."""
    path = os.path.join(sp, "config.yml")
    if not os.path.isfile(path):
        if meta.get("config"):
            raise CheckpointError(f"{path} is missing; meta.json records one")
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"{path} is unreadable: {e.strerror or e}") from None
    rec = meta.get("config")
    if rec and (len(raw) != rec.get("bytes") or hashlib.sha256(raw).hexdigest() != rec.get("sha256")):
        raise CheckpointError(f"{path} was changed after the save: its SHA-256 differs from the one recorded in "
                              f"meta.json (the model it describes may not be the one saved)")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not UTF-8 text") from None


def _saved_config(sp: str, meta: dict):
    """The Config the checkpoint was saved with, or None when it has no config.yml."""
    from ..config import ConfigError, load_config

    text = read_config_yaml(sp, meta)
    if text is None:
        return None
    try:
        return load_config([os.path.join(sp, "config.yml")])
    except ConfigError as e:
        raise CheckpointError(f"{os.path.join(sp, 'config.yml')}: {e}") from None


def check_resume(sp: str, meta: dict, cfg) -> None:
    """A resume must keep the architecture (every key in ARCH_KEYS; the plan, world size and
    precision may change) and have steps left to train."""
    saved = _saved_config(sp, meta)
    if saved is not None:
        diff = [f"{k} {getattr(saved.model, k)!r} -> {getattr(cfg.model, k)!r}" for k in ARCH_KEYS
                if getattr(saved.model, k) != getattr(cfg.model, k)]
        if diff:
            raise CheckpointError(f"{sp}: the model config differs from the checkpoint's ({'; '.join(diff)}); "
                                  f"resume with the saved values or start a new run (another plan or world size "
                                  f"is fine)")
    step = int(meta["step"])
    if cfg.train.train_iters < step:
        raise CheckpointError(f"{sp} is at step {step} but train_iters is {cfg.train.train_iters}; set "
                              f"train_iters above {step} to continue training (nothing was loaded or written)")


def load(engine, path: str, rank: int, strict_world: bool = False, config=None) -> dict:
    """Load into ``engine`` (any plan / world size); returns the trainer state from meta.json.
    With ``config`` (the run's Config), a changed architecture or a ``train_iters`` below the
    saved step is refused first."""
    sp = resolve(path)
    meta = read_meta(sp)
    check_compatible(sp, meta, unit_table(engine))
    if config is not None:
        check_resume(sp, meta, config)
    same = meta["world_size"] == engine.topo.world_size and meta["plan"] == asdict(engine.plan)
    if strict_world and not same:
        raise CheckpointError(f"{sp}: saved on {meta['world_size']} ranks with another plan")
    holders = int(meta.get("shard_holders") or meta["world_size"])
    own = None
    if same:
        own = load_rank_file(sp, rank, meta)
        src = own if rank < holders else load_rank_file(sp, rank % holders, meta)
    files: dict = {}
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        if own is not None:
            sh = src["shards"][i]
            if (int(sh["lo"]), int(sh["hi"])) != (lo, hi):
                raise CheckpointError(f"{rank_file(sp, rank % holders)}: unit {i} range [{sh['lo']}, {sh['hi']}) "
                                      f"differs from this rank's [{lo}, {hi}) under the same plan")
            st = _shard_tensors(rank_file(sp, rank % holders), sh, i)
            if "master" not in st:
                raise CheckpointError(f"{rank_file(sp, rank % holders)}: unit {i} has no master weights")
            st["step"] = sh.get("step")
        else:  # another plan or world size: read only the saved shards overlapping [lo, hi)
            st = unit_state_range(sp, meta, i, lo, hi, files)
        dev = engine.optimizer.params[i].device
        has_moments = st["step"] is not None and "exp_avg" in st and "exp_avg_sq" in st
        engine.optimizer.load_shard_state(
            i, st["master"].to(dev), st["exp_avg"].to(dev) if has_moments else None,
            st["exp_avg_sq"].to(dev) if has_moments else None, st["step"])
    if own is None and engine.scaler:
        first = files.get(0) or load_rank_file(sp, 0, meta)  # the scaler state is the same on every rank
        if first.get("scaler"):
            engine.scaler.load_state_dict(first["scaler"])
    if own is not None:
        torch.set_rng_state(own["rng"]["torch"])
        if own["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(own["rng"]["cuda"])
        if engine.scaler and own.get("scaler"):
            engine.scaler.load_state_dict(own["scaler"])
        if engine.plan.error_feedback and own.get("error_feedback"):
            for u, ef in zip(engine.units, own["error_feedback"]):
                u.ef_reduce = None if ef["reduce"] is None else ef["reduce"].to(u.device, copy=True)
                u.ef_combine = None if ef["combine"] is None else ef["combine"].to(u.device, copy=True)
    engine.republish()
    return meta["trainer"]


# ------------------------------------------------------------------------------- full states
def read_full_state(path: str, keys=STATE_KEYS) -> dict:
    """The whole model and optimizer state of a checkpoint, in one process (no engine needed).

    Returns ``{"step_dir", "meta", "config_yaml", "params": {name: fp32 tensor},
    "optimizer": {name: {"exp_avg", "exp_avg_sq"}}, "adam_step": {name: float}, "units": [per-unit
    flat state]}`` with every tensor reassembled from the shard files; ``params`` and ``optimizer``
    are views into the ``units`` buffers (one copy of the state in memory). ``keys=("master",)``
    reads the weights only (``optimizer`` and ``adam_step`` are then empty). Exports that need not
    hold the model read unit by unit instead (:func:`full_unit_state`).
    """
    sp = resolve(path)
    meta = read_meta(sp)
    config_yaml = read_config_yaml(sp, meta)  # an edited config.yml fails before any shard is read
    files: dict = {}
    params, optim, steps, units = {}, {}, {}, []
    for i, u in enumerate(meta["units"]):
        full = full_unit_state(sp, meta, i, files, keys)
        units.append(full)
        step = None if full["step"] is None or "exp_avg" not in full else float(full["step"])
        for name, off, numel, shape in u["params"]:
            sl = slice(int(off), int(off) + int(numel))
            params[name] = full["master"][sl].view(*shape)
            if step is not None:
                optim[name] = {k: full[k][sl].view(*shape) for k in ("exp_avg", "exp_avg_sq")}
                steps[name] = step
    return {"step_dir": sp, "meta": meta, "config_yaml": config_yaml, "params": params, "optimizer": optim,
            "adam_step": steps, "units": units}


def load_model_config(state: dict):
    """The ModelConfig a checkpoint was saved with (from its config.yml, via the safe loader)."""
    from ..config import ConfigError, load_config

    sp = state["step_dir"]
    path = os.path.join(sp, "config.yml")
    if state.get("config_yaml") is None:
        raise CheckpointError(f"{sp} has no config.yml; cannot tell the model's shape")
    try:
        return load_config([path]).model
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


@torch.no_grad()
def gather_full_state(engine) -> list[dict]:
    """Collective: every unit's unpadded flat master/exp_avg/exp_avg_sq (+ Adam step) as the
    engine holds them now, gathered over the optimizer group (tests, live export). The engine's
    traffic counters are left as they were."""
    from . import layout as L

    saved = dict(engine.comm.bytes)
    out = []
    grp = engine.groups.optim
    for i, u in enumerate(engine.units):
        st = engine.optimizer.shard_state(i)
        keys = [k for k in STATE_KEYS if st[k] is not None]
        n = st["master"].numel()
        local = torch.cat([st[k].detach().float().reshape(-1) for k in keys])
        tmp = torch.empty(local.numel() * grp.size, dtype=torch.float32, device=local.device)
        engine.comm.all_gather(tmp, local, grp)
        parts = tmp.view(grp.size, len(keys), n)
        entry = {"step": None if st["step"] is None else float(st["step"])}
        entry.update({k: None for k in STATE_KEYS})
        for a, k in enumerate(keys):
            full = torch.empty(n * u.plan.optimizer_factor, dtype=torch.float32, device=local.device)
            for j, r in enumerate(grp.ranks):
                s = L.shard_index(r, u.layout.chain())
                full[s * n:(s + 1) * n].copy_(parts[j, a])
            entry[k] = full[:u.numel].cpu()
        out.append(entry)
    engine.comm.bytes.update(saved)
    return out
