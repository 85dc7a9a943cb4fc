"""Sharded checkpoints: each rank writes its optimizer shards with their ranges in the global
flat buffers; loading rebuilds any rank's shards from any other plan or world size.

Layout of ``{save}/global_step{N}/``:

* ``meta.json``   step, world size, plan, topology, every unit's parameter table and the trainer
                  state (consumed samples, scheduler); written by rank 0.
* ``rank_XXXXX.pt`` this rank's master/exp_avg/exp_avg_sq per unit with its [lo, hi) range in
                  the unit's padded flat buffer, plus RNG and loss-scaler state.
* ``config.yml``  the effective config.

The step directory is written under a temporary name and renamed when complete; ``latest`` is
replaced last, so a crash during a save leaves the previous checkpoint untouched. Files load
with ``torch.load(weights_only=True)`` and JSON: nothing in a checkpoint can run code.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
from dataclasses import asdict
from typing import Optional

import torch

LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message is one line for the user."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step{step}")


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
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def unit_table(engine) -> list[dict]:
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return [
        {"padded": u.layout.padded, "numel": u.numel,
         "params": [[names[id(s.param)], s.offset, s.numel, list(s.shape)] for s in u.specs]}
        for u in engine.units
    ]


def save(engine, root: str, step: int, trainer_state: dict, config_yaml: str, rank: int, barrier,
         keep_last: int = 2) -> str:
    """Collective: every rank calls it. Returns the final step directory."""
    final = step_dir(root, step)
    tmp = os.path.join(root, f".tmp_global_step{step}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    barrier()
    shards = []
    for i, u in enumerate(engine.units):
        st = engine.optimizer.shard_state(i)
        shards.append({"lo": u.optim_range[0], "hi": u.optim_range[1], **{
            k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in st.items()}})
    payload = {
        "rank": rank,
        "shards": shards,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "scaler": engine.scaler.state_dict() if engine.scaler else None,
    }
    path = os.path.join(tmp, f"rank_{rank:05d}.pt")
    torch.save(payload, path + ".part")
    with open(path + ".part", "rb") as f:
        os.fsync(f.fileno())
    os.replace(path + ".part", path)
    barrier()
    if rank == 0:
        meta = {
            "step": step,
            "world_size": engine.topo.world_size,
            "topology": asdict(engine.topo),
            "plan": asdict(engine.plan),
            "precision": engine.precision,
            "units": unit_table(engine),
            "trainer": trainer_state,
        }
        _atomic_write_bytes(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1).encode())
        _atomic_write_bytes(os.path.join(tmp, "config.yml"), config_yaml.encode())
        _fsync_dir(tmp)
        if os.path.isdir(final):  # re-saving the same step: move the old one aside first
            old = final + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
        _atomic_write_bytes(os.path.join(root, LATEST), f"global_step{step}\n".encode())
        _prune(root, keep_last)
    barrier()
    return final


def _prune(root: str, keep_last: int):
    if keep_last <= 0:
        return
    steps = sorted(
        (int(d[len("global_step"):]), d) for d in os.listdir(root)
        if d.startswith("global_step") and d[len("global_step"):].isdigit()
    )
    for _, d in steps[:-keep_last]:
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def resolve(path: str) -> str:
    """A ``save`` directory (its latest checkpoint) or one step's directory -> step directory."""
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint path does not exist: {path}")
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    latest = os.path.join(path, LATEST)
    if os.path.isfile(latest):
        with open(latest) as f:
            name = f.read().strip()
        d = os.path.join(path, name)
        if not os.path.isfile(os.path.join(d, "meta.json")):
            raise CheckpointError(f"{latest} points to {name}, which is missing or incomplete")
        return d
    raise CheckpointError(f"{path}: no meta.json and no '{LATEST}' file; not a checkpoint directory")


def read_meta(step_path: str) -> dict:
    try:
        with open(os.path.join(step_path, "meta.json")) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{step_path}/meta.json is unreadable: {e}") from None


def load_rank_file(step_path: str, rank: int) -> dict:
    path = os.path.join(step_path, f"rank_{rank:05d}.pt")
    if not os.path.isfile(path):
        raise CheckpointError(f"missing shard file {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data; refusing to load it ({str(e).splitlines()[0]})"
        ) from None
    except Exception as e:  # truncated/corrupt
        raise CheckpointError(f"{path} is corrupt or truncated: {type(e).__name__}: {e}") from None


def full_unit_state(step_path: str, meta: dict, unit: int, files: Optional[dict] = None) -> dict:
    """Reassemble a unit's unpadded flat master/exp_avg/exp_avg_sq from every rank's shards."""
    n = meta["units"][unit]["numel"]
    out = {k: torch.zeros(n, dtype=torch.float32) for k in ("master", "exp_avg", "exp_avg_sq")}
    have = torch.zeros(n, dtype=torch.bool)
    step = None
    files = files if files is not None else {}
    for r in range(meta["world_size"]):
        if r not in files:
            files[r] = load_rank_file(step_path, r)
        sh = files[r]["shards"][unit]
        lo, hi = sh["lo"], min(sh["hi"], n)
        if lo >= hi or have[lo:hi].all():
            continue
        for k in out:
            if sh.get(k) is not None:
                out[k][lo:hi] = sh[k][: hi - lo]
        have[lo:hi] = True
        step = sh.get("step", step)
    if not have.all():
        raise CheckpointError(f"{step_path}: unit {unit} is not fully covered by the shard files")
    out["step"] = step
    return out


def load(engine, path: str, rank: int, strict_world: bool = False) -> dict:
    """Load into ``engine`` (any plan / world size); returns the trainer state from meta.json."""
    sp = resolve(path)
    meta = read_meta(sp)
    mine = unit_table(engine)
    if len(meta["units"]) != len(mine):
        raise CheckpointError(
            f"{sp}: checkpoint has {len(meta['units'])} units, the model has {len(mine)} (different num_layers?)"
        )
    for i, (a, b) in enumerate(zip(meta["units"], mine)):
        if [p[:3] + [tuple(p[3])] for p in a["params"]] != [p[:3] + [tuple(p[3])] for p in b["params"]]:
            diff = next((pa, pb) for pa, pb in zip(a["params"], b["params"]) if pa != pb) if len(
                a["params"]) == len(b["params"]) else (len(a["params"]), len(b["params"]))
            raise CheckpointError(f"{sp}: unit {i} does not match the model: checkpoint {diff[0]} vs model {diff[1]}")
    same = meta["world_size"] == engine.topo.world_size and meta["plan"] == asdict(engine.plan)
    if strict_world and not same:
        raise CheckpointError(f"{sp}: saved on {meta['world_size']} ranks with another plan")
    own = load_rank_file(sp, rank) if same else None
    files: dict = {}
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        if own is not None:
            sh = own["shards"][i]
            st = {k: sh[k] for k in ("master", "exp_avg", "exp_avg_sq", "step")}
        else:
            full = full_unit_state(sp, meta, i, files)
            st = {"step": full["step"]}
            for k in ("master", "exp_avg", "exp_avg_sq"):
                buf = torch.zeros(hi - lo, dtype=torch.float32)
                a, b = lo, min(hi, u.numel)
                if a < b:
                    buf[: b - a] = full[k][a:b]
                st[k] = buf
        dev = engine.optimizer.params[i].device
        engine.optimizer.load_shard_state(
            i, st["master"].to(dev), st["exp_avg"].to(dev) if st["step"] is not None else None,
            st["exp_avg_sq"].to(dev) if st["step"] is not None else None, st["step"])
    if own is None and engine.scaler:
        first = files.get(0) or load_rank_file(sp, 0)
        if first["scaler"]:
            engine.scaler.load_state_dict(first["scaler"])
    if own is not None:
        torch.set_rng_state(own["rng"]["torch"])
        if own["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(own["rng"]["cuda"])
        if engine.scaler and own["scaler"]:
            engine.scaler.load_state_dict(own["scaler"])
    engine.republish()
    return meta["trainer"]
