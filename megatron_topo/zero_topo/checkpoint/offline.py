"""Offline checkpoint readers: a unit's flat state (or any range of it) reassembled from the rank
files of any plan, the whole model and optimizer state, and the saved config; one process, no
engine."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from ...safe_files import MIB, read_small, why_not_a_file
from ..layout import UnitLayout
from . import meta_schema, storage
from .meta_schema import Meta
from .storage import STATE_KEYS, CheckpointError

if TYPE_CHECKING:
    from ...config import Config, ModelConfig

CONFIG_CAP = 16 * MIB  # a step's config.yml: a few KB of YAML


# ------------------------------------------------------------------------------- units
def _holder_ranges(meta: Meta, unit: int) -> Optional[list[tuple[int, int, int]]]:
    """(rank, lo, hi) of every holder's optimizer shard of ``unit``, computed from the saved plan
    (no file opened); None for checkpoints that do not record their holders."""
    if not meta.shard_holders:
        return None
    u, plan = meta.units[unit], meta.plan
    try:
        lay = UnitLayout(
            int(u.numel),
            int(u.padded),
            int(plan["weight_factor"]),
            int(plan["grad_factor"]),
            int(plan["optimizer_factor"]),
        )
        return [(r, *lay.optim_range(r)) for r in range(int(meta.shard_holders))]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CheckpointError(f"meta.json: plan {plan} does not describe unit {unit}'s layout") from None


def unit_state_range(
    step_path: str,
    meta: Meta,
    unit: int,
    a: int,
    b: int,
    files: Optional[dict] = None,
    keys: Sequence[str] = STATE_KEYS,
) -> dict:
    """master/exp_avg/exp_avg_sq of elements ``[a, b)`` of ``unit``'s flat buffer (zeros beyond
    the real parameters) and the Adam step, reading only the shard files that overlap. ``keys``
    (which must include ``master``) limits what is read: ``("master",)`` never touches the moments
    (the rank files are memory-mapped, so the bytes of other keys and units are not read)."""
    if "master" not in keys:
        raise ValueError(f"keys {keys!r} must include 'master'")
    n = int(meta.units[unit].numel)
    out = {k: torch.zeros(b - a, dtype=torch.float32) for k in keys}
    end = min(b, n)
    have = torch.zeros(max(end - a, 0), dtype=torch.bool)
    files = files if files is not None else {}
    step = None
    ranges = _holder_ranges(meta, unit)
    if ranges is None:  # older checkpoints: every rank file, ranges from the files themselves
        ranges = [(r, None, None) for r in range(int(meta.world_size))]
    for r, olo, ohi in ranges:
        if olo is not None and (min(ohi, end) <= max(olo, a)):
            continue
        if r not in files:
            files[r] = storage.load_rank_file(step_path, r, meta)
        sh = files[r]["shards"][unit]
        lo, hi = int(sh["lo"]), int(sh["hi"])
        if olo is not None and (lo, hi) != (olo, ohi):
            raise CheckpointError(
                f"{storage.rank_file(step_path, r)}: unit {unit} range [{lo}, {hi}) does not match "
                f"the saved plan's [{olo}, {ohi})"
            )
        x, y = max(a, lo), min(end, hi)
        if x >= y or bool(have[x - a : y - a].all()):
            continue
        tens = storage._shard_tensors(storage.rank_file(step_path, r), sh, unit, keys)
        if "master" not in tens:
            raise CheckpointError(f"{storage.rank_file(step_path, r)}: unit {unit} has no master weights")
        for k, v in tens.items():
            out[k][x - a : y - a] = v[x - lo : y - lo]
        have[x - a : y - a] = True
        if sh.get("step") is not None:
            step = sh["step"]
    if not bool(have.all()):
        raise CheckpointError(f"{step_path}: unit {unit} is not fully covered by the shard files")
    if step is None and ranges:  # [a, b) is all padding: the Adam step is still the unit's step
        r = ranges[0][0]
        if r not in files:
            files[r] = storage.load_rank_file(step_path, r, meta)
        step = files[r]["shards"][unit].get("step")
    out["step"] = step.clone() if torch.is_tensor(step) else step  # not a view of the mapped file
    return out


def full_unit_state(
    step_path: str, meta: Meta, unit: int, files: Optional[dict] = None, keys: Sequence[str] = STATE_KEYS
) -> dict:
    """Reassemble a unit's unpadded flat master/exp_avg/exp_avg_sq (+ Adam step) from the shards;
    ``keys=("master",)`` reads the master weights only."""
    return unit_state_range(step_path, meta, unit, 0, int(meta.units[unit].numel), files, keys)


# ------------------------------------------------------------------------------- config
def read_config_yaml(sp: str, meta: Meta) -> Optional[str]:
    """The step's config.yml text, checked against the digest meta.json records (None if absent)."""
    path = storage.folder_file(sp, "config.yml")  # a symbolic link out of the step folder is refused
    if os.path.lexists(path) and not os.path.isfile(path):
        raise CheckpointError(f"{path} {why_not_a_file(path)}")
    if not os.path.isfile(path):
        if meta.config:
            raise CheckpointError(f"{path} is missing; meta.json records one")
        return None
    raw = read_small(path, CONFIG_CAP, CheckpointError)  # non-blocking, size-capped
    rec = meta.config
    if rec and (len(raw) != rec.bytes or hashlib.sha256(raw).hexdigest() != rec.sha256):
        raise CheckpointError(
            f"{path} was changed after the save: its SHA-256 differs from the one recorded in "
            f"meta.json (the model it describes may not be the one saved)"
        )
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path} is not UTF-8 text") from None


def saved_config(sp: str, meta: Meta, read_config: Callable[[str], Config]) -> Optional[Config]:
    """The Config the checkpoint was saved with (its config.yml, verified against meta.json and parsed
    by ``read_config``: the caller's ``config.load_config`` on one file), checked against meta.json
    (:func:`check_saved_config`); None when the checkpoint has no config.yml."""
    from ...config.options import ConfigError

    if read_config_yaml(sp, meta) is None:
        return None
    path = os.path.join(sp, "config.yml")
    try:
        cfg = read_config(path)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    check_saved_config(sp, meta, cfg)
    return cfg


def check_saved_config(sp: str, meta: Meta, cfg: Config) -> None:
    """meta.json's fields that restate the saved config must agree with it (the check every reader
    that parses the step's config.yml applies): ``precision`` is the saved run's."""
    if meta.precision is not None and meta.precision != cfg.precision:
        raise CheckpointError(
            f"{os.path.join(sp, 'meta.json')}: precision: {meta.precision!r} differs from the saved "
            f"config.yml's precision {cfg.precision!r} (the run that saved it): meta.json does not describe "
            f"this checkpoint"
        )


# ------------------------------------------------------------------------------- full states
def read_full_state(
    path: str, keys: Sequence[str] = STATE_KEYS, unverified: bool = False, ask: str = meta_schema.ASK_UNVERIFIED
) -> dict:
    """The whole model and optimizer state of a checkpoint, in one process (no engine needed).

    Returns ``{"step_dir", "meta", "config_yaml", "params": {name: fp32 tensor},
    "optimizer": {name: {"exp_avg", "exp_avg_sq"}}, "adam_step": {name: float}, "units": [per-unit
    flat state]}`` with every tensor reassembled from the shard files; ``params`` and ``optimizer``
    are views into the ``units`` buffers (one copy of the state in memory). ``keys=("master",)``
    reads the weights only (``optimizer`` and ``adam_step`` are then empty). Exports that need not
    hold the model read unit by unit instead (:func:`full_unit_state`). ``unverified``/``ask``: as
    :func:`storage.read_meta`.
    """
    sp = storage.resolve(path)
    meta = storage.read_meta(sp, unverified, ask)
    config_yaml = read_config_yaml(sp, meta)  # an edited config.yml fails before any shard is read
    files: dict = {}
    params, optim, steps, units = {}, {}, {}, []
    for i, u in enumerate(meta.units):
        full = full_unit_state(sp, meta, i, files, keys)
        units.append(full)
        step = None if full["step"] is None or "exp_avg" not in full else float(full["step"])
        for p in u.params:
            name, sl, shape = p.name, slice(p.offset, p.offset + p.numel), p.shape
            params[name] = full["master"][sl].view(*shape)
            if step is not None:
                optim[name] = {k: full[k][sl].view(*shape) for k in ("exp_avg", "exp_avg_sq")}
                steps[name] = step
    return {
        "step_dir": sp,
        "meta": meta,
        "config_yaml": config_yaml,
        "params": params,
        "optimizer": optim,
        "adam_step": steps,
        "units": units,
    }


def load_model_config(state: dict, read_config: Callable[[str], Config]) -> ModelConfig:
    """The ModelConfig a checkpoint was saved with: its config.yml parsed by ``read_config`` (the
    caller's ``config.load_config`` on one file, the safe loader; the package parses no config),
    checked against meta.json (:func:`check_saved_config`)."""
    from ...config.options import ConfigError

    sp = state["step_dir"]
    path = os.path.join(sp, "config.yml")
    if state.get("config_yaml") is None:
        raise CheckpointError(f"{sp} has no config.yml; cannot tell the model's shape")
    try:
        cfg = read_config(path)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    check_saved_config(sp, state["meta"], cfg)
    return cfg.model
