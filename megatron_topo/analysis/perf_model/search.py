"""Plan search: every legal plan on a topology, ranked by modelled step time."""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

from ...config import ConfigError, SystemConfig
from ...topology import Topology
from ...zero_topo.plan_space import (
    COMBINE_BITS,
    GRAD_BITS,
    INTER_NODE_REDUCES,
    PUBLISH_BITS,
    SECONDARY_BITS,
    UNQUANTIZED,
    WEIGHT_BITS,
)
from ...zero_topo.sharding import Plan, validate_plan
from .shape import GIB, Shape, model_state_memory
from .step import StepEstimate, estimate_step

# the quantized once-per-step variants searched: (combine_bits, publish_bits) = (8, 16), (16, 8), (8, 8)
ONCE_PER_STEP_BITS = tuple((cb, pb) for pb in PUBLISH_BITS for cb in COMBINE_BITS if (cb, pb) != (UNQUANTIZED,) * 2)


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
    facs = [
        f
        for f in range(1, W + 1)
        if W % f == 0
        and _legal(Plan("search", f, f, f), topo)
        and (f <= P or f == W or (f % P == 0 and (f // P) & (f // P - 1) == 0))
    ]
    out = []
    for w, g, o in ((w, g, o) for w in facs for g in facs for o in facs if g % w == 0 and o % g == 0):
        secs = [None] + ([f for f in facs if f <= w and w % f == 0] if w > 1 else [])
        reds = INTER_NODE_REDUCES if g < W and o == W else ("allreduce",)
        for s, wb in itertools.product(secs, WEIGHT_BITS if w > 1 else (UNQUANTIZED,)):  # same order as nested loops
            for sb, gb, red in itertools.product(
                SECONDARY_BITS if s else (UNQUANTIZED,), GRAD_BITS if g > 1 else (UNQUANTIZED,), reds
            ):
                p = Plan("search", w, g, o, s, wb, sb, gb, inter_node_reduce=red)
                if _legal(p, topo):
                    out.append(p)
                # quantized once-per-step traffic, searched with quantized gradients only (it
                # trades the same kind of accuracy; keeps the search size bounded)
                if gb < 16 and red == "allreduce" and (g < W or o > w):
                    for cb, pb in ONCE_PER_STEP_BITS:
                        if (cb < 16 and g == W) or (pb < 16 and o == w):
                            continue
                        p = Plan("search", w, g, o, s, wb, sb, gb, combine_bits=cb, publish_bits=pb)
                        if _legal(p, topo):
                            out.append(p)
    return out


def search_plans(
    shape: Shape,
    topo: Topology,
    system: SystemConfig,
    micro_batch: int,
    grad_accum: int,
    recompute: bool = True,
    memory_limit: Optional[float] = None,
    convention: str = "paper",
    nic_sharing: str = "ring",
    plans: Optional[Sequence[Plan]] = None,
    progress=lambda it: it,
) -> list[tuple[Plan, StepEstimate]]:
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
    out.sort(
        key=lambda pe: (
            math.floor(math.log(pe[1].step_s) / math.log(1.005)),
            pe[1].memory_gib,
            -(pe[0].weight_bits + pe[0].secondary_bits + pe[0].grad_bits),
        )
    )
    return out
