"""The collectives of one step and what each costs one rank (docs/design.md §4.8, §7.1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ...config import SystemConfig
from ...topology import LEVELS, Topology
from ...zero_topo.sharding import Plan
from ...zero_topo.traffic import transports_of
from ...zero_topo.volumes import ring_bytes, ring_steps

NIC_SHARING = ("ring", "rank")


@dataclass(frozen=True)
class Collective:
    # forward_all_gather | backward_all_gather | grad_reduce | grad_reduce_inter | combine | post_step_all_gather
    name: str
    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all
    phase: str  # forward | backward | step
    wire_bytes: float  # S: the whole buffer on the wire (the payload)
    group_size: int
    level: str
    ranks_per_node: int  # members of one group on one node
    groups_per_node: int  # groups with members on one node (all run at once)
    scale_bytes: float = 0.0  # the scales, packed with the payload (one launch); counted only where asked for
    quantized: bool = False  # block-quantized payload (DeepSpeed sends its scales in a second collective)
    partition: str = ""  # the UnitGroups partition of its groups (zero_topo.traffic.Issued.group)

    @property
    def per_micro_batch(self) -> bool:
        return self.phase != "step"

    @property
    def steps(self) -> int:
        return ring_steps(self.op, self.group_size)

    @property
    def bytes_sent(self) -> float:
        """Bytes one rank sends: payload and scales (``zero_topo.volumes.ring_bytes``)."""
        d = self.group_size
        return ring_bytes(self.op, self.wire_bytes, d) + ring_bytes(self.op, self.scale_bytes, d)


def _collective(name, op, phase, S, group, topo: Topology, scales=0.0, quantized=False, partition="") -> Collective:
    size, level, rpn = _group_info(group if isinstance(group, range) else tuple(group), topo)
    return Collective(
        name,
        op,
        phase,
        float(S),
        size,
        level,
        rpn,
        max(1, min(topo.ranks_per_node, topo.world_size) // rpn),
        scales,
        quantized,
        partition,
    )


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


def _rank0_group(partition: str, plan: Plan, topo: Topology) -> range:
    """Rank 0's group of a ``UnitGroups`` partition (``traffic.Issued.group``)."""
    W, P = topo.world_size, topo.ranks_per_node
    w, g, o = plan.factors
    return {
        "weight": lambda: _block0(w),
        "secondary": lambda: _block0(plan.secondary_degree),
        "grad": lambda: _block0(g),
        "node": lambda: _block0(P),
        "two_hop_peers": lambda: _two_hop0(g, P),
        "replicas": lambda: _replicas0(W, g),
        "post_gather": lambda: _post_gather0(w, o),
    }[partition]()


def unit_collectives(
    numel: float, plan: Plan, topo: Topology, elem_bytes: int = 2, scales: bool = False
) -> list[Collective]:
    """The collectives of one step for a unit of ``numel`` elements (docs/design.md §4.8), as the
    plan's transports declare them (``zero_topo.traffic``), on rank 0's groups (every rank's are
    alike). Payloads are ``elem_bytes`` per element at 16 bits, 1 or 1/2 at 8 or 4 bits; with
    ``scales`` each quantized collective also carries one fp32 scale per block. The backward
    all-gather is listed for every unit (the engine skips it for the last one)."""
    out: list[Collective] = []
    for t in transports_of(plan, topo.world_size, topo.ranks_per_node, numel):
        for c in t.collectives:
            n, group = c.elements, _rank0_group(c.group, plan, topo)
            if not c.quantized:
                out.append(_collective(c.name, c.op, t.phase, float(elem_bytes * n), group, topo, partition=c.group))
            else:  # payload and scales (one collective)
                out.append(
                    _collective(
                        c.name,
                        c.op,
                        t.phase,
                        n * c.bits / 8,
                        group,
                        topo,
                        4 * n / c.block if scales else 0.0,
                        quantized=True,
                        partition=c.group,
                    )
                )
    return out


def plan_collectives(psi: float, plan: Plan, topo: Topology) -> list[Collective]:
    """The collectives of one step of ``plan`` for the whole model as one unit of ``psi`` 16-bit
    parameters (scales left out: a few KB)."""
    return unit_collectives(psi, plan, topo)


def bytes_per_level(psi: float, plan: Plan, topo: Topology, micro_batches: int) -> dict:
    """Bytes one rank sends per step, by the widest level each collective's group spans."""
    out = {lv: 0.0 for lv in LEVELS}
    for c in plan_collectives(psi, plan, topo):
        out[c.level] += c.bytes_sent * (micro_batches if c.per_micro_batch else 1)
    return out


# ----------------------------------------------------------------------------------- time
def bandwidth(c: Collective, topo: Topology, system: SystemConfig, nic_sharing: str = "ring") -> float:
    """Bytes/s one rank of ``c`` gets (NIC sharing: docs/design.md §7.1)."""
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
    us = {
        "intra_gpu": system.latency_intra_gpu_us,
        "intra_node": system.latency_intra_node_us,
        "inter_node": system.latency_inter_node_us,
    }[c.level]
    return c.steps * us * 1e-6


def collective_time(
    c: Collective,
    topo: Topology,
    system: SystemConfig,
    n_units: int,
    nic_sharing: str = "ring",
    separate_scales: bool = False,
) -> float:
    """Seconds one rank spends in ``c`` for a whole model (all units): per unit one collective's
    ring steps at the level's latency (our engine packs a quantized collective's scales with its
    payload); with ``separate_scales`` (DeepSpeed, the paper's software) a quantized collective's
    scales go in a second one whose ring steps cost the small-message latency."""
    if c.group_size <= 1:
        return 0.0
    small = c.steps * system.latency_small_message_us * 1e-6 if separate_scales and c.quantized else 0.0
    return n_units * (latency(c, system) + small) + c.bytes_sent / bandwidth(c, topo, system, nic_sharing)
