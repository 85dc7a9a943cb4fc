"""Step-time model of the emulated cluster: 8 gloo ranks on one 2-core CPU, links shaped by tc
(docs/benchmark.md, docs/frontier.md §4.1). Built on :mod:`megatron_topo.perf_model`'s collectives
and overlap rules (``compose_passes``); what differs is the CPU: compute, quantization kernels and
gloo's own copying share the same cores.

Constants: payload rates 364-381 Mbit/s (400 Mbit/s intra-node class) and 179-190 Mbit/s (200 Mbit/s NIC) per
package (benchmark.md "Default rates and why"; configs/emulated_cpu.yml) on the links gloo uses
(``gloo_link_bytes``); ``EMULATED_TRANSPORT_GBS`` 0.84 GB/s, gloo point-to-point in a namespace
(6.5-7 Gbit/s), the CPU cost of any rank's byte; ONE FLOP rate per rank from the
unshaped step time of ddp; ONE cost per quantized element from the unshaped topo and zeropp rows.
Nothing is per strategy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..config import SystemConfig
from ..perf_model import Collective, Shape, compose_passes, plan_collectives, preset_plan
from ..topology import Topology
from ..zero_topo import layout as L
from ..zero_topo.plan import Plan


def gloo_wire_bytes(c: Collective) -> float:
    """Bytes ``c`` moves per rank under gloo: its CPU reduce-scatter moves all-reduce volume."""
    return c.bytes_sent * (2 if c.op == "reduce_scatter" else 1)


def occurrences(c: Collective, grad_accum: int) -> int:
    """How often ``c`` runs per optimizer step."""
    return grad_accum if c.per_micro_batch else 1


EMULATED_TRANSPORT_GBS = 0.84  # gloo point-to-point inside one namespace: 6.5-7 Gbit/s (benchmark.md)


@dataclass(frozen=True)
class CpuRates:
    """FLOP/s per rank (all busy), GB/s gloo moves machine-wide, s per (de)quantized element."""
    flops: float
    transport_gbs: float = EMULATED_TRANSPORT_GBS
    quant_s_per_element: float = 0.0


def gloo_link_bytes(c: Collective, plan: Plan, topo: Topology) -> dict:
    """Bytes ``c`` (whole model, all groups) puts on each shaped link (package, "nic"|"node", "out"|"in")
    as gloo moves them (the tests check the busiest links): rank-order rings, all-gather to the previous
    member, all-reduce to the next, reduce-scatter at all-reduce volume; all-to-all pairwise."""
    W, G, P = topo.world_size, topo.gcds_per_gpu, topo.ranks_per_node
    w, g, o = plan.factors
    groups = {"combine": lambda: L.strided(W, g), "post_step_all_gather": lambda: L.post_gather_groups(W, w, o),
              "grad_reduce_inter": lambda: L.two_hop_peer_groups(W, g, P)}.get(c.name, lambda: L.blocks(W, c.group_size))
    b = gloo_wire_bytes(c)
    load: dict = {}
    for grp in groups():
        d, step = len(grp), -1 if c.op == "all_gather" else 1
        sends = ([(a, x, b / (d - 1)) for a in grp for x in grp if x != a] if c.op == "all_to_all"
                 else [(a, grp[(i + step) % d], b) for i, a in enumerate(grp)] if d > 1 else [])
        for src, dst, x in sends:
            if src // G != dst // G:
                kind = "nic" if src // P != dst // P else "node"
                for key in ((src // G, kind, "out"), (dst // G, kind, "in")):
                    load[key] = load.get(key, 0.0) + x
    return load


def link_time(loads: Sequence[dict], system: SystemConfig) -> float:
    """Seconds the busiest shaped link needs for the summed ``loads`` (``gloo_link_bytes``)."""
    rate = {"nic": system.bw_inter_node_gbs * 1e9, "node": system.bw_intra_node_gbs * 1e9}
    keys = {k for ld in loads for k in ld}
    return max((sum(ld.get(k, 0.0) for ld in loads) / rate[k[1]] for k in keys), default=0.0)


def quant_elements(psi: float, plan: Plan, topo: Topology) -> dict:
    """Elements per rank and micro-batch through the quantization kernels as zero_topo/unit.py calls
    them (local shard in, gathered unit out; a secondary of the gather's bits reuses its blocks;
    gradient in, received pieces out; ZeRO++'s 2-hop requantizes 1/P of it between the hops)."""
    w, g, _ = plan.factors
    s, P, sec = plan.secondary_degree, topo.ranks_per_node, plan.secondary_bits < 16
    fwd = bwd = 0.0
    if w > 1 and plan.weight_bits < 16:
        fwd += psi / w + psi + (psi / s if s and sec and plan.secondary_bits != plan.weight_bits else 0.0)
        bwd += psi if s and sec else (0.0 if s else psi / w + psi)  # a 16-bit secondary is not quantized
    elif w > 1 and s and sec:
        fwd, bwd = psi / s, psi
    if g > 1 and plan.grad_bits < 16:
        bwd += 2 * psi + (2 * psi / P if g > P else 0.0)
    return {"forward": fwd, "backward": bwd}


def emulated_cpu_s(shape: Shape, plan: Plan, topo: Topology, micro_batch: int, recompute: bool,
                   cpu: CpuRates) -> dict:
    """CPU seconds of one rank: compute + quantization per pass of a micro-batch, and gloo's
    transport of every rank's bytes per collective occurrence (the CPU is shared)."""
    comp = shape.microbatch_flops(micro_batch, recompute) / cpu.flops
    passes = 4.0 if recompute else 3.0
    q = quant_elements(shape.params, plan, topo)
    return {"forward": comp / passes + q["forward"] * cpu.quant_s_per_element,
            "backward": comp * (passes - 1) / passes + q["backward"] * cpu.quant_s_per_element,
            "transport": {c.name: topo.world_size * gloo_wire_bytes(c) / (cpu.transport_gbs * 1e9)
                          for c in plan_collectives(shape.params, plan, topo)}}


EMULATED_OVERLAP = ("engine", "store_forward", "serial")


def estimate_emulated(shape: Shape, plan: Plan, topo: Topology, system: SystemConfig, micro_batch: int,
                      grad_accum: int, cpu: CpuRates, recompute: bool = False, overlap: str = "engine",
                      step_overlap: bool = True) -> dict:
    """Step time on the emulated cluster, never below all ranks' CPU work (the unshaped step).
    ``overlap="engine"``: ``compose_passes`` (the engine's rules) with all CPU work -- compute,
    quantization, gloo's transport -- as compute and the busiest shaped link of each pass as its
    communication; "store_forward": each collective's transport added to its link time instead
    (the copy and the wire alternating); "serial": nothing overlaps (t0 + comm)."""
    if overlap not in EMULATED_OVERLAP:
        raise ValueError(f"overlap '{overlap}' is not valid; use one of {', '.join(EMULATED_OVERLAP)}")
    cs = emulated_cpu_s(shape, plan, topo, micro_batch, recompute, cpu)
    colls = plan_collectives(shape.params, plan, topo)
    k = {c.name: occurrences(c, grad_accum) for c in colls}
    lb = {c.name: gloo_link_bytes(c, plan, topo) for c in colls}
    net = {x: link_time([v], system) for x, v in lb.items()}
    # the backward pass's collectives run together: time their union on the links, and give the
    # reduction what it adds to the gather (they often load different links: opposite ring directions)
    bag = [lb[x] for x in ("backward_all_gather",) if x in lb]
    bwd = [lb[x] for x in ("backward_all_gather", "grad_reduce", "grad_reduce_inter") if x in lb]
    if "grad_reduce" in lb:
        net["grad_reduce"] = link_time(bwd, system) - link_time(bag, system)
        net.update({"grad_reduce_inter": 0.0} if "grad_reduce_inter" in lb else {})
    tr = cs["transport"]
    t0 = grad_accum * (cs["forward"] + cs["backward"]) + sum(tr[x] * k[x] for x in tr)
    step = t0 + sum(net[x] * k[x] for x in net)
    if overlap != "serial":
        sf = overlap == "store_forward"
        comm = {x: net[x] + (tr[x] if sf else 0.0) for x in net}
        ph = {p: sum(tr[c.name] for c in colls if c.phase == p and not sf) for p in ("forward", "backward", "step")}
        fwd, bwd, ff, bl = compose_passes(colls, comm, cs["forward"] + ph["forward"], cs["backward"] + ph["backward"],
                                    shape.units, plan.prefetch, step_overlap)
        step = max(t0, (grad_accum - 1) * (fwd + bwd) + ff + bl + ph["step"])
    return {"preset": plan.preset, "step_s": step, "unshaped_s": t0, "cpu_s": cs, "net_s": net}


def calibrate_cpu(shape: Shape, topo: Topology, micro_batch: int, grad_accum: int, t0_ddp: float,
                  t0_quantized: Optional[dict] = None, recompute: bool = False,
                  transport_gbs: float = EMULATED_TRANSPORT_GBS) -> CpuRates:
    """CPU constants from measured unshaped step times: FLOP/s from ddp's after its transport; the
    cost per quantized element by least squares over ``{preset: t0}`` after compute and transport."""
    def transport(plan):
        c = emulated_cpu_s(shape, plan, topo, micro_batch, recompute, CpuRates(math.inf, transport_gbs))
        k = {x.name: occurrences(x, grad_accum) for x in plan_collectives(shape.params, plan, topo)}
        return sum(t * k[n] for n, t in c["transport"].items())

    flops = grad_accum * shape.microbatch_flops(micro_batch, recompute)
    rate = flops / (t0_ddp - transport(preset_plan("ddp", topo)))
    num = den = 0.0
    for p, t0 in (t0_quantized or {}).items():
        plan = preset_plan(p, topo)
        e = grad_accum * sum(quant_elements(shape.params, plan, topo).values())
        num, den = num + (t0 - flops / rate - transport(plan)) * e, den + e * e
    return CpuRates(rate, transport_gbs, num / den if den else 0.0)
