"""The GPT-NeoX architecture as a plain nn.Module (no parallelism inside; engines wrap it).

Embedding -> N x [LayerNorm, causal self-attention with partial rotary, LayerNorm, GeLU MLP (4h)]
with the parallel (``gpt_j_residual``) or sequential residual -> final LayerNorm -> untied head.
Parameter layout and math follow HuggingFace ``GPTNeoXForCausalLM`` so weights map one to one.
"""
from __future__ import annotations

import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_size = cfg.hidden_size // cfg.num_attention_heads
        self.dropout = cfg.attention_dropout
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        # GPT-NeoX packs q, k, v per head: [b, s, heads, 3 * head_size]
        qkv = self.query_key_value(x).view(b, s, self.num_heads, 3 * self.head_size).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.dense(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size)
        self.dense_4h_to_h = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.parallel = cfg.gpt_j_residual
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.attention = Attention(cfg)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = self.dropout(self.attention(self.input_layernorm(x), cos, sin))
        if self.parallel:
            return x + attn + self.dropout(self.mlp(self.post_attention_layernorm(x)))
        h = x + attn
        return h + self.dropout(self.mlp(self.post_attention_layernorm(h)))


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon)
        self.embed_out = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed_out(self.final_layer_norm(x))


class GPTNeoX(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_in = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)
        if not cfg.no_weight_tying:
            self.head.embed_out.weight = self.embed_in.weight
        self.register_buffer("inv_freq", rotary_inv_freq(cfg), persistent=False)
        self.checkpoint_activations = cfg.checkpoint_activations

    # ------------------------------------------------------------------ structure
    def shard_units(self) -> list[nn.Module]:
        """The modules an engine wraps one by one, in execution order."""
        return [self.embed_in, *self.layers, self.head]

    def rotary(self, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(seq_len, device=device, dtype=torch.float)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_in(input_ids)
        cos, sin = self.rotary(input_ids.shape[1], input_ids.device)
        for layer in self.layers:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        return self.head(x)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self, seed: int = 1234) -> None:
        """GPT-NeoX init of every parameter (see :meth:`init_parameters`)."""
        self.init_parameters(self, seed)

    @torch.no_grad()
    def init_parameters(self, module: nn.Module, seed: int = 1234) -> None:
        """GPT-NeoX init of ``module``'s parameters, in place: ``init_method`` for inputs,
        ``output_layer_init_method`` for the attention/MLP output projections, zero biases, unit
        LayerNorm. Each parameter draws from its own generator seeded by ``seed`` and its name,
        so a module initialised alone (sharded init, one unit at a time) gets exactly the values
        it gets inside the whole model, whatever the world size or plan."""
        cfg = self.cfg
        std_in = init_std(cfg.init_method, cfg)
        std_out = init_std(cfg.output_layer_init_method, cfg)
        names = {id(p): n for n, p in self.named_parameters()}
        for p in module.parameters():
            name = names[id(p)]
            if name.endswith("bias"):
                p.zero_()
            elif "layernorm" in name or "layer_norm" in name:
                p.fill_(1.0)
            else:
                if p.device.type == "meta":
                    continue
                gen = torch.Generator(device=p.device)
                gen.manual_seed(parameter_seed(seed, name))
                std = std_out if (name.endswith("attention.dense.weight") or name.endswith("dense_4h_to_h.weight")) \
                    else std_in
                p.normal_(0.0, std, generator=gen)

    def init_buffers(self, device) -> None:
        """(Re)compute the non-persistent buffers on ``device`` (after a meta-device build)."""
        self.inv_freq = rotary_inv_freq(self.cfg, device)


def rotary_inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    head_size = cfg.hidden_size // cfg.num_attention_heads
    rot = int(head_size * cfg.rotary_pct)
    rot -= rot % 2
    exps = torch.arange(0, rot, 2, dtype=torch.float, device=device) / max(rot, 1)
    return 1.0 / (cfg.rotary_emb_base ** exps)


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed per (run seed, parameter name): stable across processes and Python runs."""
    return (int(seed) * 0x9E3779B1 + zlib.crc32(name.encode())) % (2**63 - 1)


def init_std(method: str, cfg: ModelConfig) -> float:
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


def build_model(cfg: ModelConfig, device="cpu", seed: int | None = None) -> GPTNeoX:
    """Build and initialise on ``device``. ``"meta"`` builds shapes only: the engine then
    materialises and initialises one unit at a time (``init_parameters``) and keeps only its
    shards, so no rank ever holds the whole model."""
    with torch.device(device):
        model = GPTNeoX(cfg)
    if str(device) != "meta":
        model.init_weights(seed if seed is not None else 1234)
    return model


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def unit_numels(cfg: ModelConfig) -> list[int]:
    """Trainable parameters each unit the engine wraps holds (built on the meta device: no memory).
    A tied weight counts once, in the first unit that has it, as the engine shards it."""
    model = build_model(cfg, device="meta")
    seen: set[int] = set()
    out = []
    for u in model.shard_units():
        ps = [p for p in u.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in ps)
        out.append(sum(p.numel() for p in ps))
    return out
