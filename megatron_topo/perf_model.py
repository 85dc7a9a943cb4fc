"""Analytic model of a sharding plan: model-state memory, bytes per link level, step time.

Pure functions over (model shape, ``Plan``, ``Topology``, ``SystemConfig``); presets are just
inputs (``preset_plan``). Every rate comes from the ``SystemConfig`` passed in, so the same model
runs on Frontier, a DGX, or an emulated cluster with arbitrary bandwidths and latencies.

Constants and where they come from (values live in configs/frontier.yml / configs/dgx_a100.yml):

======================  ==================  ===================================================
quantity                Frontier value      source
======================  ==================  ===================================================
peak fp16 per GCD       191.5 TFLOP/s       AMD MI250X spec (383 TF / 2 GCDs); seed 004 §5.2.2
measured GEMM per GCD   125 TFLOP/s         seed 004 §5.2.2 (rocBLAS bf16 32768^2 on one GCD)
compute_efficiency      0.40 of peak        seed 004 Table 5.2: AxoNN sustains 36-41% of the
                                            advertised peak on Frontier up to 8192 GCDs
GCD-GCD (same MI250X)   200 GB/s/direction  ZeRO-topo §IV; DESIGN §3
GPU-GPU (same node)     50 GB/s/direction   ZeRO-topo §IV/Table II (one IF link for cross
                                            pairs: the bottleneck hop of an 8-GCD ring)
NICs                    4 x 25 GB/s         ZeRO-topo Table II (4 x 200 Gb/s Slingshot-11);
                                            seed 004 §5.2.2; one NIC per MI250X (§6.2.1)
HBM per GCD             1600 GB/s           AMD MI250X spec (3.2 TB/s per package)
latency per ring step   2/5 us (gcd/node)   assumed order of magnitude
latency per ring step   85 us (inter)       derived from seed 004 §6.3.1 (PCCL's 6.2-11.4x speedups
                                            over RCCL's flat ring at 2048 GCDs, 512/1024 MB):
                                            83-100 us, median; a lower bound
                                            (perf_sources.derive_rccl_ring)
small-message step      5 us                quantization scales (a few KB): assumed order of
                                            magnitude of a low-latency-protocol ring step
Adam model states       2+2+12 B/param      ZeRO-topo §III (K = 12), DESIGN §4
optimizer traffic       30 B/param          fused AdamW: read grad 4 + master/m/v 12,
                                            write master/m/v 12 + 16-bit weight 2
======================  ==================  ===================================================

Nothing is fitted per strategy, and nothing to the ZeRO-topo figures: ``compute_efficiency``
is taken from seed 004, the inter-node step latency is derived from seed 004's collective
measurements, and the NIC-sharing rule and the DeepSpeed composition below are the ones that
reproduce ZeRO++'s published measurements (seed 003 Table 1; :mod:`megatron_topo.perf_sources`).

FLOPs (Narayanan et al. 2021, the formula GPT-NeoX logs): one forward pass of a micro-batch of
B sequences is ``F = 24*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))``; forward+backward is 3F and with
activation recompute 4F. TFLOPS/GCD is reported like GPT-NeoX: 4F (3F without recompute) per
micro-batch divided by the step time. Compute time = 4F / (peak * compute_efficiency).

Communication (DESIGN §4 "Volumes"): a rank sends ``S(d-1)/d`` per all-gather, reduce-scatter or
all-to-all and ``2S(d-1)/d`` per all-reduce, S the whole buffer in its wire dtype, M = 2*psi.
Time of one collective = ``n_units * steps * (alpha + (launches-1) * alpha_small) + bytes_sent / beta``:
the engine issues one collective per wrapped unit (layers + embedding + head), two when quantized
(the payload, and the scales: a tiny message whose ring steps cost ``latency_small_message_us``);
a ring has d-1 steps (2(d-1) for all-reduce), pairwise all-to-all d-1.

beta per rank: ``bw_intra_gpu`` or ``bw_intra_node`` for groups inside a GPU / node. Across nodes
the node's NICs are shared (seed 004 Eq. 5.7, ``beta_inter / min(G_node, concurrent)``):
  * ``nic_sharing="ring"`` (default): Eq. 5.7 for rings: only the concurrent groups' boundary hops
    cross the node, beta = NICs*bw / min(P, groups per node), capped by the intra-node hop when a
    group has several ranks on one node. A world-wide ring crosses each node boundary once, so
    its bytes leave the node once, not once per rank. This rule reproduces ZeRO++'s measured
    speedups over ZeRO-3 on 384 V100s (seed 003 Table 1) within -8..+17 % with the DeepSpeed
    composition; seed 004's 1 GB all-gather on 32 GCDs (RCCL 0.52x PCCL's time) implies 80-90 GB/s
    per GCD for RCCL's flat ring, not 12.5.
  * ``nic_sharing="rank"``: every rank of the node that sends across nodes at once shares them --
    all P ranks in every inter-node collective, beta = NICs*bw/P (12.5 GB/s on Frontier). The
    per-rank accounting of DESIGN §4's counters; on seed 003's cluster it predicts ZeRO-3 3.5-11x too
    slow and ZeRO++'s speedup 2.3-2.8x the measured one (``tools/perf_model.py --validate-zeropp``).

Overlap, as the engine does it (``compose_passes``; docs/frontier.md §4): gathers are prefetched and
gradient reductions run under compute (a pass = max(compute, comm) + the first gather / last
reduction, which nothing hides). Reductions finish oldest first with at most
``REDUCTIONS_IN_FLIGHT`` (the engine's ``max_in_flight``) pending, and each unit's cross-replica
combine starts during the **last** backward as soon as its reduction is finished, i.e. at most that
many units after the unit's own backward (``tests/test_engine_overlap.py`` asserts the order):
last backward = ``max(B + kC/n, kB/n + C)`` with k = in-flight + 1 (B a pass, C all combines, n
units). The optimizer waits for every combine. Each unit's post-step all-gather
runs in the background and is waited for at its next forward gather: first forward =
``max(F, A) + min(F, A)/n``. On the same level as that pass's traffic they share its link instead.
``prefetch=False`` exposes the gathers; ``step_overlap=False`` is the engine before 3af3320.

Stacks: ``stack="engine"`` (default) is megatron_topo's engine as above. ``stack="deepspeed"`` is
the software the ZeRO-topo paper measured (DeepSpeed 0.13.1, seed 000 Table IX): every collective
adds to compute (no overlap) -- the composition that reproduces DeepSpeed's ZeRO-3 and ZeRO++
timings of seed 003 Table 1 -- and ZeRO++'s hpZ secondary is fp16 (seed 000 Table V, seed 003
§3.2), where megatron_topo's zeropp preset keeps it in INT8. The paper comparison uses it.

The emulated cluster (gloo on one CPU) has its own model built on this one:
:mod:`megatron_topo.emulation.predict` (docs/frontier.md §4.1).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from .config import Config, ConfigError, ModelConfig, SystemConfig, TopologyConfig, ZeroTopoConfig
from .topology import LEVELS, Topology
from .zero_topo.plan import Plan, resolve_plan, validate_plan

GIB = 2 ** 30
ADAM_BYTES_PER_PARAM = 12  # fp32 master + two fp32 moments (ZeRO-topo §III, K = 12)
OPTIMIZER_TRAFFIC_BYTES_PER_PARAM = 30
NIC_SHARING = ("ring", "rank")
STACKS = ("engine", "deepspeed")

# The paper's numbers the model is compared with (ZeRO-topo abstract, §II-D, §VI, Fig. 7):
PAPER_20B_384 = {"topo/zeropp": 1.71, "topo/zero3": 2.40, "zeropp/zero3": 1.405}
PAPER_TOPO_SCALING_EFFICIENCY = 0.94  # 20B, TFLOPS/GCD at 384 GCDs over 8 GCDs
PAPER_MAX_PARAMS_16_GCDS = {"zero3": 68.7e9, "zeropp": 55e9}  # §II-A, model states only


# ----------------------------------------------------------------------------- model shape
@dataclass(frozen=True)
class Shape:
    num_layers: int
    hidden_size: int
    seq_length: int
    vocab_size: int
    no_weight_tying: bool = True

    @classmethod
    def from_config(cls, m: ModelConfig) -> "Shape":
        return cls(m.num_layers, m.hidden_size, m.seq_length, m.vocab_size, m.no_weight_tying)

    @property
    def params(self) -> int:
        """GPT-NeoX: per layer 12h^2 + 13h (QKV, dense, 4h MLP, biases, 2 LayerNorms);
        embedding V*h (+ an untied head V*h); final LayerNorm 2h; rotary has no parameters."""
        h, V = self.hidden_size, self.vocab_size
        emb = V * h * (2 if self.no_weight_tying else 1)
        return self.num_layers * (12 * h * h + 13 * h) + emb + 2 * h

    @property
    def units(self) -> int:
        """Wrapped units of the engine: every layer, the embedding, the head."""
        return self.num_layers + 2

    def forward_flops(self, micro_batch: int) -> float:
        B, s, l, h, V = micro_batch, self.seq_length, self.num_layers, self.hidden_size, self.vocab_size
        return 24.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))

    def microbatch_flops(self, micro_batch: int, recompute: bool) -> float:
        """FLOPs per micro-batch as GPT-NeoX counts them (4F with recompute, else 3F)."""
        return (4.0 if recompute else 3.0) * self.forward_flops(micro_batch)


# ---------------------------------------------------------------------------------- plans
def topology_for(gcds: int, tcfg: TopologyConfig) -> Topology:
    """The topology of ``gcds`` ranks laid out as in ``tcfg`` (a partial node if fewer)."""
    G = tcfg.gcds_per_gpu
    per_node = G * (tcfg.gpus_per_node or max(1, gcds // G))
    if gcds < per_node:
        return Topology(world_size=gcds, gcds_per_gpu=min(G, gcds), gpus_per_node=max(1, gcds // G))
    return Topology(world_size=gcds, gcds_per_gpu=G, gpus_per_node=per_node // G)


def preset_plan(preset: str, topo: Topology, **overrides) -> Plan:
    """A preset (plus zero_topo overrides) resolved and validated on ``topo``."""
    return resolve_plan(ZeroTopoConfig(preset=preset, **overrides), topo)


# --------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Memory:
    weights: float
    secondary: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.secondary + self.gradients + self.optimizer


def state_bytes_per_param(plan: Plan, convention: str = "paper") -> dict:
    """Bytes per parameter per device of each model state (multiply by psi).

    ``paper`` is DESIGN §4 / ZeRO-topo Tables V-VI: 16-bit gradient shards, ZeRO++ keeps its
    secondary in 16 bits (DeepSpeed hpZ), other secondaries at ``secondary_bits``. ``engine`` is
    what megatron_topo keeps: fp32 gradient shards, every secondary at ``secondary_bits``."""
    if convention not in ("paper", "engine"):
        raise ValueError(f"convention '{convention}' is not valid; use paper or engine")
    w, g, o = plan.factors
    s = plan.secondary_degree
    sec = 0.0
    if s and w > 1:
        bits = 16 if (convention == "paper" and plan.preset == "zeropp") else plan.secondary_bits
        sec = bits / 8 / s
    grad = (2.0 if convention == "paper" else 4.0) / g
    return {"weights": 2.0 / w, "secondary": sec, "gradients": grad, "optimizer": ADAM_BYTES_PER_PARAM / o}


def model_state_memory(psi: float, plan: Plan, convention: str = "paper") -> Memory:
    """Model-state bytes per device: weights 2psi/w (+ secondary), gradients, 12psi/o."""
    b = state_bytes_per_param(plan, convention)
    return Memory(*(psi * b[k] for k in ("weights", "secondary", "gradients", "optimizer")))


def max_params(memory_bytes: float, plan: Plan, convention: str = "paper") -> float:
    """The largest psi whose model states fit in ``memory_bytes`` per device."""
    return memory_bytes / sum(state_bytes_per_param(plan, convention).values())


# ---------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class Collective:
    name: str  # forward_all_gather | backward_all_gather | grad_reduce | grad_reduce_inter | combine | post_step_all_gather
    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all
    phase: str  # forward | backward | step
    wire_bytes: float  # S: the whole buffer on the wire
    group_size: int
    level: str
    ranks_per_node: int  # members of one group on one node
    groups_per_node: int  # groups with members on one node (all run at once)
    launches: int = 1  # collectives per unit (2 when quantized: payload + scales)

    @property
    def per_micro_batch(self) -> bool:
        return self.phase != "step"

    @property
    def steps(self) -> int:
        d = self.group_size
        return 2 * (d - 1) if self.op == "all_reduce" else d - 1

    @property
    def bytes_sent(self) -> float:
        """Bytes one rank sends (DESIGN §4)."""
        d = self.group_size
        f = 2.0 if self.op == "all_reduce" else 1.0
        return f * self.wire_bytes * (d - 1) / d


def _collective(name, op, phase, S, group, topo: Topology, launches=1) -> Collective:
    size, level, rpn = _group_info(group if isinstance(group, range) else tuple(group), topo)
    return Collective(name, op, phase, float(S), size, level, rpn,
                      max(1, min(topo.ranks_per_node, topo.world_size) // rpn), launches)


@functools.lru_cache(maxsize=1024)
def _group_info(group, topo: Topology) -> tuple[int, str, int]:
    """(size, link level, members on one node) of a group: the search meets the same few groups
    in thousands of plans, and a group can hold a whole machine's ranks."""
    P = topo.ranks_per_node
    per_node: dict[int, int] = {}
    for r in group:
        per_node[r // P] = per_node.get(r // P, 0) + 1
    return len(group), topo.level(group), max(per_node.values())


# Rank 0's group of each partition in zero_topo.layout (built directly: the planner evaluates
# thousands of plans; tests check them against the layout functions).
def _block0(f: int) -> range:
    return range(f)  # layout.blocks(W, f)[0]


def _replicas0(W: int, g: int) -> range:
    return range(0, W, g)  # layout.strided(W, g)[0]


def _post_gather0(w: int, o: int) -> range:
    return range(0, o, w)  # layout.post_gather_groups(W, w, o)[0]


def _two_hop0(g: int, P: int) -> range:
    return range(0, g, P)  # layout.two_hop_peer_groups(W, g, P)[0]


def plan_collectives(psi: float, plan: Plan, topo: Topology) -> list[Collective]:
    """The collectives of one step of ``plan`` (rank 0's groups; every rank's are alike)."""
    W, P = topo.world_size, topo.ranks_per_node
    w, g, o = plan.factors
    s = plan.secondary_degree
    M = 2.0 * psi
    out: list[Collective] = []
    q = lambda bits: 2 if bits < 16 else 1  # noqa: E731  (payload + scales)
    if w > 1:
        wb = plan.weight_bits
        out.append(_collective("forward_all_gather", "all_gather", "forward", M * wb / 16, _block0(w), topo, q(wb)))
        if s:
            sb = plan.secondary_bits
            out.append(_collective("backward_all_gather", "all_gather", "backward", M * sb / 16, _block0(s),
                                   topo, q(sb)))
        else:
            out.append(_collective("backward_all_gather", "all_gather", "backward", M * wb / 16, _block0(w),
                                   topo, q(wb)))
    if g > 1:
        b = plan.grad_bits
        if b == 16:
            out.append(_collective("grad_reduce", "reduce_scatter", "backward", M, _block0(g), topo))
        elif g <= P:
            out.append(_collective("grad_reduce", "all_to_all", "backward", M * b / 16, _block0(g), topo, 2))
        else:  # ZeRO++ 2-hop: inside the node, then 1/P of it among the peers across nodes
            out.append(_collective("grad_reduce", "all_to_all", "backward", M * b / 16, _block0(P), topo, 2))
            out.append(_collective("grad_reduce_inter", "all_to_all", "backward", M * b / 16 / P,
                                   _two_hop0(g, P), topo, 2))
    cb, pb = getattr(plan, "combine_bits", 16), getattr(plan, "publish_bits", 16)
    if g < W and cb < 16:  # INT8 all-to-all reduce-scatter (+ INT8 all-gather of the sums unless o = W)
        out.append(_collective("combine", "reduce_scatter" if o == W else "all_reduce", "step", M / g * cb / 16,
                               _replicas0(W, g), topo, 2))
    elif g < W:
        rs = plan.inter_node_reduce == "reduce_scatter" and o == W
        out.append(_collective("combine", "reduce_scatter" if rs else "all_reduce", "step", M / g,
                               _replicas0(W, g), topo))
    if o > w:
        out.append(_collective("post_step_all_gather", "all_gather", "step", M / w * pb / 16, _post_gather0(w, o),
                               topo, q(pb)))
    return out


def bytes_per_level(psi: float, plan: Plan, topo: Topology, micro_batches: int) -> dict:
    """Bytes one rank sends per step, by the widest level each collective's group spans."""
    out = {lv: 0.0 for lv in LEVELS}
    for c in plan_collectives(psi, plan, topo):
        out[c.level] += c.bytes_sent * (micro_batches if c.per_micro_batch else 1)
    return out


# ----------------------------------------------------------------------------------- time
def bandwidth(c: Collective, topo: Topology, system: SystemConfig, nic_sharing: str = "ring") -> float:
    """Bytes/s one rank of ``c`` gets (see the module docstring for the NIC sharing rule)."""
    if nic_sharing not in NIC_SHARING:
        raise ValueError(f"nic_sharing '{nic_sharing}' is not valid; use one of {', '.join(NIC_SHARING)}")
    if c.level == "intra_gpu":
        return system.bw_intra_gpu_gbs * 1e9
    if c.level == "intra_node":
        return system.bw_intra_node_gbs * 1e9
    node = system.nics_per_node * system.bw_inter_node_gbs * 1e9
    k = c.groups_per_node if nic_sharing == "ring" else c.ranks_per_node * c.groups_per_node
    bw = node / max(1, min(topo.ranks_per_node, k))
    if c.ranks_per_node > 1:  # the ring also runs over links inside the node
        local = system.bw_intra_gpu_gbs if c.ranks_per_node <= topo.gcds_per_gpu else system.bw_intra_node_gbs
        bw = min(bw, local * 1e9)
    return bw


def latency(c: Collective, system: SystemConfig) -> float:
    us = {"intra_gpu": system.latency_intra_gpu_us, "intra_node": system.latency_intra_node_us,
          "inter_node": system.latency_inter_node_us}[c.level]
    return c.steps * us * 1e-6


def collective_time(c: Collective, topo: Topology, system: SystemConfig, n_units: int,
                    nic_sharing: str = "ring") -> float:
    """Seconds one rank spends in ``c`` for a whole model (all units): per unit the payload's ring
    steps at the level's latency, the scales' (``launches - 1``) at the small-message latency."""
    if c.group_size <= 1:
        return 0.0
    small = (c.launches - 1) * c.steps * system.latency_small_message_us * 1e-6
    return n_units * (latency(c, system) + small) + c.bytes_sent / bandwidth(c, topo, system, nic_sharing)


REDUCTIONS_IN_FLIGHT = 2  # ZeroTopoEngine's max_in_flight default (checked in tests/test_perf_model.py)


def _phase(compute: float, gather: float, reduce: float, n: int, prefetch: bool) -> float:
    """One forward or backward pass over ``n`` units: prefetched gathers and asynchronous
    reductions run under compute, the first unit's gather and the last unit's reduction are not
    hidden; without prefetch the gathers are exposed."""
    if prefetch:
        return max(compute, gather + reduce) + (gather + reduce) / n
    return gather + max(compute, reduce) + reduce / n


def _pipeline(a: float, b: float, n: int, lag: int = 0) -> float:
    """Two stages over ``n`` equal units on different links, unit i of stage b starting once
    unit i + ``lag`` of stage a is done: b keeps up with a and finishes its last ``lag + 1``
    units after a, or b is the bottleneck and starts ``lag + 1`` units of a late. ``lag=0`` is
    ``max(a, b) + min(a, b) / n``."""
    k = min(lag, n - 1) + 1
    return max(a + k * b / n, k * a / n + b)


def compose_passes(colls: Sequence[Collective], times: dict, t_f: float, t_b: float, n: int, prefetch: bool,
                   step_overlap: bool, serial: bool = False) -> tuple[float, float, float, float]:
    """Forward, backward, first forward and last backward of a step from the compute of one pass
    (``t_f``, ``t_b``) and each collective's time for the whole model (module docstring).
    ``serial``: nothing overlaps, every collective adds to its pass (``stack="deepspeed"``)."""
    fwd_ag = sum(times.get(c.name, 0.0) for c in colls if c.phase == "forward")
    bwd_ag = times.get("backward_all_gather", 0.0)
    red = times.get("grad_reduce", 0.0) + times.get("grad_reduce_inter", 0.0)
    levels = {c.name: c.level for c in colls}
    fwd_lv = {levels[k] for k in ("forward_all_gather",) if k in levels}
    bwd_lv = {levels[k] for k in ("backward_all_gather", "grad_reduce", "grad_reduce_inter") if k in levels}
    comb, post = times.get("combine", 0.0), times.get("post_step_all_gather", 0.0)
    if serial:
        fwd, bwd = t_f + fwd_ag, t_b + bwd_ag + red
    else:
        fwd, bwd = _phase(t_f, fwd_ag, 0.0, n, prefetch), _phase(t_b, bwd_ag, red, n, prefetch)
    if step_overlap and not serial:
        # the last backward launches each unit's combine once its reduction lands; the next step's
        # first forward waits, unit by unit, for that unit's post-step gather (module docstring)
        # (on the same level as that pass's traffic they share its link)
        # (the engine finishes reductions oldest first with at most REDUCTIONS_IN_FLIGHT pending,
        # so a unit's combine starts at the latest that many units of backward after its own)
        bwd_last = (_phase(t_b, bwd_ag, red + comb, n, prefetch) if levels.get("combine") in bwd_lv
                    else _pipeline(bwd, comb, n, lag=REDUCTIONS_IN_FLIGHT))
        fwd_first = (_phase(t_f, fwd_ag + post, 0.0, n, prefetch) if levels.get("post_step_all_gather") in fwd_lv
                     else _pipeline(post, fwd, n))
    else:  # serial, or the engine before commit 3af3320: combine and post-step gather blocking in step()
        bwd_last, fwd_first = bwd + comb, fwd + post
    return fwd, bwd, fwd_first, bwd_last


@dataclass
class StepEstimate:
    preset: str
    gcds: int
    micro_batch: int
    grad_accum: int
    compute_s: float  # per micro-batch
    forward_s: float  # per micro-batch, with exposed communication
    backward_s: float
    first_forward_s: float  # the step's first forward: waits for the post-step gathers
    last_backward_s: float  # the step's last backward: launches the cross-replica combines
    step_comm_s: float  # combine + post-step gather, once per step (not all of it exposed)
    step_comm_exposed_s: float  # what they add to the step over two plain micro-batch phases
    optimizer_s: float
    step_s: float
    tflops_per_gcd: float
    comm_s: dict = field(default_factory=dict)  # per collective, per occurrence
    bytes_per_level: dict = field(default_factory=dict)  # per rank per step
    memory_gib: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def estimate_step(shape: Shape, plan: Plan, topo: Topology, system: SystemConfig, micro_batch: int,
                  grad_accum: int, recompute: bool = True, nic_sharing: str = "ring",
                  convention: str = "engine", step_overlap: bool = True, stack: str = "engine") -> StepEstimate:
    """Modelled time of one optimizer step (``grad_accum`` micro-batches) on every rank, in the
    steady state (the post-step gather of the previous step overlaps this step's first forward).
    ``step_overlap=False`` models the engine before commit 3af3320 (combine and post-step gather
    blocking in ``step()``); ``stack="deepspeed"`` the software the paper measured (module docstring)."""
    if stack not in STACKS:
        raise ValueError(f"stack '{stack}' is not valid; use one of {', '.join(STACKS)}")
    if stack == "deepspeed" and plan.preset == "zeropp" and plan.secondary_degree:
        plan = dataclasses.replace(plan, secondary_bits=16)  # DeepSpeed's hpZ keeps the secondary in fp16
    psi, n = shape.params, shape.units
    flops = shape.microbatch_flops(micro_batch, recompute)
    compute = flops / (system.peak_tflops * 1e12 * system.compute_efficiency)
    passes = 4.0 if recompute else 3.0
    t_f, t_b = compute / passes, compute * (passes - 1) / passes
    colls = plan_collectives(psi, plan, topo)
    times = {c.name: collective_time(c, topo, system, n, nic_sharing) for c in colls}
    fwd, bwd, fwd_first, bwd_last = compose_passes(colls, times, t_f, t_b, n, plan.prefetch, step_overlap,
                                                   serial=stack == "deepspeed")
    comb, post = times.get("combine", 0.0), times.get("post_step_all_gather", 0.0)
    step_comm = comb + post
    exposed = fwd_first + bwd_last - fwd - bwd
    opt = OPTIMIZER_TRAFFIC_BYTES_PER_PARAM * psi / plan.optimizer_factor / (system.hbm_bw_gbs * 1e9)
    step = (grad_accum - 1) * (fwd + bwd) + fwd_first + bwd_last + opt
    return StepEstimate(
        preset=plan.preset, gcds=topo.world_size, micro_batch=micro_batch, grad_accum=grad_accum,
        compute_s=compute, forward_s=fwd, backward_s=bwd, first_forward_s=fwd_first, last_backward_s=bwd_last,
        step_comm_s=step_comm, step_comm_exposed_s=exposed, optimizer_s=opt,
        step_s=step, tflops_per_gcd=grad_accum * flops / step / 1e12, comm_s=times,
        bytes_per_level=bytes_per_level(psi, plan, topo, grad_accum),
        memory_gib=model_state_memory(psi, plan, convention).total / GIB,
    )


# ------------------------------------------------------------------------------ prediction
def predict(cfg: Config, presets: Sequence[str], gcds: Iterable[int], nic_sharing: str = "ring",
            system: Optional[SystemConfig] = None, step_overlap: bool = True, stack: str = "engine",
            **plan_overrides) -> list[StepEstimate]:
    """Estimates for every preset at every GCD count, with the model/training setup of ``cfg``;
    ``plan_overrides`` maps a preset to zero_topo overrides, e.g. ``topo={"secondary_degree": 8}``."""
    system = system or cfg.system
    if system is None:
        raise ValueError("no system: pass a system YAML (configs/frontier.yml) or a SystemConfig")
    shape = Shape.from_config(cfg.model)
    t = cfg.train
    out = []
    for n in gcds:
        topo = topology_for(n, cfg.topology)
        for p in presets:
            plan = preset_plan(p, topo, **plan_overrides.get(p, {}))
            out.append(estimate_step(shape, plan, topo, system, t.train_micro_batch_size_per_gpu,
                                     t.gradient_accumulation_steps, cfg.model.checkpoint_activations,
                                     nic_sharing, step_overlap=step_overlap, stack=stack))
    return out


def ratios(estimates: Sequence[StepEstimate], gcds: int) -> dict:
    """TFLOPS/GCD ratios between zero3, zeropp and topo at ``gcds``."""
    t = {e.preset: e.tflops_per_gcd for e in estimates if e.gcds == gcds}
    pairs = (("topo", "zeropp"), ("topo", "zero3"), ("zeropp", "zero3"))
    return {f"{a}/{b}": t[a] / t[b] for a, b in pairs if a in t and b in t}


def scaling_efficiency(estimates: Sequence[StepEstimate], preset: str, small: int, large: int) -> float:
    """Weak-scaling efficiency: TFLOPS/GCD at ``large`` over TFLOPS/GCD at ``small``."""
    t = {e.gcds: e.tflops_per_gcd for e in estimates if e.preset == preset}
    return t[large] / t[small]


# ------------------------------------------------------------------------------ plan search
def _legal(plan: Plan, topo: Topology) -> bool:
    try:
        validate_plan(plan, topo)
        return True
    except ConfigError:
        return False


def legal_plans(topo: Topology) -> list[Plan]:
    """The plans searched on ``topo`` (each one ``validate_plan`` accepts): factors w | g | o from
    the node's divisors, power-of-two numbers of whole nodes and the world, a secondary degree
    dividing w (or none), weight/secondary bits 16 or 8, gradient bits 16, 8 or 4, and both
    cross-replica reductions where legal."""
    W, P = topo.world_size, topo.ranks_per_node
    # factors inside a node, the whole world, and whole-node groups of a power of two nodes: a
    # log-spaced set (the divisors of a node count such as Frontier's 9,408 would be 42, and the
    # search over factor triples with every secondary and bit width would run for many minutes)
    facs = [f for f in range(1, W + 1) if W % f == 0 and _legal(Plan("search", f, f, f), topo)
            and (f <= P or f == W or (f % P == 0 and (f // P) & (f // P - 1) == 0))]
    out = []
    for w, g, o in ((w, g, o) for w in facs for g in facs for o in facs if g % w == 0 and o % g == 0):
        secs = [None] + ([f for f in facs if f <= w and w % f == 0] if w > 1 else [])
        reds = ("allreduce", "reduce_scatter") if g < W and o == W else ("allreduce",)
        for s, wb in itertools.product(secs, (16, 8) if w > 1 else (16,)):  # same order as nested loops
            for sb, gb, red in itertools.product((16, 8) if s else (16,), (16, 8, 4) if g > 1 else (16,), reds):
                p = Plan("search", w, g, o, s, wb, sb, gb, inter_node_reduce=red)
                if _legal(p, topo):
                    out.append(p)
                # quantized once-per-step traffic, searched with quantized gradients only (it
                # trades the same kind of accuracy; keeps the search size bounded)
                if gb < 16 and red == "allreduce" and (g < W or o > w):
                    for cb, pb in ((8, 16), (16, 8), (8, 8)):
                        if (cb < 16 and g == W) or (pb < 16 and o == w):
                            continue
                        p = Plan("search", w, g, o, s, wb, sb, gb, combine_bits=cb, publish_bits=pb)
                        if _legal(p, topo):
                            out.append(p)
    return out


def search_plans(shape: Shape, topo: Topology, system: SystemConfig, micro_batch: int, grad_accum: int,
                 recompute: bool = True, memory_limit: Optional[float] = None, convention: str = "paper",
                 nic_sharing: str = "ring", plans: Optional[Sequence[Plan]] = None,
                 progress=lambda it: it) -> list[tuple[Plan, StepEstimate]]:
    """Legal plans whose model states fit ``memory_limit`` bytes (default: the device memory),
    fastest modelled step first (steps within 0.5% of each other count as equally fast).
    ``progress`` wraps the loop over plans (e.g. a tqdm bar)."""
    limit = system.device_memory_gib * GIB if memory_limit is None else memory_limit
    out = []
    for plan in progress(legal_plans(topo) if plans is None else plans):
        if model_state_memory(shape.params, plan, convention).total > limit:
            continue
        est = estimate_step(shape, plan, topo, system, micro_batch, grad_accum, recompute, nic_sharing, convention)
        out.append((plan, est))
    # times in the same 0.5% bucket tie: less memory first, then fewer quantized states (accuracy)
    out.sort(key=lambda pe: (math.floor(math.log(pe[1].step_s) / math.log(1.005)), pe[1].memory_gib,
                             -(pe[0].weight_bits + pe[0].secondary_bits + pe[0].grad_bits)))
    return out
