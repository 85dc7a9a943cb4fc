"""Which transports a plan runs, and what each issues: the collectives of one unit's step, declared once.

A unit moves its state five times (docs/design.md §4.6): the forward gather, the backward gather
(``ShardedUnit.start_gather``), the gradient reduction, the cross-replica combine and the post-step
publish (the named functions of transports.py). For each, :func:`transports_of` decides which
transport the plan runs -- :func:`reduce_transport`, :func:`combine_transport` and
:func:`publish_transport` are the only places that decision is made -- and declares what it
issues for a unit of ``numel`` elements: its collectives (op, group, elements on the wire, bits)
and the elements it passes through the quantization kernels. The engine picks its functions by
these names (transports.select_*) and creates the groups they name; the volume formulas
(analysis/formulas.py), the performance model (analysis/perf_model) and the emulated cluster's
model (analysis/emulation/predict.py) read the declarations. Pure arithmetic: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan_space import UNQUANTIZED
from .sharding import Plan

# the moments of a unit's step, in order
MOMENTS = ("forward_gather", "backward_gather", "reduce", "combine", "publish")
PHASE = {
    "forward_gather": "forward",
    "backward_gather": "backward",
    "reduce": "backward",
    "combine": "step",
    "publish": "step",
}


@dataclass(frozen=True)
class Issued:
    """One collective a transport issues for a unit (rank 0's group of the partition ``group``)."""

    # its role: forward_all_gather | backward_all_gather | grad_reduce | grad_reduce_inter | combine |
    # post_step_all_gather
    name: str
    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all: as charged (zero_topo.volumes ring bytes, steps)
    group: str  # the UnitGroups partition: weight | secondary | grad | node | two_hop_peers | replicas | post_gather
    elements: float  # the whole buffer on the wire (S, in elements)
    bits: int  # 16: the compute (wire) dtype; 8 or 4: block-quantized, one fp32 scale per ``block`` elements
    block: int
    deferred: float = 0.0  # fraction issued from step(), after the last backward (a two-stage combine's all-gather)

    @property
    def quantized(self) -> bool:
        return self.bits < UNQUANTIZED


@dataclass(frozen=True)
class Transport:
    """What one moment of a unit's step runs: the transport's name, its collectives and the elements
    it passes through the quantization kernels per call (quantize + dequantize, as unit.py and
    transports.py call them)."""

    moment: str  # forward_gather | backward_gather | reduce | combine | publish
    name: str  # the function in transports.py (gathers: ShardedUnit.start_gather)
    collectives: tuple[Issued, ...] = ()
    quantized: float = 0.0

    @property
    def phase(self) -> str:
        return PHASE[self.moment]


# ------------------------------------------------------------------------------ decisions
def reduce_transport(plan: Plan, ranks_per_node: int) -> str:
    """The gradient reduction of every micro-batch (docs/design.md §4.6 step 3)."""
    if plan.grad_factor == 1:
        return "accumulate_local"
    if plan.grad_bits == UNQUANTIZED:
        return "reduce_scatter_16bit"
    if plan.grad_factor <= ranks_per_node:
        return "quantized_all_to_all_reduce"
    return "two_hop_reduce"


def combine_transport(plan: Plan, world_size: int) -> str:
    """The once-per-step cross-replica combine of the gradient shards (§4.6 step 4)."""
    if plan.grad_factor == world_size:  # one replica
        return "combine_local"
    if plan.combine_bits < UNQUANTIZED:
        return "combine_quantized"
    if plan.deterministic:
        return "combine_ordered_all_gather"
    if plan.inter_node_reduce == "reduce_scatter" and plan.optimizer_factor == world_size:
        return "combine_reduce_scatter"
    return "combine_all_reduce"


def publish_transport(plan: Plan) -> str:
    """The post-step all-gather of the updated optimizer shards into the primary shard (§4.6 step 6)."""
    if plan.optimizer_factor == plan.weight_factor:  # the post-gather group is one rank
        return "publish_local"
    if plan.publish_bits < UNQUANTIZED:
        return "publish_quantized"
    return "publish_all_gather"


# ------------------------------------------------------------------------------ declarations
def _gathers(plan: Plan, L: float) -> list[Transport]:
    """The forward gather over the weight group; the backward gather from the secondary copy when
    there is one, else over the weight group again (the engine skips it for the last unit). The
    forward gather quantizes the local shard and dequantizes the gathered unit, and makes the
    secondary (requantized only when its bits differ from the gather's); a gather from a
    quantized secondary only dequantizes."""
    w, s = plan.weight_factor, plan.secondary_degree
    if w == 1:
        return []
    qb, wb, sb = plan.quant_block_size, plan.weight_bits, plan.secondary_bits
    sec = sb < UNQUANTIZED
    fwd = Issued("forward_all_gather", "all_gather", "weight", L, wb, qb)
    if wb < UNQUANTIZED:
        fq = L / w + L + (L / s if s and sec and sb != wb else 0.0)
        bq = L if s and sec else (0.0 if s else L / w + L)
    elif s and sec:
        fq, bq = L / s, L
    else:
        fq = bq = 0.0
    back = (
        Issued("backward_all_gather", "all_gather", "secondary", L, sb, qb)
        if s
        else Issued("backward_all_gather", "all_gather", "weight", L, wb, qb)
    )
    bwd = Transport("backward_gather", "start_gather", (back,), bq)
    return [Transport("forward_gather", "start_gather", (fwd,), fq), bwd]


def _reduce(plan: Plan, L: float, P: int) -> Transport:
    """Quantized: every slice quantized, the received ones dequantized and summed; ZeRO++'s 2-hop
    requantizes 1/P of it between the hops."""
    name, b, gqb = reduce_transport(plan, P), plan.grad_bits, plan.grad_quant_block_size
    if name == "reduce_scatter_16bit":
        return Transport("reduce", name, (Issued("grad_reduce", "reduce_scatter", "grad", L, b, gqb),))
    if name == "quantized_all_to_all_reduce":
        return Transport("reduce", name, (Issued("grad_reduce", "all_to_all", "grad", L, b, gqb),), 2 * L + 0.0)
    if name == "two_hop_reduce":  # inside the node, then 1/P of it among the peers across nodes
        return Transport(
            "reduce",
            name,
            (
                Issued("grad_reduce", "all_to_all", "node", L, b, gqb),
                Issued("grad_reduce_inter", "all_to_all", "two_hop_peers", L / P, b, gqb),
            ),
            2 * L + 2 * L / P,
        )
    return Transport("reduce", name)


def _combine(plan: Plan, L: float, W: int) -> Transport:
    """``combine_quantized`` is issued as an INT8 all-to-all (the reduce-scatter with fp32 sums),
    followed, when the optimizer shard is wider than the summed slice (o < W), by an INT8
    all-gather of the sums; it is charged as the reduce-scatter (o = W) or the all-reduce (o < W)
    it computes: the same ring bytes and steps. It quantizes the shard (and dequantizes it again for
    the error-feedback residual) and sums the received pieces; with the all-gather it requantizes
    the slice and dequantizes the gathered shard. ``combine_ordered_all_gather`` (deterministic)
    is charged as the combine it replaces (§4.8's table leaves it out)."""
    name, g, o = combine_transport(plan, W), plan.grad_factor, plan.optimizer_factor
    gqb, G = plan.grad_quant_block_size, L / g
    if name == "combine_local":
        return Transport("combine", name)
    if name == "combine_quantized":
        cb = plan.combine_bits
        q = L / g * (3 if plan.error_feedback else 2) + (L / W + L / g if o < W else 0.0)
        if o == W:
            return Transport("combine", name, (Issued("combine", "reduce_scatter", "replicas", G, cb, gqb),), q)
        return Transport("combine", name, (Issued("combine", "all_reduce", "replicas", G, cb, gqb, deferred=0.5),), q)
    rs = plan.inter_node_reduce == "reduce_scatter" and o == W
    return Transport(
        "combine", name, (Issued("combine", "reduce_scatter" if rs else "all_reduce", "replicas", G, UNQUANTIZED, gqb),)
    )


def _publish(plan: Plan, L: float) -> Transport:
    """The INT8 publish quantizes the optimizer shard and dequantizes the gathered primary shard."""
    name, w, o = publish_transport(plan), plan.weight_factor, plan.optimizer_factor
    if name == "publish_local":
        return Transport("publish", name)
    c = Issued("post_step_all_gather", "all_gather", "post_gather", L / w, plan.publish_bits, plan.quant_block_size)
    return Transport("publish", name, (c,), L / o + L / w if name == "publish_quantized" else 0.0)


def transports_of(plan: Plan, world_size: int, ranks_per_node: int, numel: float) -> list[Transport]:
    """The transports one step of ``plan`` runs for a unit of ``numel`` elements, in step order
    (docs/design.md §4.8's collectives): the gathers when the weights are sharded (w > 1), then the
    reduction, the combine and the publish, whose local variants issue nothing."""
    out = _gathers(plan, numel)
    out.append(_reduce(plan, numel, ranks_per_node))
    out.append(_combine(plan, numel, world_size))
    out.append(_publish(plan, numel))
    return out


def collectives_of(plan: Plan, world_size: int, ranks_per_node: int, numel: float) -> list[Issued]:
    """Every collective of one step for a unit of ``numel`` elements, in step order."""
    return [c for t in transports_of(plan, world_size, ranks_per_node, numel) for c in t.collectives]


def reduce_groups(plan: Plan, ranks_per_node: int) -> tuple[str, ...]:
    """The ``UnitGroups`` fields the plan's gradient reduction sends over: the engine creates these
    reduce groups only (ZeRO++'s node and peer groups, or the gradient group), none it never uses."""
    t = _reduce(plan, 1.0, ranks_per_node)
    return tuple(dict.fromkeys(c.group for c in t.collectives))
