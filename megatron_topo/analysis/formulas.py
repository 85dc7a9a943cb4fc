"""Bytes per link level a strategy must send per step, exactly, for any plan (docs/design.md §4.8).

The per-step collective table is what the plan's transports declare (``zero_topo.traffic``), as
the performance model charges it (``perf_model.unit_collectives``), taken here per unit of padded
length L (elements) with the quantization scales: M = e·L bytes at the compute precision (e = 2
for bf16/fp16), INT8 payloads L bytes and INT4 L/2 bytes, plus one fp32 scale per weight or
gradient block; each collective costs ``zero_topo.volumes.ring_bytes``,
charged to the widest level its group spans. The last unit stays gathered from forward into
backward and is not gathered again.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..topology import LEVELS, Topology
from .perf_model.collectives import unit_collectives


def expected_bytes_per_rank(
    plan, topo: Topology, unit_lengths: Sequence[int], micro_batches: int, elem_bytes: int = 2
) -> dict:
    """Bytes one rank sends in one optimizer step, per level (docs/design.md §4.8)."""
    out = {lvl: 0.0 for lvl in LEVELS}
    last = len(unit_lengths) - 1
    for i, L in enumerate(unit_lengths):
        for c in unit_collectives(L, plan, topo, elem_bytes, scales=True):
            if c.name == "backward_all_gather" and i == last:
                continue
            out[c.level] += micro_batches * c.bytes_sent if c.per_micro_batch else c.bytes_sent
    return out


def unit_lengths(model_cfg, plan, world_size: int) -> list[int]:
    """Padded flat length of every unit, as the nested layout pads it (whole blocks per shard)."""
    from ..model import unit_numels
    from ..zero_topo.memory import padded_units

    numels = [n for n in unit_numels(model_cfg) if n]
    return padded_units(numels, plan, world_size)


def raw_unit_lengths(model_cfg) -> list[int]:
    from ..model import unit_numels

    return unit_numels(model_cfg)


def check(got: dict, want: dict, rel: float = 0.0, abs_tol: float = 1.0) -> tuple[str, dict]:
    """('OK' | 'MISMATCH', per-level relative differences) comparing counters to a formula."""
    diffs, ok = {}, True
    for lvl in LEVELS:
        g, w = float(got.get(lvl, 0)), float(want.get(lvl, 0))
        diffs[lvl] = (g - w) / w if w else (0.0 if g == 0 else float("inf"))
        if abs(g - w) > max(abs_tol, rel * w):
            ok = False
    return ("OK" if ok else "MISMATCH"), diffs


def total_over_ranks(per_rank: dict, world_size: int) -> dict:
    return {k: v * world_size for k, v in per_rank.items()}


def plan_for(preset: str, topo: Topology, overrides: Optional[dict] = None, **zt) -> object:
    """The Plan a preset resolves to on ``topo`` (with zero_topo overrides)."""
    from ..config import ZeroTopoConfig
    from ..zero_topo.sharding import resolve_plan

    kw = dict(zt)
    kw.update(overrides or {})
    return resolve_plan(ZeroTopoConfig(preset=preset, **kw), topo)
