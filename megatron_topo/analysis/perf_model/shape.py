"""Model shape, plans on a GCD count, and model-state memory per device (docs/design.md §4.10)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...config import ModelConfig, TopologyConfig, ZeroTopoConfig
from ...model.gpt_neox import gpt_flops
from ...topology import Topology
from ...zero_topo.sharding import Plan, resolve_plan

GIB = 2**30
ADAM_BYTES_PER_PARAM = 12  # fp32 master + two fp32 moments (ZeRO-topo §III, K = 12)
OPTIMIZER_TRAFFIC_BYTES_PER_PARAM = 30

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
    # the model config this shape was taken from: its spec counts parameters and FLOPs (None: a
    # GPT-NeoX shape given by its numbers alone, e.g. a paper's)
    model: Optional[ModelConfig] = field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def from_config(cls, m: ModelConfig) -> "Shape":
        return cls(m.num_layers, m.hidden_size, m.seq_length, m.vocab_size, m.no_weight_tying, model=m)

    @property
    def params(self) -> int:
        """The model spec's exact count (GPT-NeoX: per layer 12h^2 + 13h (QKV, dense, 4h MLP,
        biases, 2 LayerNorms); embedding V*h (+ an untied head V*h); final LayerNorm 2h)."""
        if self.model is not None:
            from ...model.spec import spec_for

            return spec_for(self.model).param_count(self.model)
        h, V = self.hidden_size, self.vocab_size
        emb = V * h * (2 if self.no_weight_tying else 1)
        return self.num_layers * (12 * h * h + 13 * h) + emb + 2 * h

    @property
    def units(self) -> int:
        """Wrapped units of the engine: every layer, the embedding, the head."""
        return self.num_layers + 2

    def forward_flops(self, micro_batch: int) -> float:
        """One forward pass of a micro-batch (the spec's count; GPT-NeoX: ``model.gpt_neox.gpt_flops``, the
        formula GPT-NeoX logs)."""
        if self.model is not None:
            from ...model.spec import spec_for

            return spec_for(self.model).forward_flops(self.model, micro_batch, self.seq_length)
        return gpt_flops(1.0, micro_batch, self.seq_length, self.num_layers, self.hidden_size, self.vocab_size)

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

    ``paper`` is docs/design.md §4.10 / ZeRO-topo Tables V-VI: 16-bit gradient shards, ZeRO++ keeps its
    secondary in 16 bits (DeepSpeed hpZ), other secondaries at ``secondary_bits``. ``engine`` is
    what megatron_topo keeps: fp32 gradient shards, every secondary at ``secondary_bits``."""
    if convention not in ("paper", "engine"):
        raise ValueError(f"convention '{convention}' is not valid; use paper or engine")
    w, g, o = plan.factors
    s = plan.secondary_degree
    sec = 0.0
    if s and w > 1:
        bits = plan.measured_secondary_bits if convention == "paper" else plan.secondary_bits
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
