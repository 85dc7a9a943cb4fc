"""The Llama family (LLaMA 1/2, Code Llama, Llemma, Mistral) as a plain nn.Module, and its spec.

Embedding -> N x [RMSNorm, causal self-attention with rotary and grouped-query (``num_kv_heads``)
keys/values, optionally within a sliding window, RMSNorm, SwiGLU MLP] with the sequential residual
-> final RMSNorm -> head (untied unless ``no_weight_tying: false``). Parameter names and math follow
HuggingFace ``LlamaForCausalLM`` / ``MistralForCausalLM`` so weights map one to one; the MLP width
follows GPT-NeoX's sizing rule (:func:`mlp_width`), so GPT-NeoX's Llama configs build the shapes
(and parameter counts) GPT-NeoX builds.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..config.schema import ModelConfig
from .gpt_neox import rotary_inv_freq as _inv_freq  # the model's head size, rotary_pct and rotary_emb_base
from .spec_base import OUTPUT, apply_rotary, init_by_role, rotary_tables


def gated(cfg) -> bool:
    """GPT-NeoX's gated MLPs: ``activation: swiglu`` (its ParallelMLP) or ``mlp_type: llama`` (its
    LLaMAParallelMLP, SiLU-gated)."""
    return cfg.activation == "swiglu" or cfg.mlp_type == "llama"


def mlp_width(cfg) -> int:
    """The MLP's inner width as GPT-NeoX sizes it (megatron/model/transformer.py):

    - ``mlp_type: llama`` (LLaMAParallelMLP): ``intermediate_size`` if set, else int(8h/3) rounded
      up to a multiple of 256;
    - otherwise (ParallelMLP): ``d = intermediate_size or 4h``; gated (swiglu): ``d = int(d * 2/3)``
      and the inner width ``d // 2``; then ``d`` is rounded up to a multiple of 2 x
      ``mlp_multiple_of`` and the inner width to a multiple of ``mlp_multiple_of`` (the two must
      agree, as GPT-NeoX's chunked activation needs). ValueError when they do not."""
    h = cfg.hidden_size
    if cfg.mlp_type == "llama":
        if cfg.intermediate_size:
            return cfg.intermediate_size
        f = int(2 * h * 4 / 3)
        return 256 * ((f + 255) // 256)
    ffn = cfg.intermediate_size or 4 * h
    ffn_in = ffn
    if gated(cfg):
        ffn = int(ffn * 2 / 3)
        ffn_in = ffn // 2
    m = cfg.mlp_multiple_of
    ffn = 2 * m * ((ffn + 2 * m - 1) // (2 * m))
    ffn_in = m * ((ffn_in + m - 1) // m)
    if ffn != (2 * ffn_in if gated(cfg) else ffn_in):
        raise ValueError(
            f"GPT-NeoX's sizing gives the MLP {ffn} outputs for {ffn_in} inputs of its second "
            f"projection (intermediate_size {cfg.intermediate_size}, mlp_multiple_of {m}); "
            f"choose an intermediate_size that gives a consistent width"
        )
    return ffn_in


def mlp_bias(cfg) -> bool:
    """MLP biases: ``use_bias_in_mlp``, except GPT-NeoX's LLaMAParallelMLP (``mlp_type: llama``), which has none."""
    return bool(cfg.use_bias_in_mlp) and cfg.mlp_type != "llama"


def kv_heads(cfg) -> int:
    return cfg.num_kv_heads or cfg.num_attention_heads


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: ``w * x / sqrt(mean(x^2) + eps)``, computed in fp32. (GPT-NeoX's RMSNorm
    divides by ``sqrt(mean(x^2)) + eps``: the same to a relative ~eps / (2 rms) -- 5e-6 at GPT-NeoX's
    Llama configs' eps 1e-5 and unit rms; HF's form is the one exports and imports must match.)"""

    is_norm = True

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.heads, self.kv = cfg.num_attention_heads, kv_heads(cfg)
        self.head_size = h // self.heads
        self.window = cfg.sliding_window_width
        self.dropout = cfg.attention_dropout
        bias = bool(cfg.use_bias_in_attn_linear)
        self.q_proj = nn.Linear(h, self.heads * self.head_size, bias=bias)
        self.k_proj = nn.Linear(h, self.kv * self.head_size, bias=bias)
        self.v_proj = nn.Linear(h, self.kv * self.head_size, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_size, h, bias=bias)
        self.o_proj.init_role = OUTPUT

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_size).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.head_size).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.head_size).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv != self.heads:  # query head i reads key/value head i // (heads / kv), as HF's repeat_kv
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        drop = self.dropout if self.training else 0.0
        if self.window and self.window < s:  # HF Mistral: each token sees itself and the window - 1 before it
            i = torch.arange(s, device=x.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_size))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        f, bias = mlp_width(cfg), mlp_bias(cfg)
        self.gate_proj = nn.Linear(cfg.hidden_size, f, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, f, bias=bias)
        self.down_proj = nn.Linear(f, cfg.hidden_size, bias=bias)
        self.down_proj.init_role = OUTPUT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_epsilon)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_epsilon)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.dropout(self.self_attn(self.input_layernorm(x), cos, sin))
        return h + self.dropout(self.mlp(self.post_attention_layernorm(h)))


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_epsilon)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)
        if not cfg.no_weight_tying:
            self.head.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", _inv_freq(cfg), persistent=False)
        self.checkpoint_activations = cfg.checkpoint_activations

    def shard_units(self) -> list[nn.Module]:
        """The modules an engine wraps one by one, in execution order."""
        return [self.embed_tokens, *self.layers, self.head]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = rotary_tables(self.inv_freq, input_ids.shape[1], input_ids.device)
        for layer in self.layers:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        return self.head(x)

    @torch.no_grad()
    def init_weights(self, seed: int = 1234) -> None:
        self.init_parameters(self, seed)

    @torch.no_grad()
    def init_parameters(self, module: nn.Module, seed: int = 1234) -> None:
        """GPT-NeoX's init by role (``spec_base.init_by_role``): o_proj/down_proj take
        output_layer_init_method, every other weight init_method, norms 1, biases 0."""
        init_by_role(self, module, self.cfg, seed)

    def init_buffers(self, device) -> None:
        self.inv_freq = _inv_freq(self.cfg, device)
