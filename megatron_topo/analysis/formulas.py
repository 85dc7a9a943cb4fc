"""Bytes per link level a strategy must send per step: DESIGN §4's volume table, for any plan.

Written from the table, not from the engine: per unit of padded length L (elements), M = e·L
bytes at the compute precision (e = 2 for bf16/fp16), INT8 payloads L bytes + one fp32 scale per
weight block, INT4 payloads L/2 bytes + one fp32 scale per gradient block. Ring algorithm of
record: all-gather / reduce-scatter / all-to-all send S·(d−1)/d, all-reduce 2·S·(d−1)/d, charged
to the widest level the group spans. Per micro-batch: the forward all-gather over the weight
group, the backward all-gather (from the secondary copy when there is one; the last unit stays
gathered from forward into backward and is not gathered again), the gradient reduction (16-bit
reduce-scatter, a quantized all-to-all inside the node, or ZeRO++'s 2-hop all-to-all when the
gradient group spans nodes). Per step: the cross-replica combine (all-reduce, or reduce-scatter)
and the post-step all-gather of the updated primary shard.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..topology import LEVELS, Topology


def _ag(S: float, d: int) -> float:
    return S * (d - 1) / d if d > 1 else 0.0


def _wire(L: float, d: int, bits: int, e: int, block: int) -> float:
    """Bytes one rank sends in an all-gather/all-to-all of a buffer of L elements at ``bits``."""
    if bits >= 16:
        return _ag(e * L, d)
    payload = L if bits == 8 else L / 2
    return _ag(payload, d) + _ag(4 * L / block, d)


def expected_bytes_per_rank(plan, topo: Topology, unit_lengths: Sequence[int], micro_batches: int,
                            elem_bytes: int = 2) -> dict:
    """Bytes one rank sends in one optimizer step, per level (DESIGN §4)."""
    W, P = topo.world_size, topo.ranks_per_node
    w, g, o = plan.weight_factor, plan.grad_factor, plan.optimizer_factor
    s = plan.secondary_degree if (plan.secondary_degree and w > 1) else None
    e = elem_bytes
    lv_block = lambda f: topo.level(list(range(f)))  # noqa: E731 (blocks of consecutive ranks)
    lv_stride = lambda f: topo.level(list(range(0, W, f)))  # noqa: E731 (replicas of a shard)
    out = {lvl: 0.0 for lvl in LEVELS}
    last = len(unit_lengths) - 1
    for i, L in enumerate(unit_lengths):
        if w > 1:  # forward all-gather of the primary shards
            out[lv_block(w)] += micro_batches * _wire(L, w, plan.weight_bits, e, plan.quant_block_size)
            if i != last:  # backward all-gather: from the secondary copy, or again from the primaries
                if s:
                    out[lv_block(s)] += micro_batches * _wire(L, s, plan.secondary_bits, e, plan.quant_block_size)
                else:
                    out[lv_block(w)] += micro_batches * _wire(L, w, plan.weight_bits, e, plan.quant_block_size)
        if g > 1:  # gradient reduction, every micro-batch
            if plan.grad_bits >= 16:
                out[lv_block(g)] += micro_batches * _ag(e * L, g)
            elif g <= P:
                out[lv_block(g)] += micro_batches * _wire(L, g, plan.grad_bits, e, plan.grad_quant_block_size)
            else:  # 2-hop: all-to-all in the node, then 1/P of it among the g/P node peers
                out[lv_block(P)] += micro_batches * _wire(L, P, plan.grad_bits, e, plan.grad_quant_block_size)
                out[lv_stride(P)] += micro_batches * _wire(L / P, g // P, plan.grad_bits, e,
                                                           plan.grad_quant_block_size)
        r = W // g  # replicas of each gradient shard: combined once per step
        cb = getattr(plan, "combine_bits", 16)
        if r > 1 and cb < 16:  # quantized all-to-all reduce-scatter (+ all-gather unless o == W)
            out[lv_stride(g)] += _wire(L / g, r, cb, e, plan.grad_quant_block_size) * (1 if o == W else 2)
        elif r > 1:
            if plan.inter_node_reduce == "reduce_scatter" and o == W:
                out[lv_stride(g)] += _ag(e * L / g, r)
            else:
                out[lv_stride(g)] += 2 * _ag(e * L / g, r)
        if o // w > 1:  # post-step all-gather of the updated primary shard
            grp = [q for q in range(o) if q % w == 0]
            out[topo.level(grp)] += _wire(L / w, o // w, getattr(plan, "publish_bits", 16), e, plan.quant_block_size)
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
    from ..zero_topo.plan import resolve_plan

    kw = dict(zt)
    kw.update(overrides or {})
    return resolve_plan(ZeroTopoConfig(preset=preset, **kw), topo)
