"""Which model spec builds a config: the architectures by name (:func:`register`), the spec of a
``ModelConfig`` (:func:`spec_for`: ``model.arch`` when set, else derived from GPT-NeoX's keys,
:func:`arch_of`) or of an HF ``config.json`` (:func:`spec_for_hf`), and the calls that go through it
(:func:`build_model`, :func:`unit_numels`).

The engine, the performance model, the preflight, the dry run and HF import/export ask the spec of
a config here; the interface every spec implements (``ModelSpec``) and the rules the architectures
share are in :mod:`.spec_base`, the architectures in ``gpt_neox.py`` and ``llama_spec.py``.
"""

from __future__ import annotations

from typing import Optional

import torch.nn as nn

from ..config.schema import ModelConfig
from .gpt_neox import GPTNeoXSpec
from .llama_spec import LlamaSpec
from .spec_base import ModelSpec

_SPECS: dict = {}


def register(spec: ModelSpec) -> ModelSpec:
    _SPECS[spec.name] = spec
    return spec


def names() -> list:
    return sorted(_SPECS)


def get(name: str) -> ModelSpec:
    return _SPECS[name]


def arch_of(cfg) -> str:
    """``model.arch`` when set, else derived from GPT-NeoX's keys: ``llama`` when the config asks
    for RMSNorm, a gated (swiglu / silu) MLP or GPT-NeoX's llama MLP; ``gpt_neox`` otherwise."""
    arch = getattr(cfg, "arch", None)
    if arch:
        return arch
    if (
        getattr(cfg, "norm", "layernorm") == "rmsnorm"
        or getattr(cfg, "activation", "gelu") in ("swiglu", "silu")
        or getattr(cfg, "mlp_type", "regular") == "llama"
    ):
        return "llama"
    return "gpt_neox"


def spec_for(cfg) -> ModelSpec:
    """The spec that builds ``cfg`` (a ModelConfig)."""
    return get(arch_of(cfg))


def spec_for_hf(hf: dict) -> Optional[ModelSpec]:
    """The spec whose HF ``model_type`` is ``hf['model_type']`` (None: no spec reads it)."""
    mt = hf.get("model_type")
    return next((s for s in _SPECS.values() if mt in s.hf_model_types), None)


def hf_model_types() -> list:
    return [t for s in _SPECS.values() for t in s.hf_model_types]


def build_model(cfg: ModelConfig, device="cpu", seed: int | None = None) -> nn.Module:
    """Build and initialise the model ``cfg`` describes (its spec's ``build``) on ``device``.
    ``"meta"`` builds shapes only: the engine then materialises and initialises one unit at a
    time (``init_parameters``) and keeps only its shards, so no rank ever holds the whole model."""
    return spec_for(cfg).build(cfg, device, seed)


def unit_numels(cfg: ModelConfig) -> list[int]:
    """Trainable parameters each unit the engine wraps holds (built on the meta device: no memory).
    A tied weight counts once, in the first unit that has it, as the engine shards it."""
    return spec_for(cfg).unit_numels(cfg)


# the architectures, in this order (spec_for_hf and hf_model_types read them so)
register(GPTNeoXSpec())
register(LlamaSpec())
