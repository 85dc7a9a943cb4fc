"""Step time: compute, exposed communication and the optimizer composed as the engine overlaps
them (docs/design.md §7.2), and predictions over presets and scales."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ...config import Config, SystemConfig
from ...topology import Topology
from ...zero_topo.sharding import Plan
from ...zero_topo.traffic import collectives_of
from .collectives import Collective, bytes_per_level, collective_time, plan_collectives
from .shape import GIB, OPTIMIZER_TRAFFIC_BYTES_PER_PARAM, Shape, model_state_memory, preset_plan, topology_for

STACKS = ("engine", "deepspeed")
REDUCTIONS_IN_FLIGHT = 2  # ZeroTopoEngine's max_in_flight default (checked in tests/test_perf_model.py)


def _phase(compute: float, gather: float, reduce: float, n: int, prefetch: bool) -> float:
    """One forward or backward pass over ``n`` units: prefetched gathers and asynchronous
    reductions run under compute, the first unit's gather and the last unit's reduction are not
    hidden; without prefetch the gathers are exposed."""
    if prefetch:
        return max(compute, gather + reduce) + (gather + reduce) / n
    return gather + max(compute, reduce) + reduce / n


def _pipeline(a: float, b: float, n: int, lag: float = 0.0) -> float:
    """Two stages over ``n`` equal units on different links, unit i of stage b starting once
    unit i + ``lag`` of stage a is done (``lag`` may be fractional: a time in units of a): b keeps
    up with a and finishes its last ``lag + 1`` units after a, or b is the bottleneck and starts
    ``lag + 1`` units of a late. ``lag=0`` is ``max(a, b) + min(a, b) / n``."""
    k = min(lag, n - 1) + 1
    return max(a + k * b / n, k * a / n + b)


def combine_lag(reduce_s: float) -> float:
    """Units of backward between a unit's reduction launch and its combine launch: the engine
    finishes a unit's reduction, and launches its combine, right after the reduction
    ``REDUCTIONS_IN_FLIGHT`` units later is launched -- a point fixed by program position, the same
    on every rank (docs/design.md §4.7) -- and at once without a reduction (ddp, zero1)."""
    return 0.0 if reduce_s <= 0.0 else float(REDUCTIONS_IN_FLIGHT)


def combine_tail(plan: Plan, topo: Topology) -> float:
    """Fraction of the combine's time after the last backward: a quantized combine whose optimizer
    shard is wider than the summed slice is two-stage (INT8 reduce-scatter, then an INT8
    all-gather of the sums) and the engine launches the second stage in ``step()``, every unit's
    before it waits for any: the all-gather half of the bytes (``traffic.Issued.deferred``)."""
    return next(
        (c.deferred for c in collectives_of(plan, topo.world_size, topo.ranks_per_node, 1.0) if c.name == "combine"),
        0.0,
    )


def compose_passes(
    colls: Sequence[Collective],
    times: dict,
    t_f: float,
    t_b: float,
    n: int,
    prefetch: bool,
    step_overlap: bool,
    serial: bool = False,
    own_cpu: Optional[dict] = None,
    tail: float = 0.0,
) -> tuple[float, float, float, float]:
    """Forward, backward, first forward and last backward of a step from the compute of one pass
    (``t_f``, ``t_b``) and each collective's time for the whole model (docs/design.md §7.2).
    ``serial``: nothing overlaps, every collective adds to its pass (``stack="deepspeed"``).
    ``own_cpu``: {"combine" | "post_step_all_gather": s} of processor work a once-per-step
    collective does itself while its bytes are on the wire (the emulated cluster's gloo copies and
    calls; nothing on a GPU, where DMA moves them): it runs in the pass the collective overlaps.
    ``tail``: the fraction of the combine that runs after the last backward (``combine_tail``)."""
    fwd_ag = sum(times.get(c.name, 0.0) for c in colls if c.phase == "forward")
    bwd_ag = times.get("backward_all_gather", 0.0)
    red = times.get("grad_reduce", 0.0) + times.get("grad_reduce_inter", 0.0)
    levels = {c.name: c.level for c in colls}
    fwd_lv = {levels[k] for k in ("forward_all_gather",) if k in levels}
    bwd_lv = {levels[k] for k in ("backward_all_gather", "grad_reduce", "grad_reduce_inter") if k in levels}
    comb, post = times.get("combine", 0.0), times.get("post_step_all_gather", 0.0)
    own_c, own_p = ((own_cpu or {}).get(x, 0.0) for x in ("combine", "post_step_all_gather"))
    if serial:
        fwd, bwd = t_f + fwd_ag, t_b + bwd_ag + red
    else:
        fwd, bwd = _phase(t_f, fwd_ag, 0.0, n, prefetch), _phase(t_b, bwd_ag, red, n, prefetch)
    if step_overlap and not serial:
        # the last backward launches each unit's combine REDUCTIONS_IN_FLIGHT units later (combine_lag);
        # the next step's first forward waits, unit by unit, for that unit's post-step gather
        # (docs/design.md §7.2); on the same level as that pass's traffic they share its link
        under = comb * (1.0 - tail)
        bwd_last = comb * tail + (
            _phase(t_b + own_c, bwd_ag, red + under, n, prefetch)
            if levels.get("combine") in bwd_lv
            else _pipeline(bwd + own_c, under, n, lag=combine_lag(red))
        )
        fwd_first = (
            _phase(t_f + own_p, fwd_ag + post, 0.0, n, prefetch)
            if levels.get("post_step_all_gather") in fwd_lv
            else _pipeline(post, fwd + own_p, n)
        )
    else:  # serial, or step_overlap=False: combine and post-step gather blocking in step()
        bwd_last, fwd_first = bwd + comb + own_c, fwd + post + own_p
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


def estimate_step(
    shape: Shape,
    plan: Plan,
    topo: Topology,
    system: SystemConfig,
    micro_batch: int,
    grad_accum: int,
    recompute: bool = True,
    nic_sharing: str = "ring",
    convention: str = "engine",
    step_overlap: bool = True,
    stack: str = "engine",
) -> StepEstimate:
    """Modelled time of one optimizer step (``grad_accum`` micro-batches) on every rank, in the
    steady state (the post-step gather of the previous step overlaps this step's first forward).
    ``step_overlap=False`` puts the combine and post-step gather inside ``step()``;
    ``stack="deepspeed"`` models the software the paper measured (docs/design.md §7.2)."""
    if stack not in STACKS:
        raise ValueError(f"stack '{stack}' is not valid; use one of {', '.join(STACKS)}")
    if stack == "deepspeed" and plan.secondary_degree and plan.measured_secondary_bits != plan.secondary_bits:
        plan = dataclasses.replace(plan, secondary_bits=plan.measured_secondary_bits)  # DeepSpeed's hpZ: fp16
    psi, n = shape.params, shape.units
    flops = shape.microbatch_flops(micro_batch, recompute)
    compute = flops / (system.peak_tflops * 1e12 * system.compute_efficiency)
    passes = 4.0 if recompute else 3.0
    t_f, t_b = compute / passes, compute * (passes - 1) / passes
    colls = plan_collectives(psi, plan, topo)
    times = {
        c.name: collective_time(c, topo, system, n, nic_sharing, separate_scales=stack == "deepspeed") for c in colls
    }
    fwd, bwd, fwd_first, bwd_last = compose_passes(
        colls,
        times,
        t_f,
        t_b,
        n,
        plan.prefetch,
        step_overlap,
        serial=stack == "deepspeed",
        tail=combine_tail(plan, topo),
    )
    comb, post = times.get("combine", 0.0), times.get("post_step_all_gather", 0.0)
    step_comm = comb + post
    exposed = fwd_first + bwd_last - fwd - bwd
    opt = OPTIMIZER_TRAFFIC_BYTES_PER_PARAM * psi / plan.optimizer_factor / (system.hbm_bw_gbs * 1e9)
    step = (grad_accum - 1) * (fwd + bwd) + fwd_first + bwd_last + opt
    return StepEstimate(
        preset=plan.preset,
        gcds=topo.world_size,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        compute_s=compute,
        forward_s=fwd,
        backward_s=bwd,
        first_forward_s=fwd_first,
        last_backward_s=bwd_last,
        step_comm_s=step_comm,
        step_comm_exposed_s=exposed,
        optimizer_s=opt,
        step_s=step,
        tflops_per_gcd=grad_accum * flops / step / 1e12,
        comm_s=times,
        bytes_per_level=bytes_per_level(psi, plan, topo, grad_accum),
        memory_gib=model_state_memory(psi, plan, convention).total / GIB,
    )


# ------------------------------------------------------------------------------ prediction
def predict(
    cfg: Config,
    presets: Sequence[str],
    gcds: Iterable[int],
    nic_sharing: str = "ring",
    system: Optional[SystemConfig] = None,
    step_overlap: bool = True,
    stack: str = "engine",
    **plan_overrides,
) -> list[StepEstimate]:
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
            out.append(
                estimate_step(
                    shape,
                    plan,
                    topo,
                    system,
                    t.train_micro_batch_size_per_gpu,
                    t.gradient_accumulation_steps,
                    cfg.model.checkpoint_activations,
                    nic_sharing,
                    step_overlap=step_overlap,
                    stack=stack,
                )
            )
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
