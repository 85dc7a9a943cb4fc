"""Preflight: before a run allocates anything, check that one rank's memory will fit.

The estimate is ``zero_topo.memory.peak_estimate``: model states exactly as the engine allocates
them, plus activations of one micro-batch and the gathered units. When it exceeds the device
memory the run stops with one line naming both numbers and what would fit instead.
"""
from __future__ import annotations

from typing import Optional

import torch

from .config import Config, ConfigError
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


def estimate(cfg: Config, plan: Plan, world_size: int, numels: Optional[list[int]] = None) -> dict:
    from .model.spec import spec_for

    m = cfg.model
    mb = cfg.train.train_micro_batch_size_per_gpu
    return memory.peak_estimate(numels if numels is not None else unit_numels(m), plan, world_size, cfg.precision,
                                hidden=m.hidden_size, heads=m.num_attention_heads, layers=m.num_layers,
                                seq=m.seq_length, vocab=m.vocab_size, micro_batch=mb,
                                recompute=m.checkpoint_activations,
                                activations=spec_for(m).activation_bytes(m, mb, cfg.precision,
                                                                         m.checkpoint_activations))


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


def check(cfg: Config, plan: Plan, topo: Topology, device: torch.device) -> Optional[dict]:
    """Raise ConfigError (one line) when the estimate exceeds the device memory."""
    limit = device_memory_bytes(cfg, device)
    if limit is None:
        return None
    numels = unit_numels(cfg.model)
    est = estimate(cfg, plan, topo.world_size, numels)
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
    raise ConfigError(
        f"{_count(sum(numels))} parameters under {plan.preset} on {topo.world_size} ranks need "
        f"{est['model_states'] / GIB:.1f} GiB of model states per rank (+ {rest / GIB:.1f} GiB activations and "
        f"buffers), {limit / GIB:.1f} GiB available: {advice}")
