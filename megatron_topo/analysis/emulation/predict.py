"""Step-time model of the emulated cluster: 8 gloo ranks on one 2-core CPU, links shaped by tc
(docs/benchmark.md, docs/frontier.md §4.1). Built on :mod:`megatron_topo.analysis.perf_model`'s collectives
and overlap rules (``compose_passes``); what differs is the CPU: compute, quantization kernels and
gloo's own copying share the same cores.

Constants: payload rates 364-381 Mbit/s (400 Mbit/s intra-node class) and 179-190 Mbit/s (200 Mbit/s NIC) per
package (benchmark.md "Default rates and why"; configs/emulated_cpu.yml) on the links gloo uses
(``gloo_link_bytes``). CPU: ``fit_cpu`` fits five constants (FLOP/s per rank, gloo's machine-wide
copy rate, s per quantized element, s per collective ring step, s per optimizer-shard parameter)
over measured unshaped steps of many plans and accumulation counts (configs/emulated_cpu.yml holds
the accumulation series' fit); ``calibrate_cpu`` is the older two-constant calibration (FLOP/s from the
unshaped step time of ddp, the copy rate fixed at ``EMULATED_TRANSPORT_GBS``, 6.5-7 Gbit/s, gloo point-to-point in one
namespace) used by ``tools/predict_perf.py --emulated``. Nothing is per strategy; another
implementation of a plan (PyTorch FSDP2) gets one constant of its own (``fit_stack_overhead``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from ...config import SystemConfig
from ...topology import Topology
from ...zero_topo import layout as L
from ...zero_topo.sharding import Plan
from ...zero_topo.traffic import transports_of
from ..perf_model import Collective, Shape, compose_passes, plan_collectives, preset_plan
from ..perf_model.step import combine_tail


def gloo_wire_bytes(c: Collective) -> float:
    """Bytes ``c`` moves per rank under gloo: its CPU reduce-scatter moves all-reduce volume."""
    return c.bytes_sent * (2 if c.op == "reduce_scatter" else 1)


def occurrences(c: Collective, grad_accum: int) -> int:
    """How often ``c`` runs per optimizer step."""
    return grad_accum if c.per_micro_batch else 1


EMULATED_TRANSPORT_GBS = 0.84  # gloo point-to-point inside one namespace: 6.5-7 Gbit/s (benchmark.md)


@dataclass(frozen=True)
class CpuRates:
    """FLOP/s per rank (all busy), GB/s gloo moves machine-wide, s per (de)quantized element,
    s per ring step of a collective call (gloo and Python overhead), s per optimizer-shard parameter."""

    flops: float
    transport_gbs: float = EMULATED_TRANSPORT_GBS
    quant_s_per_element: float = 0.0
    call_s: float = 0.0
    optimizer_s_per_param: float = 0.0


def call_steps(c: Collective, n_units: int) -> int:
    """Ring steps of one occurrence of ``c`` over the whole model (every unit, payload and scales)."""
    return n_units * c.steps


def gloo_link_bytes(c: Collective, plan: Plan, topo: Topology) -> dict:
    """Bytes ``c`` (whole model, all groups) puts on each shaped link (package, "nic"|"node", "out"|"in")
    as gloo moves them (the tests check the busiest links): rank-order rings, all-gather to the previous
    member, all-reduce to the next, reduce-scatter at all-reduce volume; all-to-all pairwise."""
    W, G, P = topo.world_size, topo.gcds_per_gpu, topo.ranks_per_node
    w, g, o = plan.factors
    groups = {
        "replicas": lambda: L.strided(W, g),
        "post_gather": lambda: L.post_gather_groups(W, w, o),
        "two_hop_peers": lambda: L.two_hop_peer_groups(W, g, P),
    }.get(c.partition, lambda: L.blocks(W, c.group_size))
    b = gloo_wire_bytes(c)
    load: dict = {}
    for grp in groups():
        d, step = len(grp), -1 if c.op == "all_gather" else 1
        sends = (
            [(a, x, b / (d - 1)) for a in grp for x in grp if x != a]
            if c.op == "all_to_all"
            else [(a, grp[(i + step) % d], b) for i, a in enumerate(grp)]
            if d > 1
            else []
        )
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
    """Elements per rank and micro-batch through the quantization kernels as zero_topo/unit.py and
    transports.py call them, summed per phase from what each transport declares
    (``zero_topo.traffic.Transport.quantized``): forward and backward per micro-batch, the combine
    and publish once per step."""
    out = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    for t in transports_of(plan, topo.world_size, topo.ranks_per_node, psi):
        out[t.phase] += t.quantized
    return out


def emulated_cpu_s(shape: Shape, plan: Plan, topo: Topology, micro_batch: int, recompute: bool, cpu: CpuRates) -> dict:
    """CPU seconds of one rank: compute, quantization and the ring-step calls of its collectives
    per pass of a micro-batch; step(): the once-per-step quantization and the optimizer; gloo's
    transport of every rank's bytes per collective occurrence (the CPU is shared); and the calls of
    the once-per-step collectives, which run while their bytes are on the wire."""
    comp = shape.microbatch_flops(micro_batch, recompute) / cpu.flops
    passes = 4.0 if recompute else 3.0
    q = quant_elements(shape.params, plan, topo)
    colls = plan_collectives(shape.params, plan, topo)
    calls = {c.name: call_steps(c, shape.units) * cpu.call_s for c in colls}
    in_pass = {p: sum(calls[c.name] for c in colls if c.phase == p) for p in ("forward", "backward")}
    return {
        "forward": comp / passes + q["forward"] * cpu.quant_s_per_element + in_pass["forward"],
        "backward": comp * (passes - 1) / passes + q["backward"] * cpu.quant_s_per_element + in_pass["backward"],
        "step": q["step"] * cpu.quant_s_per_element + shape.params / plan.optimizer_factor * cpu.optimizer_s_per_param,
        "transport": {c.name: gloo_copy_s(c, topo, cpu.transport_gbs) for c in colls},
        "step_calls": {c.name: calls[c.name] for c in colls if c.phase == "step"},
    }


def gloo_copy_s(c: Collective, topo: Topology, transport_gbs: float) -> float:
    """CPU seconds gloo spends copying every rank's bytes of one occurrence of ``c`` (the CPU is shared)."""
    return topo.world_size * gloo_wire_bytes(c) / (transport_gbs * 1e9)


def transport_bytes(shape: Shape, plan: Plan, topo: Topology, grad_accum: int) -> float:
    """Bytes gloo copies for all ranks over one optimizer step: every collective at its number of occurrences."""
    return sum(
        topo.world_size * gloo_wire_bytes(c) * occurrences(c, grad_accum)
        for c in plan_collectives(shape.params, plan, topo)
    )


def transport_s(shape: Shape, plan: Plan, topo: Topology, grad_accum: int, transport_gbs: float) -> float:
    """gloo's copying over one optimizer step at ``transport_gbs`` (the CPU is shared)."""
    return transport_bytes(shape, plan, topo, grad_accum) / (transport_gbs * 1e9)


def quantized_per_step(psi: float, plan: Plan, topo: Topology, grad_accum: int) -> float:
    """Elements through the quantization kernels over one optimizer step."""
    q = quant_elements(psi, plan, topo)
    return grad_accum * (q["forward"] + q["backward"]) + q["step"]


NOMINAL_BPS = {
    "inter_node": 200e6,
    "intra_node": 400e6,
}  # the rates configs/emulated_cpu.yml's payload rates were measured at
UNSHAPED_GBS = 1e6  # an unshaped link: its only cost is gloo's copying, counted as CPU transport


def emulated_system(system: SystemConfig, inter_bps: Optional[float], intra_bps: Optional[float]) -> SystemConfig:
    """``system`` (configs/emulated_cpu.yml, measured at ``NOMINAL_BPS``) with its payload rates
    scaled to other tc rates; ``None`` is an unshaped level (NVLink-like inside a node)."""

    def scaled(gbs: float, bps: Optional[float], level: str) -> float:
        return UNSHAPED_GBS if bps is None else gbs * bps / NOMINAL_BPS[level]

    return dataclasses.replace(
        system,
        bw_inter_node_gbs=scaled(system.bw_inter_node_gbs, inter_bps, "inter_node"),
        bw_intra_node_gbs=scaled(system.bw_intra_node_gbs, intra_bps, "intra_node"),
    )


def cpu_rates(system: SystemConfig) -> CpuRates:
    """The CPU constants an ``emulated_cpu`` system block states (configs/emulated_cpu.yml)."""
    return CpuRates(
        system.peak_tflops * 1e12 * system.compute_efficiency,
        system.cpu_transport_gbs,
        system.quant_ns_per_element * 1e-9,
        system.cpu_call_us * 1e-6,
        system.cpu_optimizer_ns_per_param * 1e-9,
    )


def system_fields(cpu: CpuRates) -> dict:
    """The system-block fields that state ``cpu`` (the inverse of :func:`cpu_rates`)."""
    return {
        "peak_tflops": cpu.flops / 1e12,
        "gemm_tflops": cpu.flops / 1e12,
        "compute_efficiency": 1.0,
        "cpu_transport_gbs": cpu.transport_gbs,
        "quant_ns_per_element": cpu.quant_s_per_element * 1e9,
        "cpu_call_us": cpu.call_s * 1e6,
        "cpu_optimizer_ns_per_param": cpu.optimizer_s_per_param * 1e9,
    }


def fit_record(cpu: CpuRates) -> dict:
    """``cpu`` as the benchmark's meta.json states it (``cpu_fit``; read back by :func:`from_fit_record`)."""
    return {
        "flops_per_rank": cpu.flops,
        "transport_gbs": cpu.transport_gbs,
        "quant_ns_per_element": cpu.quant_s_per_element * 1e9,
        "call_us": cpu.call_s * 1e6,
        "optimizer_ns_per_param": cpu.optimizer_s_per_param * 1e9,
    }


def from_fit_record(d: dict) -> CpuRates:
    """The constants of a ``fit_record`` (runs before the copy rate was fitted used ``EMULATED_TRANSPORT_GBS``)."""
    return CpuRates(
        d["flops_per_rank"],
        d.get("transport_gbs", EMULATED_TRANSPORT_GBS),
        d["quant_ns_per_element"] * 1e-9,
        d["call_us"] * 1e-6,
        d["optimizer_ns_per_param"] * 1e-9,
    )


def fit_cpu(
    shape: Shape,
    topo: Topology,
    micro_batch: int,
    rows: Sequence[tuple[Plan, int, float]],
    recompute: bool = False,
    transport_gbs: float = EMULATED_TRANSPORT_GBS,
) -> CpuRates:
    """The five CPU constants (FLOP/s, gloo's machine-wide copy rate, s per quantized element, s per
    collective ring step, s per optimizer-shard parameter) by least squares over measured unshaped
    steps ``(plan, micro-batches, seconds)``. A constant that comes out negative is dropped (set to
    zero; the copy rate then stays ``transport_gbs``) and the rest refitted, as is one no row incurs.
    Nothing is per strategy."""
    import numpy as np

    X, y = [], []
    for plan, k, t0 in rows:
        colls = plan_collectives(shape.params, plan, topo)
        X.append(
            [
                k * shape.microbatch_flops(micro_batch, recompute),
                quantized_per_step(shape.params, plan, topo, k),
                sum(occurrences(x, k) * call_steps(x, shape.units) for x in colls),
                shape.params / plan.optimizer_factor,
                transport_bytes(shape, plan, topo, k),
            ]
        )
        y.append(t0)
    X, y = np.array(X), np.array(y)
    keep = [i for i in range(5) if i == 0 or X[:, i].any()]  # a cost nothing incurs is not measurable
    while True:
        coef = np.zeros(5)
        fixed = 0.0 if 4 in keep else X[:, 4] / (transport_gbs * 1e9)  # bytes at the given rate
        scale = X[:, keep].max(axis=0)
        coef[keep] = np.linalg.lstsq(X[:, keep] / scale, y - fixed, rcond=None)[0] / scale
        neg = [i for i in keep if coef[i] <= 0 and i != 0]
        if not neg:
            break
        keep.remove(min(neg, key=lambda i: coef[i]))
    return CpuRates(
        float(1.0 / coef[0]),
        float(1e-9 / coef[4]) if 4 in keep else transport_gbs,
        float(coef[1]),
        float(coef[2]),
        float(coef[3]),
    )


EMULATED_OVERLAP = ("engine", "store_forward", "serial")


def estimate_emulated(
    shape: Shape,
    plan: Plan,
    topo: Topology,
    system: SystemConfig,
    micro_batch: int,
    grad_accum: int,
    cpu: CpuRates,
    recompute: bool = False,
    overlap: str = "engine",
    step_overlap: bool = True,
    stack_overhead: float = 0.0,
) -> dict:
    """Step time on the emulated cluster, never below all ranks' CPU work (the unshaped step).
    ``overlap="engine"``: ``compose_passes`` (the engine's rules) with all CPU work -- compute,
    quantization, gloo's transport -- as compute and the busiest shaped link of each pass as its
    communication; the combine's and post-step gather's own copying and calls run while their bytes
    are on the wire; "store_forward": each collective's transport added to its link time instead
    (the copy and the wire alternating); "serial": nothing overlaps (t0 + comm).
    ``stack_overhead``: CPU seconds another implementation of the same plan spends per second of
    ours, in series with everything (``fit_stack_overhead``; PyTorch FSDP2 in the benchmark)."""
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
    tr, sc = cs["transport"], cs["step_calls"]
    t0 = _unshaped(cs, grad_accum, k)
    step = t0 + sum(net[x] * k[x] for x in net)
    if overlap != "serial":
        # per-micro-batch collectives: their copying is CPU work of their pass; once-per-step ones:
        # their copying and calls run while their bytes are on the wire, in the pass they overlap
        sf = overlap == "store_forward"
        comm = {x: net[x] + (tr[x] if sf else 0.0) for x in net}
        ph = {p: sum(tr[c.name] for c in colls if c.phase == p and not sf) for p in ("forward", "backward")}
        own = {x: sc[x] + (0.0 if sf else tr[x]) for x in sc}
        fwd, bwd, ff, bl = compose_passes(
            colls,
            comm,
            cs["forward"] + ph["forward"],
            cs["backward"] + ph["backward"],
            shape.units,
            plan.prefetch,
            step_overlap,
            own_cpu=own,
            tail=combine_tail(plan, topo),
        )
        step = max(t0, (grad_accum - 1) * (fwd + bwd) + ff + bl + cs["step"])
    extra = stack_overhead * t0
    return {"preset": plan.preset, "step_s": step + extra, "unshaped_s": t0 + extra, "cpu_s": cs, "net_s": net}


def _unshaped(cs: dict, grad_accum: int, occ: dict) -> float:
    """All ranks' CPU work over one step from ``emulated_cpu_s`` and each collective's number of
    occurrences ``occ``: the step without any shaped link."""
    return (
        grad_accum * (cs["forward"] + cs["backward"])
        + cs["step"]
        + sum(cs["transport"][x] * occ[x] for x in cs["transport"])
        + sum(cs["step_calls"].values())
    )


def unshaped_step(
    shape: Shape, plan: Plan, topo: Topology, micro_batch: int, grad_accum: int, cpu: CpuRates, recompute: bool = False
) -> float:
    """The modelled unshaped step (all CPU work, no link time) of our engine."""
    cs = emulated_cpu_s(shape, plan, topo, micro_batch, recompute, cpu)
    occ = {c.name: occurrences(c, grad_accum) for c in plan_collectives(shape.params, plan, topo)}
    return _unshaped(cs, grad_accum, occ)


def fit_stack_overhead(
    shape: Shape,
    topo: Topology,
    micro_batch: int,
    rows: Sequence[tuple[Plan, int, float]],
    cpu: CpuRates,
    recompute: bool = False,
) -> float:
    """The one constant of another implementation of a plan (``estimate_emulated``'s
    ``stack_overhead``): least squares of its measured unshaped steps ``(plan, micro-batches,
    seconds)`` over our model's CPU time of the same plans, ``t = (1 + overhead) * t0``."""
    t0 = [unshaped_step(shape, plan, topo, micro_batch, k, cpu, recompute) for plan, k, _ in rows]
    den = sum(x * x for x in t0)
    return sum((t - x) * x for (_, _, t), x in zip(rows, t0)) / den if den else 0.0


def calibrate_cpu(
    shape: Shape,
    topo: Topology,
    micro_batch: int,
    grad_accum: int,
    t0_ddp: float,
    t0_quantized: Optional[dict] = None,
    recompute: bool = False,
    transport_gbs: float = EMULATED_TRANSPORT_GBS,
) -> CpuRates:
    """CPU constants from measured unshaped step times: FLOP/s from ddp's after its transport; the
    cost per quantized element by least squares over ``{preset: t0}`` after compute and transport."""

    def transport(plan):
        return transport_s(shape, plan, topo, grad_accum, transport_gbs)

    flops = grad_accum * shape.microbatch_flops(micro_batch, recompute)
    rate = flops / (t0_ddp - transport(preset_plan("ddp", topo)))
    num = den = 0.0
    for p, t0 in (t0_quantized or {}).items():
        plan = p if isinstance(p, Plan) else preset_plan(p, topo)
        e = quantized_per_step(shape.params, plan, topo, grad_accum)
        num, den = num + (t0 - flops / rate - transport(plan)) * e, den + e * e
    return CpuRates(rate, transport_gbs, num / den if den else 0.0)
