"""What a :class:`~.engine.ZeroTopoEngine` holds, read and written from outside: this rank's
training state (:func:`state_dict` / :func:`load_state_dict`, what a checkpoint saves), the
parameter table of its units, the full state gathered over the optimizer group, and the bytes of
model states it holds. The engine's methods of the same names call these; the checkpoint package
goes through those methods, never through the engine's units or optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from . import layout as L

if TYPE_CHECKING:
    from .engine import ZeroTopoEngine

STATE_KEYS = ("master", "exp_avg", "exp_avg_sq")


def unit_table(engine: ZeroTopoEngine) -> list[dict]:
    """Per unit: its padded and real element counts and its parameters' [name, offset, numel, shape]."""
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return [
        {
            "padded": u.layout.padded,
            "numel": u.numel,
            "params": [[names[id(s.param)], s.offset, s.numel, list(s.shape)] for s in u.specs],
        }
        for u in engine.units
    ]


def shard_ranges(engine: ZeroTopoEngine) -> list[tuple[int, int]]:
    """Per unit: the [lo, hi) of the unit's flat buffer whose optimizer state this rank holds."""
    return [u.optim_range for u in engine.units]


def state_dict(engine: ZeroTopoEngine, optimizer: bool = True) -> dict[str, Any]:
    """This rank's training state, on the host: ``shards`` (per unit its range in the flat buffer
    and, with ``optimizer``, its optimizer shard: master, exp_avg, exp_avg_sq, Adam step),
    ``scaler`` (fp16's loss scaler, else None) and ``error_feedback`` (per unit the residuals of
    the low-bit reduction and combine, when the plan keeps them, else None)."""
    shards = []
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        entry = {"unit": i, "lo": lo, "hi": hi, "padded": u.layout.padded, "numel": u.numel}
        if optimizer:
            st = engine.optimizer.shard_state(i)
            entry.update({k: (engine.comm.to_host(v).clone() if torch.is_tensor(v) else v) for k, v in st.items()})
        shards.append(entry)
    return {
        "shards": shards,
        "scaler": engine.scaler.state_dict() if engine.scaler else None,
        "error_feedback": [
            {
                k: None if t is None else engine.comm.to_host(t).clone()
                for k, t in (("reduce", u.ef_reduce), ("combine", u.ef_combine))
            }
            for u in engine.units
        ]
        if engine.plan.error_feedback
        else None,
    }


def load_state_dict(engine: ZeroTopoEngine, state: dict[str, Any]) -> None:
    """Fill the engine from ``state`` (the layout of :func:`state_dict`; each shard a dict of
    ``master`` and, unless its ``step`` is None, ``exp_avg`` and ``exp_avg_sq``, for this rank's
    ranges), then rebuild every primary shard from the masters. ``scaler`` and ``error_feedback``
    are applied when present and the engine keeps them."""
    for i, st in enumerate(state["shards"]):
        dev = engine.optimizer.params[i].device
        has_moments = st["step"] is not None and "exp_avg" in st and "exp_avg_sq" in st
        engine.optimizer.load_shard_state(
            i,
            st["master"].to(dev),
            st["exp_avg"].to(dev) if has_moments else None,
            st["exp_avg_sq"].to(dev) if has_moments else None,
            st["step"],
        )
    if engine.scaler and state.get("scaler"):
        engine.scaler.load_state_dict(state["scaler"])
    if engine.plan.error_feedback and state.get("error_feedback"):
        for u, ef in zip(engine.units, state["error_feedback"]):
            u.ef_reduce = None if ef["reduce"] is None else ef["reduce"].to(u.device, copy=True)
            u.ef_combine = None if ef["combine"] is None else ef["combine"].to(u.device, copy=True)
    engine.republish()


@torch.no_grad()
def full_state(engine: ZeroTopoEngine) -> list[dict]:
    """Collective: every unit's unpadded flat master/exp_avg/exp_avg_sq (+ Adam step) as the
    engine holds them now, gathered over the optimizer group (tests, live export). The engine's
    traffic counters are left as they were."""
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
                full[s * n : (s + 1) * n].copy_(parts[j, a])
            entry[k] = full[: u.numel].cpu()
        out.append(entry)
    engine.comm.bytes.update(saved)
    return out


def model_state_bytes(engine: ZeroTopoEngine) -> dict[str, int]:
    """Bytes of model states this rank holds, measured from tensor storage."""

    def nbytes(t: Optional[torch.Tensor]) -> int:
        return 0 if t is None else t.untyped_storage().nbytes()

    out = {"weights": 0, "secondary": 0, "gradients": 0, "optimizer": 0, "residuals": 0}
    for u in engine.units:
        out["residuals"] += nbytes(u.ef_reduce) + nbytes(u.ef_combine)
        out["weights"] += nbytes(u.primary)
        if isinstance(u.secondary, tuple):
            out["secondary"] += sum(nbytes(t) for t in u.secondary)
        else:
            out["secondary"] += nbytes(u.secondary)
        out["gradients"] += nbytes(u.grad_acc)
    out["optimizer"] = engine.optimizer.state_bytes()
    out["total"] = sum(out.values())
    return out


def full_parameters(engine: ZeroTopoEngine) -> dict[str, torch.Tensor]:
    """Gather the current fp32 master weights of every parameter (collective; tests, export)."""
    out = {}
    for u, master in zip(engine.units, engine.optimizer.params):
        full = torch.empty(u.layout.optim_numel * u.plan.optimizer_factor, dtype=torch.float32, device=master.device)
        grp = engine.groups.optim
        tmp = torch.empty(master.numel() * grp.size, dtype=torch.float32, device=master.device)
        engine.comm.all_gather(tmp, master.detach(), grp)
        n = master.numel()
        for i, r in enumerate(grp.ranks):
            j = L.shard_index(r, u.layout.chain())
            full[j * n : (j + 1) * n].copy_(tmp[i * n : (i + 1) * n])
        names = {id(p): n for n, p in engine.module.named_parameters()}
        for s in u.specs:
            out[names[id(s.param)]] = full[s.offset : s.offset + s.numel].view(s.shape).clone()
    return out
