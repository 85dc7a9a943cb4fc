"""Sharding plans: the presets of docs/design.md §4.2 as sharding factors, validated against a topology.

A plan gives the number of ranks each model state is split over: ``weight_factor`` (primary fp16/
bf16 weight shards), ``grad_factor`` (fp32 gradient shards), ``optimizer_factor`` (fp32 master +
Adam moments), plus an optional secondary (hpZ) weight copy over ``secondary_degree`` ranks and
the bit widths used on the wire. Groups are blocks of consecutive ranks, so with node-major
ranks a factor of ``gcds_per_gpu`` is the GCD pair, ``ranks_per_node`` the node and the world
size the whole machine. The dependency rule (AMSP; ZeRO-topo §V) is ``w | g | os | world``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from ..config.deepspeed import ZeroOptimizationBlock
from ..config.options import ConfigError
from ..config.schema import AUTO_TRIAL_KEYS, ZeroTopoConfig
from ..topology import Topology
from .plan_space import (
    BITS,
    BLOCK_SIZE_RULE,
    GRAD_QUANT_BLOCK_SIZE,
    INTER_NODE_REDUCES,
    PRESETS,
    QUANT_BLOCK_SIZE,
    is_block_size,
    measured_secondary_bits,
    preset_table,
)


@dataclass(frozen=True)
class Plan:
    preset: str
    weight_factor: int
    grad_factor: int
    optimizer_factor: int
    secondary_degree: Optional[int] = None
    weight_bits: int = 16
    secondary_bits: int = 16
    grad_bits: int = 16
    combine_bits: int = 16  # once-per-step cross-replica combine (16: the compute dtype)
    publish_bits: int = 16  # post-step all-gather of the updated primary shards
    error_feedback: bool = False  # residuals of low-bit gradient quantization added to the next one
    quant_block_size: int = QUANT_BLOCK_SIZE
    grad_quant_block_size: int = GRAD_QUANT_BLOCK_SIZE
    inter_node_reduce: str = "allreduce"
    prefetch: bool = True
    deterministic: bool = False

    @property
    def factors(self) -> tuple[int, int, int]:
        return self.weight_factor, self.grad_factor, self.optimizer_factor

    @property
    def measured_secondary_bits(self) -> int:
        """Bits of the secondary copy in the software the papers measured (DeepSpeed's hpZ keeps
        ZeRO++'s in fp16; ``plan_space.MEASURED_SECONDARY_BITS``), else ``secondary_bits``."""
        bits = measured_secondary_bits(self.preset)
        return self.secondary_bits if bits is None else bits

    def describe(self) -> str:
        sec = f", secondary {self.secondary_degree} @ int{self.secondary_bits}" if self.secondary_degree else ""
        return (
            f"{self.preset}: weights/{self.weight_factor} (gather int{self.weight_bits}){sec}, "
            f"grads/{self.grad_factor} (reduce int{self.grad_bits}), optimizer/{self.optimizer_factor}, "
            f"cross-replica {self.inter_node_reduce}"
        )


def preset_factors(preset: str, topo: Topology) -> dict:
    """Factors and bits of a named preset on ``topo`` (before user overrides)."""
    W, P, G = topo.world_size, topo.ranks_per_node, topo.gcds_per_gpu
    table = preset_table(W, P, G)
    if preset == "auto":
        raise ConfigError(
            "zero_topo.preset 'auto' is chosen from the model and the machine: resolve it with "
            "megatron_topo.analysis.autoplan.resolve(cfg, topo)"
        )
    if preset not in table:
        raise ConfigError(f"zero_topo.preset '{preset}' is unknown; valid: {', '.join(PRESETS)}")
    return table[preset]


def deepspeed_preset(z: ZeroOptimizationBlock, topo: Topology) -> tuple[str, dict]:
    """Map DeepSpeed's ``zero_optimization`` block onto a preset plus overrides. Stage 0/1/2 are
    ddp/zero1/zero2; stage 3 is zero3, with ZeRO++'s qwZ (8-bit weight gather), qgZ (4-bit
    gradient reduce-scatter) and hpZ (secondary copy over ``zero_hpz_partition_size`` ranks):
    all three with hpZ = ranks per node is the ``zeropp`` preset; ``mics_shard_size`` is MiCS
    (every state sharded over the shard group, replicated across groups). Sizes that do not fit
    the topology are reported under DeepSpeed's key."""
    legal = _legal_factors(topo)
    legal_s = ", ".join(map(str, legal))
    if z.stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_optimization.stage {z.stage} is not valid; use 0, 1, 2 or 3")
    if z.stage < 3:
        for key in ("zero_quantized_weights", "zero_quantized_gradients"):
            if getattr(z, key):
                raise ConfigError(f"zero_optimization.{key} (ZeRO++) needs stage 3, got stage {z.stage}")
        if z.zero_hpz_partition_size > 1:
            raise ConfigError(
                f"zero_optimization.zero_hpz_partition_size (ZeRO++ hpZ) needs stage 3, got stage {z.stage}"
            )
        if z.mics_shard_size > 0:
            raise ConfigError(f"zero_optimization.mics_shard_size (MiCS) needs stage 3, got stage {z.stage}")
        return ("ddp", "zero1", "zero2")[z.stage], {}
    if z.mics_shard_size > 0:
        if z.mics_shard_size not in legal:
            raise ConfigError(
                f"zero_optimization.mics_shard_size={z.mics_shard_size} does not fit the topology "
                f"({topo.describe()}); legal values: {legal_s}"
            )
        if z.zero_hpz_partition_size > 1:
            raise ConfigError(
                "zero_optimization: mics_shard_size and zero_hpz_partition_size both set; MiCS already "
                "keeps the weights inside the shard group, keep one"
            )
        over = dict(weight_factor=z.mics_shard_size, grad_factor=z.mics_shard_size, optimizer_factor=z.mics_shard_size)
        if z.zero_quantized_weights:
            over["weight_bits"] = 8
        if z.zero_quantized_gradients:
            over["grad_bits"] = 4
        return "mics", over
    hpz = z.zero_hpz_partition_size
    if hpz > 1 and (hpz not in legal or hpz > topo.world_size):
        raise ConfigError(
            f"zero_optimization.zero_hpz_partition_size={hpz} does not fit the topology "
            f"({topo.describe()}); legal values: {legal_s}"
        )
    over: dict = {}
    if hpz > 1:
        over["secondary_degree"] = hpz
        over["secondary_bits"] = 8 if z.zero_quantized_weights else 16
    if z.zero_quantized_weights:
        over["weight_bits"] = 8
    if z.zero_quantized_gradients:
        over["grad_bits"] = 4
    quantized = z.zero_quantized_weights and z.zero_quantized_gradients
    if quantized and hpz == topo.ranks_per_node:
        return "zeropp", {}
    return "zero3", over


def resolved_zero_topo(plan: "Plan", topo: Topology, z: ZeroTopoConfig) -> ZeroTopoConfig:
    """The plan as a ``zero_topo`` block: its preset plus the factors/bits that differ from the
    preset's on ``topo`` (what the saved config.yml records instead of a ``zero_optimization`` block)."""
    from dataclasses import replace as _replace

    base = dict(secondary_degree=None, weight_bits=16, secondary_bits=16, grad_bits=16)
    base.update(preset_factors(plan.preset, topo))
    if base["secondary_degree"] is None:
        base["secondary_bits"] = 16
    out = {}
    for key in ("weight_factor", "grad_factor", "optimizer_factor", "secondary_degree", "weight_bits", "grad_bits"):
        val = getattr(plan, key)
        if val != base.get(key):
            out[key] = 0 if key == "secondary_degree" and val is None else val
    if plan.secondary_degree is not None and plan.secondary_bits != (out.get("weight_bits") or base["weight_bits"]):
        out["secondary_bits"] = plan.secondary_bits
    once = {k: getattr(plan, k) if getattr(plan, k) != 16 else getattr(z, k) for k in ("combine_bits", "publish_bits")}
    # preset auto's timing settings describe how the plan was chosen, not the plan: back to defaults
    trials = {k: getattr(ZeroTopoConfig(), k) for k in AUTO_TRIAL_KEYS}
    return _replace(
        z,
        preset=plan.preset,
        inter_node_reduce=plan.inter_node_reduce,
        **once,
        **trials,
        **{
            k: out.get(k)
            for k in (
                "weight_factor",
                "grad_factor",
                "optimizer_factor",
                "secondary_degree",
                "weight_bits",
                "secondary_bits",
                "grad_bits",
            )
        },
    )


def effective_config(cfg, plan: "Plan", topo: Topology):
    """A copy of ``cfg`` whose ``zero_topo`` block is the plan that runs (a ``zero_optimization``
    block resolved into it), for config.yml and checkpoints."""
    import copy

    out = copy.deepcopy(cfg)
    out.zero_topo = resolved_zero_topo(plan, topo, cfg.zero_topo)
    out.zero_optimization = None
    return out


@functools.lru_cache(maxsize=256)
def _legal_factors(topo: Topology) -> tuple[int, ...]:
    """Factors that make blocks of consecutive ranks aligned with the hierarchy (cached: the
    planner validates tens of thousands of plans on one topology)."""
    P, W, N = topo.ranks_per_node, topo.world_size, topo.num_nodes
    inside = [f for f in range(1, P + 1) if P % f == 0]
    across = [P * k for k in range(2, N + 1) if N % k == 0]
    return tuple(inside + [f for f in across if f <= W])


def resolve_plan(z: ZeroTopoConfig, topo: Topology, ds: Optional[ZeroOptimizationBlock] = None) -> Plan:
    """Preset + overrides -> validated Plan; raises ConfigError naming the offending factor."""
    preset = z.preset
    extra: dict = {}
    if ds is not None and z.preset == "ddp":
        preset, extra = deepspeed_preset(ds, topo)
    base = dict(secondary_degree=None, weight_bits=16, secondary_bits=16, grad_bits=16)
    base.update(preset_factors(preset, topo))
    base.update(extra)
    for key in (
        "weight_factor",
        "grad_factor",
        "optimizer_factor",
        "secondary_degree",
        "weight_bits",
        "secondary_bits",
        "grad_bits",
        "combine_bits",
        "publish_bits",
    ):
        val = getattr(z, key)
        if val is not None:
            base[key] = val if not (key == "secondary_degree" and val == 0) else None
    if base["secondary_degree"] is not None and z.secondary_bits is None and base["secondary_bits"] == 16:
        base["secondary_bits"] = base["weight_bits"]
    plan = Plan(
        preset=preset,
        quant_block_size=z.quant_block_size,
        grad_quant_block_size=z.grad_quant_block_size,
        inter_node_reduce=z.inter_node_reduce,
        prefetch=z.prefetch,
        deterministic=z.deterministic,
        error_feedback=z.error_feedback,
        **base,
    )
    validate_plan(plan, topo)
    return plan


def validate_plan(plan: Plan, topo: Topology) -> None:
    W = topo.world_size
    legal = _legal_factors(topo)
    legal_s = ", ".join(map(str, legal))
    for name in ("weight_factor", "grad_factor", "optimizer_factor"):
        f = getattr(plan, name)
        if f not in legal:
            raise ConfigError(
                f"zero_topo.{name}={f} does not fit the topology ({topo.describe()}); legal values: {legal_s}"
            )
    w, g, o = plan.factors
    if g % w:
        raise ConfigError(
            f"zero_topo.grad_factor={g} breaks the dependency rule: it must be a multiple of "
            f"weight_factor={w} (weights ⊆ gradients); legal: {', '.join(str(f) for f in legal if f % w == 0)}"
        )
    if o % g:
        raise ConfigError(
            f"zero_topo.optimizer_factor={o} breaks the dependency rule: it must be a multiple of "
            f"grad_factor={g} (gradients ⊆ optimizer states); legal: {', '.join(str(f) for f in legal if f % g == 0)}"
        )
    s = plan.secondary_degree
    if s is not None:
        if s not in legal:
            raise ConfigError(
                f"zero_topo.secondary_degree={s} does not fit the topology ({topo.describe()}); legal values: {legal_s}"
            )
    for name, allowed in BITS.items():
        if getattr(plan, name) not in allowed:
            raise ConfigError(
                f"zero_topo.{name}={getattr(plan, name)} is not valid; use one of {', '.join(map(str, allowed))}"
            )
    for name in ("quant_block_size", "grad_quant_block_size"):
        b = getattr(plan, name)
        if not is_block_size(b):
            raise ConfigError(f"zero_topo.{name}={b} is not valid; use {BLOCK_SIZE_RULE}")
    if plan.inter_node_reduce not in INTER_NODE_REDUCES:
        raise ConfigError(
            f"zero_topo.inter_node_reduce='{plan.inter_node_reduce}' is not valid; "
            f"use {' or '.join(INTER_NODE_REDUCES)}"
        )
    if plan.combine_bits < 16 and plan.deterministic:
        raise ConfigError(
            "zero_topo.combine_bits < 16 and deterministic: true exclude each other (the ordered "
            "combine sums exact values); set combine_bits: 16 or deterministic: false"
        )
    if plan.inter_node_reduce == "reduce_scatter" and g < W and o != W:
        raise ConfigError(
            f"zero_topo.inter_node_reduce=reduce_scatter needs optimizer_factor equal to the world size "
            f"{W} (got {o}); use allreduce"
        )
