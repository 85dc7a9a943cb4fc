"""Live sharded save and load: every rank writes its optimizer shards, rank 0 publishes the step
(``meta.json``, ``config.yml``, ``latest``); loading fills an engine under any plan or world size,
after checking the model and the resume settings."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ...atomic import fsync_dir
from ...safe_files import excerpt, read_small_text
from . import storage
from .meta_schema import FileRecord, Meta, TrainerState, UnitRecord
from .offline import saved_config, unit_state_range
from .param_table import check_param_table
from .storage import FORMAT_VERSION, LATEST, CheckpointError

if TYPE_CHECKING:
    from ...config import Config
    from ..engine import ZeroTopoEngine

_FAILED = (1 << 64) - 1  # a rank's size record when its write failed


# ------------------------------------------------------------------------------- tables
def unit_table(engine: ZeroTopoEngine) -> list[dict]:
    """The engine's unit parameter tables, as meta.json records them."""
    return engine.unit_table()


# ------------------------------------------------------------------------------- save
def _gather_digests(engine: ZeroTopoEngine, item: bytes) -> list[bytes]:
    """All ranks' (size, digest) records on every rank; doubles as the 'all files written' barrier.
    Not counted in the engine's traffic counters (it is in the collective trace)."""
    if not engine.comm.distributed:
        return [item]
    dev = engine.comm.device  # NCCL/RCCL only take tensors on the runtime device
    t = torch.tensor(list(item), dtype=torch.uint8, device=dev)
    out = torch.empty(t.numel() * engine.topo.world_size, dtype=torch.uint8, device=dev)
    engine.comm.all_gather(out, t, engine.comm.world, account=False)
    raw = engine.comm.to_host(out).numpy().tobytes()
    n = len(item)
    records = [raw[i * n : (i + 1) * n] for i in range(engine.topo.world_size)]
    records[engine.comm.rank] = item  # exact even where the gather carries no data (dry run)
    return records


def save(
    engine: ZeroTopoEngine,
    root: str,
    step: int,
    trainer_state: TrainerState,
    config_yaml: str,
    rank: int,
    barrier: Callable[[], None],
    keep_last: int = 2,
    fault: Optional[Callable[..., None]] = None,
) -> str:
    """Collective: every rank calls it. Returns the final step directory. ``fault(point, rank=,
    step=)`` is called at the two kill points ``save`` and ``publish`` (the trainer passes the test
    fault injection's ``maybe_fail``; None: nothing)."""
    final = storage.step_dir(root, step)
    tmp = os.path.join(root, f".tmp_global_step{step}")
    if rank == 0:
        storage.check_save_dir(root)
        os.makedirs(root, exist_ok=True)
        storage.clean_leftovers(root, keep="")
        os.makedirs(tmp)
    barrier()
    holder = rank < engine.plan.optimizer_factor
    state = engine.state_dict(optimizer=holder)
    payload = {
        "format": FORMAT_VERSION,
        "rank": rank,
        "step": step,
        "holder": holder,
        "shards": state["shards"],
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        "scaler": state["scaler"],
        # this rank's error-feedback residuals (zero_topo.error_feedback); only a resume on the
        # same world and plan restores them (resharded, they start from zero)
        "error_feedback": state["error_feedback"],
    }
    try:
        size, digest = storage.atomic_torch_save(payload, storage.rank_file(tmp, rank))
        failure = None
    except (OSError, RuntimeError) as e:  # a full disk: every rank learns of it through the gather
        size, digest, failure = _FAILED, "00" * 32, storage.write_failure(e, tmp)
    if fault is not None:
        fault("save", rank=rank, step=step)
    records = _gather_digests(engine, size.to_bytes(8, "little") + bytes.fromhex(digest))
    failed = [r for r, rec in enumerate(records) if int.from_bytes(rec[:8], "little") == _FAILED]
    if failed:
        _abandon_save(root, tmp, rank, step, failed, failure)
    try:
        if rank == 0:
            _publish(engine, root, tmp, final, step, trainer_state, config_yaml, records, keep_last, fault)
        ok = True
    except OSError as e:
        ok, failure = False, storage.write_failure(e, root)
    status = _gather_digests(engine, bytes([0 if ok else 1]))  # doubles as the closing barrier
    if any(s[0] for s in status):
        _abandon_save(root, tmp, rank, step, [r for r, s in enumerate(status) if s[0]], failure)
    return final


def _abandon_save(root: str, tmp: str, rank: int, step: int, failed: list[int], failure: Optional[str]) -> None:
    """Every rank calls it after a failed write: rank 0 removes the partial step; all raise."""
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    prev = "there is no previous checkpoint"
    if os.path.lexists(os.path.join(root, LATEST)):  # read as a reader would: capped, not through a link out
        try:
            name = read_small_text(storage.folder_file(root, LATEST), storage.LATEST_CAP, CheckpointError).strip()
            shown = name if re.fullmatch(r"global_step[0-9]{1,18}", name) else excerpt(name)
            prev = f"the previous checkpoint ({shown}) is intact"
        except CheckpointError:
            prev = f"'{LATEST}' is left as it was"
    who = f"rank {failed[0]}" + (f" and {len(failed) - 1} more" if len(failed) > 1 else "")
    why = failure or "another rank could not write its file"
    raise CheckpointError(
        f"saving step {step} into {root} failed on {who}: {why}; the partial files were "
        f"removed and {prev}; free disk space (or set save elsewhere) and resume"
    )


def _publish(
    engine: ZeroTopoEngine,
    root: str,
    tmp: str,
    final: str,
    step: int,
    trainer_state: TrainerState,
    config_yaml: str,
    records: list[bytes],
    keep_last: int,
    fault: Optional[Callable[..., None]] = None,
) -> None:
    """Rank 0: meta.json + config.yml, then the atomic renames and ``latest``."""
    files = {
        os.path.basename(storage.rank_file(tmp, r)): FileRecord(int.from_bytes(rec[:8], "little"), rec[8:].hex())
        for r, rec in enumerate(records)
    }
    cfg_bytes = config_yaml.encode()
    meta = Meta(
        FORMAT_VERSION,
        step,
        engine.topo.world_size,
        asdict(engine.plan),
        engine.plan.optimizer_factor,
        [UnitRecord.of(u) for u in unit_table(engine)],
        trainer_state,
        files,
        config=FileRecord(len(cfg_bytes), hashlib.sha256(cfg_bytes).hexdigest()),
        topology=asdict(engine.topo),
        precision=engine.precision,
    )
    storage._atomic_write_bytes(os.path.join(tmp, "config.yml"), cfg_bytes)
    storage._atomic_write_bytes(os.path.join(tmp, "meta.json"), json.dumps(meta.to_record(), indent=1).encode())
    if fault is not None:
        fault("publish", rank=0, step=step)
    if os.path.isdir(final):  # re-saving the same step: move the old one aside first
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
        fsync_dir(root)
    storage._atomic_write_bytes(os.path.join(root, LATEST), f"global_step{step}\n".encode())
    storage.prune(root, keep_last, protect=os.path.basename(final))


# ------------------------------------------------------------------------------- load
def check_compatible(sp: str, meta: Meta, mine: list[dict]) -> None:
    """The checkpoint's unit parameter tables must equal the model's (names, offsets, numels,
    shapes): :func:`.param_table.check_param_table`, the check every reader applies."""
    check_param_table(sp, meta, mine)


def _saved_config(sp: str, meta: Meta, read_config: Callable[[str], Config]) -> Optional[Config]:
    """The Config the checkpoint was saved with, or None when it has no config.yml. The package
    parses no config: ``read_config(path)`` does (the caller's ``config.load_config`` on one file)."""
    return saved_config(sp, meta, read_config)


def architecture_diff(sp: str, meta: Meta, cfg: Config, read_config: Callable[[str], Config]) -> list[str]:
    """``key saved -> now`` for every architecture key (of either model spec) the run's model
    config changes (empty when the checkpoint has no config.yml, which ``read_config`` parses)."""
    from ...model.spec import spec_for

    saved = _saved_config(sp, meta, read_config)
    if saved is None:
        return []
    keys = dict.fromkeys((*spec_for(saved.model).arch_keys, *spec_for(cfg.model).arch_keys))
    return [
        f"{k} {getattr(saved.model, k)!r} -> {getattr(cfg.model, k)!r}"
        for k in keys
        if getattr(saved.model, k) != getattr(cfg.model, k)
    ]


def check_resume(sp: str, meta: Meta, cfg: Config, read_config: Callable[[str], Config]) -> None:
    """A resume must keep the architecture (every key of the model spec's arch_keys; the plan, world size and
    precision may change) and have steps left to train."""
    diff = architecture_diff(sp, meta, cfg, read_config)
    if diff:
        raise CheckpointError(
            f"{sp}: the model config differs from the checkpoint's ({'; '.join(diff)}); "
            f"resume with the saved values or start a new run (another plan or world size "
            f"is fine)"
        )
    step = meta.step
    if cfg.train.train_iters < step:
        raise CheckpointError(
            f"{sp} is at step {step} but train_iters is {cfg.train.train_iters}; set "
            f"train_iters above {step} to continue training (nothing was loaded or written)"
        )


def load(
    engine: ZeroTopoEngine,
    path: str,
    rank: int,
    strict_world: bool = False,
    config: Optional[Config] = None,
    unverified: bool = False,
    read_config: Optional[Callable[[str], Config]] = None,
) -> TrainerState:
    """Load into ``engine`` (any plan / world size); returns the trainer state from meta.json.
    With ``config`` (the run's Config) and ``read_config`` (parses the saved config.yml), a changed
    architecture or a ``train_iters`` below the saved step is refused first."""
    if config is not None and read_config is None:
        raise TypeError("checkpoint.load: config needs read_config (config.load_config on one file)")
    sp = storage.resolve(path)
    meta = storage.read_meta(sp, unverified=unverified)
    check_compatible(sp, meta, unit_table(engine))
    if config is not None:
        check_resume(sp, meta, config, read_config)
    same = meta.world_size == engine.topo.world_size and meta.plan == asdict(engine.plan)
    if strict_world and not same:
        raise CheckpointError(f"{sp}: saved on {meta.world_size} ranks with another plan")
    holders = meta.holders
    own = None
    if same:
        own = storage.load_rank_file(sp, rank, meta)
        src = own if rank < holders else storage.load_rank_file(sp, rank % holders, meta)
    files: dict = {}
    shards = []
    for i, (lo, hi) in enumerate(engine.shard_ranges()):
        if own is not None:
            sh = src["shards"][i]
            if (int(sh["lo"]), int(sh["hi"])) != (lo, hi):
                raise CheckpointError(
                    f"{storage.rank_file(sp, rank % holders)}: unit {i} range "
                    f"[{sh['lo']}, {sh['hi']}) differs from this rank's [{lo}, {hi}) "
                    f"under the same plan"
                )
            st = storage._shard_tensors(storage.rank_file(sp, rank % holders), sh, i)
            if "master" not in st:
                raise CheckpointError(f"{storage.rank_file(sp, rank % holders)}: unit {i} has no master weights")
            st["step"] = sh.get("step")
        else:  # another plan or world size: read only the saved shards overlapping [lo, hi)
            st = unit_state_range(sp, meta, i, lo, hi, files)
        shards.append(st)
    state = {"shards": shards, "scaler": None, "error_feedback": None}
    if own is None and engine.scaler:
        first = files.get(0) or storage.load_rank_file(sp, 0, meta)  # the scaler state is the same on every rank
        state["scaler"] = first.get("scaler")
    if own is not None:
        torch.set_rng_state(own["rng"]["torch"])
        if own["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(own["rng"]["cuda"])
        state["scaler"], state["error_feedback"] = own.get("scaler"), own.get("error_feedback")
    engine.load_state_dict(state)
    return meta.trainer


# ------------------------------------------------------------------------------- live state
def gather_full_state(engine: ZeroTopoEngine) -> list[dict]:
    """Collective: every unit's unpadded flat master/exp_avg/exp_avg_sq (+ Adam step) as the
    engine holds them now, gathered over the optimizer group (tests, live export); the engine's
    traffic counters are left as they were (:meth:`~..engine.ZeroTopoEngine.full_state`)."""
    return engine.full_state()
