"""Model specs: everything the package asks about an architecture, in one object per architecture.

A :class:`ModelSpec` owns, for the ``ModelConfig`` it is given:

- building the plain ``nn.Module`` (``build``) and its init rules by role (input / output
  projection / norm / bias), so sharded init gives every parameter the value it has in the whole
  model;
- the parameter count (``param_count``, exact: equal to the built module's), the FLOPs of a forward
  pass (``forward_flops``) and the activation bytes of a micro-batch (``activation_bytes``);
- the ``ModelConfig`` keys that define its function (``arch_keys``: a resume must keep them);
- the HuggingFace mapping both ways: tensor names, ``config.json`` out (``hf_config``) and in
  (``model_keys_from_hf``).

This module holds the interface and the rules the architectures share (rotary tables, init by
role); :mod:`.spec` holds the registry that picks an architecture's spec for a config.
"""

from __future__ import annotations

import math
import zlib
from typing import Iterable, Optional

import torch
import torch.nn as nn

# the roles an init rule is given by (a module's ``init_role`` marks its weight)
INPUT, OUTPUT = "input", "output"


class ModelSpec:
    """The interface every architecture implements (see the module docstring)."""

    name: str = ""
    hf_model_types: tuple = ()

    # ---------------------------------------------------------------- build
    def module_class(self, cfg):  # pragma: no cover - abstract
        raise NotImplementedError

    def build(self, cfg, device="cpu", seed: Optional[int] = None) -> nn.Module:
        """Build and initialise on ``device``. ``"meta"`` builds shapes only: the engine then
        materialises and initialises one unit at a time (``init_parameters``)."""
        with torch.device(device):
            model = self.module_class(cfg)(cfg)
        if str(device) != "meta":
            model.init_weights(seed if seed is not None else 1234)
        return model

    def check(self, cfg) -> list:
        """Problems (one line each) with ``cfg`` for this architecture; empty: it builds."""
        return []

    # ---------------------------------------------------------------- sizes
    def param_count(self, cfg) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def layer_matmul_params(self, cfg) -> int:  # pragma: no cover - abstract
        """Weights one layer multiplies every token by (biases and norms excluded)."""
        raise NotImplementedError

    def forward_flops(
        self, cfg, sequences: float, seq_length: Optional[int] = None, passes: float = 1.0
    ) -> float:  # pragma: no cover - abstract
        """Model FLOPs of ``passes`` forward passes over ``sequences`` sequences (3: forward and
        backward, 4: with activation recompute), counted the way GPT-NeoX logs them."""
        raise NotImplementedError

    def activation_bytes(self, cfg, micro_batch: int, precision: str, recompute: bool) -> int:  # pragma: no cover
        """Activations one micro-batch keeps for backward (``zero_topo.memory.activation_bytes``)."""
        raise NotImplementedError

    def unit_numels(self, cfg) -> list:
        """Trainable parameters each unit the engine wraps holds (built on the meta device). A tied
        weight counts once, in the first unit that has it, as the engine shards it."""
        model = self.build(cfg, device="meta")
        seen: set = set()
        out = []
        for u in model.shard_units():
            ps = [p for p in u.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in ps)
            out.append(sum(p.numel() for p in ps))
        return out

    # ---------------------------------------------------------------- keys
    arch_keys: tuple = ()

    # ---------------------------------------------------------------- HF
    def to_hf_key(self, name: str, head_name: Optional[str] = None) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def from_hf_key(self, name: str) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def hf_head_name(self) -> str:  # pragma: no cover - abstract
        """The output projection's name in the exported files."""
        raise NotImplementedError

    def hf_config(self, cfg) -> tuple:  # pragma: no cover - abstract
        """(architecture class name, config.json dict) describing the same model."""
        raise NotImplementedError

    def model_keys_from_hf(self, hf: dict, where: str) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


# ------------------------------------------------------------------------------ shared rules
def rotary_inv_freq(head_size: int, rotary_pct: float, base: float, device=None) -> torch.Tensor:
    rot = int(head_size * rotary_pct)
    rot -= rot % 2
    exps = torch.arange(0, rot, 2, dtype=torch.float, device=device) / max(rot, 1)
    return 1.0 / (base**exps)


def rotary_tables(inv_freq: torch.Tensor, seq_len: int, device) -> tuple:
    pos = torch.arange(seq_len, device=device, dtype=torch.float)
    freqs = torch.outer(pos, inv_freq.to(device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of each head; pass the rest through."""
    rd = cos.shape[-1]
    if rd == 0:
        return x
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed per (run seed, parameter name): stable across processes and Python runs."""
    return (int(seed) * 0x9E3779B1 + zlib.crc32(name.encode())) % (2**63 - 1)


def init_std(method: str, cfg) -> float:
    h, n = cfg.hidden_size, cfg.num_layers
    if method == "small_init":  # Nguyen & Salazar: sqrt(2 / (5 d))
        return math.sqrt(2.0 / (5.0 * h))
    if method == "wang_init":  # Wang (Mesh-Transformer-JAX): 2 / (n_layers * sqrt(d))
        return 2.0 / (n * math.sqrt(h))
    std = getattr(cfg, "init_method_std", 0.02)
    if method == "normal":
        return std
    if method == "scaled_normal":  # GPT-NeoX / Megatron: std / sqrt(2 n_layers)
        return std / math.sqrt(2.0 * n)
    raise ValueError(f"unknown init method {method!r}")


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or getattr(module, "is_norm", False)


@torch.no_grad()
def init_by_role(model: nn.Module, module: nn.Module, cfg, seed: int) -> None:
    """GPT-NeoX's init of ``module``'s parameters (``module`` is ``model`` or a part of it), in
    place, by each parameter's role: a norm's weight 1 and its bias 0, every other bias 0, the
    weight of a module marked ``init_role = "output"`` (the attention and MLP output projections)
    ``output_layer_init_method``, every other weight (embeddings, input projections, the head)
    ``init_method``. Each weight draws from its own generator seeded by ``seed`` and its name in
    ``model``, so a module initialised alone (sharded init, one unit at a time) gets exactly the
    values it gets inside the whole model, whatever the world size or plan."""
    std = {INPUT: init_std(cfg.init_method, cfg), OUTPUT: init_std(cfg.output_layer_init_method, cfg)}
    names = {id(p): n for n, p in model.named_parameters()}
    done: set = set()
    for mod in module.modules():
        for leaf, p in mod.named_parameters(recurse=False):
            if id(p) in done:  # a tied weight: once, under its first name
                continue
            done.add(id(p))
            if leaf == "bias":
                p.zero_()
            elif is_norm(mod):
                p.fill_(1.0)
            elif p.device.type != "meta":
                gen = torch.Generator(device=p.device)
                gen.manual_seed(parameter_seed(seed, names[id(p)]))
                p.normal_(0.0, std[getattr(mod, "init_role", INPUT)], generator=gen)


def unique_numel(params: Iterable) -> int:
    return sum(p.numel() for p in {id(p): p for p in params}.values())
