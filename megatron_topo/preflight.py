"""Preflight: before a run allocates anything, check that one rank's memory will fit.

The estimate is ``zero_topo.memory.peak_estimate``: model states exactly as the engine allocates
them, plus activations of one micro-batch and the gathered units. When it exceeds the device
memory the run stops with one line naming both numbers and what would fit instead.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .config.options import ConfigError
from .config.schema import Config
from .model import unit_numels
from .topology import Topology
from .zero_topo import memory
from .zero_topo.sharding import PRESETS, Plan, resolve_plan

GIB = memory.GIB


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def device_memory_bytes(cfg: Config, device: torch.device) -> Optional[int]:
    """The ``system`` block's device memory, else the GPU's own; None on a CPU without one."""
    if cfg.system is not None:
        return int(cfg.system.device_memory_gib * GIB)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return None


DEFAULT_RESERVE_FRACTION = 0.08  # of the device memory, for a system block that states no reserve


def reserve_bytes(cfg: Config, limit: int) -> int:
    """Memory kept free on a device of ``limit`` bytes: ``system.memory_reserve_gib``, else 8 % of
    the device (the GPU context, NCCL/RCCL buffers and allocator fragmentation, which no tensor of
    the engine counts; docs/frontier.md "Memory margin")."""
    r = cfg.system.memory_reserve_gib if cfg.system is not None else None
    if r is None:
        return int(DEFAULT_RESERVE_FRACTION * limit)
    if r * GIB >= limit:
        raise ConfigError(
            f"system.memory_reserve_gib {r:g} leaves nothing of the {limit / GIB:g} GiB per device; "
            f"valid: 0 <= memory_reserve_gib < device_memory_gib"
        )
    return int(r * GIB)


def _reserve_source(cfg: Config) -> str:
    if cfg.system is not None and cfg.system.memory_reserve_gib is not None:
        return "system.memory_reserve_gib"
    return f"default {DEFAULT_RESERVE_FRACTION:.0%} of the device; set system.memory_reserve_gib"


def estimate(cfg: Config, plan: Plan, world_size: int, numels: Optional[list[int]] = None) -> dict:
    from .model.spec import spec_for

    m = cfg.model
    mb = cfg.train.train_micro_batch_size_per_gpu
    return memory.peak_estimate(
        numels if numels is not None else unit_numels(m),
        plan,
        world_size,
        cfg.precision,
        hidden=m.hidden_size,
        heads=m.num_attention_heads,
        layers=m.num_layers,
        seq=m.seq_length,
        vocab=m.vocab_size,
        micro_batch=mb,
        recompute=m.checkpoint_activations,
        ranks_per_node=ranks_per_node(cfg, world_size),
        activations=spec_for(m).activation_bytes(m, mb, cfg.precision, m.checkpoint_activations),
        max_combines=cfg.zero_topo.max_combines_in_flight,
    )


def ranks_per_node(cfg: Config, world_size: int) -> int:
    """Ranks per node of the ``topology:`` block (the whole world when it names no node size)."""
    t = cfg.topology
    return min(world_size, t.gcds_per_gpu * t.gpus_per_node) if t.gpus_per_node else world_size


def _fits(cfg: Config, plan: Plan, world: int, limit: int, numels: list[int]) -> bool:
    return estimate(cfg, plan, world, numels)["total"] <= limit


def alternatives(cfg: Config, topo: Topology, limit: int, numels: list[int]) -> tuple[Optional[int], list[str]]:
    """The smallest world (whole nodes, up to 4096 nodes) on which this config's plan fits, and
    the presets that fit on this world."""
    smallest = None
    for nodes in range(topo.num_nodes + 1, 4097):
        t = Topology(nodes * topo.ranks_per_node, topo.gcds_per_gpu, topo.gpus_per_node)
        try:
            p = resolve_plan(cfg.zero_topo, t, cfg.zero_optimization)
        except ConfigError:
            continue
        if _fits(cfg, p, t.world_size, limit, numels):
            smallest = t.world_size
            break
    presets = []
    for name in PRESETS:
        try:
            p = resolve_plan(type(cfg.zero_topo)(**{**vars(cfg.zero_topo), "preset": name}), topo)
        except ConfigError:
            continue
        if _fits(cfg, p, topo.world_size, limit, numels):
            presets.append(name)
    return smallest, presets


def ranks_on_this_host() -> int:
    """Ranks sharing this host's memory (the launcher's LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE)."""
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        v = os.environ.get(var, "").split("(")[0].split(",")[0]
        if v.isascii() and v.isdigit() and int(v) > 0:  # '²' is a digit to isdigit, not to int()
            return int(v)
    return 1


def check_host(cfg: Config, plan: Plan, topo: Topology) -> dict:
    """On a CPU without a ``system:`` block: the estimate (model states + activations and
    buffers) against this rank's share of the host's available memory (MemAvailable divided
    among the ranks on this host), one line when it does not fit; the data index build is checked
    against what is left when the data is built (data/gpt_dataset.check_index_size)."""
    from .data.gpt_dataset import available_memory_bytes

    numels = unit_numels(cfg.model)
    est = estimate(cfg, plan, topo.world_size, numels)
    ranks = ranks_on_this_host()
    have = available_memory_bytes() // ranks
    est["reserve"], est["device"] = 0, have
    if est["total"] > have:
        rest = est["total"] - est["model_states"]
        share = f" (MemAvailable / {ranks} ranks on this host)" if ranks > 1 else " (MemAvailable)"
        raise ConfigError(
            f"{_count(sum(numels))} parameters under {plan.preset} on {topo.world_size} ranks need "
            f"{est['model_states'] / GIB:,.1f} GiB of model states per rank + {rest / GIB:,.1f} GiB activations and "
            f"buffers (seq_length {cfg.model.seq_length:,}, micro-batch {cfg.train.train_micro_batch_size_per_gpu}), "
            f"{have / GIB:,.1f} GiB of host memory available per rank{share}: lower seq_length or "
            f"train_micro_batch_size_per_gpu, or shard more"
        )
    return est


def check(cfg: Config, plan: Plan, topo: Topology, device: torch.device) -> Optional[dict]:
    """Raise ConfigError (one line) when the estimate plus the reserve exceeds the device memory
    (on a CPU without a ``system:`` block: the host's available memory, :func:`check_host`)."""
    device_limit = device_memory_bytes(cfg, device)
    if device_limit is None:
        return check_host(cfg, plan, topo) if device.type == "cpu" else None
    reserve = reserve_bytes(cfg, device_limit)
    limit = device_limit - reserve
    numels = unit_numels(cfg.model)
    est = estimate(cfg, plan, topo.world_size, numels)
    est["reserve"], est["device"] = reserve, device_limit
    if est["total"] <= limit:
        return est
    smallest, presets = alternatives(cfg, topo, limit, numels)
    ways = []
    if smallest is not None:
        ways.append(f">= {smallest} ranks")
    if presets:
        ways.append("preset " + " or ".join(presets[:3]))
    advice = ("use " + " or ".join(ways)) if ways else "no plan fits this model within 4096 nodes; use a smaller model"
    rest = est["total"] - est["model_states"]
    why = " (it fits the device only without the reserve)" if est["total"] <= device_limit else ""
    raise ConfigError(
        f"{_count(sum(numels))} parameters under {plan.preset} on {topo.world_size} ranks need "
        f"{est['model_states'] / GIB:.1f} GiB of model states per rank (+ {rest / GIB:.1f} GiB activations and "
        f"buffers) + {reserve / GIB:.1f} GiB reserve for context, communicators and fragmentation "
        f"({_reserve_source(cfg)}), {device_limit / GIB:.1f} GiB available{why}: {advice}"
    )
