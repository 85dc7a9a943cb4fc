"""The GPT-NeoX architecture as a plain nn.Module (no parallelism inside; engines wrap it).

Embedding -> N x [LayerNorm, causal self-attention with partial rotary, LayerNorm, GeLU MLP (4h)]
with the parallel (``gpt_j_residual``) or sequential residual -> final LayerNorm -> untied head.
Parameter layout and math follow HuggingFace ``GPTNeoXForCausalLM`` so weights map one to one.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..config.schema import ModelConfig
from ..safe_files import excerpt
from .spec_base import (
    OUTPUT,
    ModelSpec,
    apply_rotary,
    init_by_role,
    parameter_seed,  # noqa: F401
    rotary_tables,
)
from .spec_base import rotary_inv_freq as _inv_freq


def gpt_flops(
    passes: float, sequences: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int
) -> float:
    """Model FLOPs of ``passes`` passes over ``sequences`` sequences, counted the way GPT-NeoX does.

    Source: GPT-NeoX ``megatron/logging.py::get_flops`` as corrected by EleutherAI/gpt-neox PR #1094
    (issue #1093), itself taken from Megatron-DeepSpeed ``megatron/utils.py`` and Narayanan et al.
    2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
    (arXiv:2104.04473, Eq. 3)::

        F = 24 * f * B * s * L * h^2 * (1 + s / (6 h) + V / (16 L h))

    with ``f = passes``: 3 (forward + backward = 1 + 2 passes) or ``f = 4`` when activations are
    recomputed (one more forward), ``B`` the sequences (for a step: micro batch x
    accumulation x data-parallel size), ``s`` the sequence length, ``L`` layers, ``h`` the hidden
    size and ``V`` the (padded) vocabulary. The ``V/(16Lh)`` logit term carries the same prefactor;
    the GPT-NeoX version between PR #1044 and #1094 added it as a bare constant, which is a bug.
    As in GPT-NeoX, the factor ``f`` multiplies the logit term too (the paper's derivation has
    it fixed at 96 -- i.e. it is exact for ``f = 4`` and counts the head 4.5 B s h V instead of
    6 B s h V for ``f = 3``); we keep GPT-NeoX's number so TFLOPS are comparable with its logs.
    """
    B, s, L = float(sequences), float(seq_length), float(num_layers)
    h, V = float(hidden_size), float(vocab_size)
    return 24.0 * passes * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_size = cfg.hidden_size // cfg.num_attention_heads
        self.dropout = cfg.attention_dropout
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense.init_role = OUTPUT

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
        self.dense_4h_to_h.init_role = OUTPUT

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
        return rotary_tables(self.inv_freq, seq_len, device)

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
        """GPT-NeoX init of ``module``'s parameters, in place, by role (``spec_base.init_by_role``):
        ``init_method`` for inputs, ``output_layer_init_method`` for the attention/MLP output
        projections, zero biases, unit LayerNorm; the same values alone as in the whole model."""
        init_by_role(self, module, self.cfg, seed)

    def init_buffers(self, device) -> None:
        """(Re)compute the non-persistent buffers on ``device`` (after a meta-device build)."""
        self.inv_freq = rotary_inv_freq(self.cfg, device)


def rotary_inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    return _inv_freq(cfg.hidden_size // cfg.num_attention_heads, cfg.rotary_pct, cfg.rotary_emb_base, device)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


class GPTNeoXSpec(ModelSpec):
    """GPT-NeoX (GPT-NeoX-20B, Pythia): LayerNorm, partial rotary, GeLU 4h MLP with biases,
    parallel or sequential residual; HF ``GPTNeoXForCausalLM``."""

    name = "gpt_neox"
    hf_model_types = ("gpt_neox",)
    arch_keys = (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "rotary_pct",
        "rotary_emb_base",
        "gpt_j_residual",
        "no_weight_tying",
        "norm",
        "layernorm_epsilon",
    )

    def module_class(self, cfg):
        return GPTNeoX

    def check(self, cfg) -> list:
        out = []
        h = cfg.hidden_size
        if cfg.norm != "layernorm" or cfg.activation != "gelu" or cfg.mlp_type != "regular":
            out.append(
                f"arch: gpt_neox builds LayerNorm and GPT-NeoX's gelu MLP, not norm={cfg.norm!r}, "
                f"activation={cfg.activation!r}, mlp_type={cfg.mlp_type!r}; drop arch (the llama architecture "
                f"is picked by rmsnorm/swiglu) or those keys"
            )
        if cfg.intermediate_size is not None and cfg.intermediate_size != 4 * h:
            out.append(
                f"intermediate_size {cfg.intermediate_size} is not valid; the MLP width is 4 x hidden_size = "
                f"{4 * h} (GPT-NeoX's regular MLP); drop the key or set it to {4 * h}"
            )
        elif (4 * h) % cfg.mlp_multiple_of:
            out.append(
                f"mlp_multiple_of {cfg.mlp_multiple_of} would round the MLP width 4 x hidden_size = {4 * h} "
                f"up; the gpt_neox architecture keeps 4 x hidden_size: use a divisor of it"
            )
        if cfg.num_kv_heads is not None and cfg.num_kv_heads != cfg.num_attention_heads:
            out.append(
                f"num_kv_heads {cfg.num_kv_heads} is not valid for the gpt_neox architecture; grouped-query "
                f"attention is the llama architecture's (norm: rmsnorm, activation: swiglu), use num_kv_heads "
                f"= num_attention_heads ({cfg.num_attention_heads}) or drop it"
            )
        for key, what in (
            ("use_bias_in_norms", "LayerNorm"),
            ("use_bias_in_attn_linear", "attention projections"),
            ("use_bias_in_mlp", "MLP"),
        ):
            if not getattr(cfg, key):
                out.append(
                    f"{key}=false is not valid for the gpt_neox architecture (its {what} always have "
                    f"biases, as HF GPTNeoX); set it to true or drop it"
                )
        if cfg.sliding_window_width:
            out.append(
                "sliding_window_width is not valid for the gpt_neox architecture; the sliding window is the "
                "llama architecture's (Mistral: norm: rmsnorm, activation: swiglu)"
            )
        return out

    def layer_matmul_params(self, cfg) -> int:
        return 12 * cfg.hidden_size**2

    def param_count(self, cfg) -> int:
        """Per layer 12h^2 + 13h (QKV, dense, 4h MLP, biases, 2 LayerNorms); embedding V*h (+ an
        untied head V*h); final LayerNorm 2h; rotary has no parameters."""
        h, V = cfg.hidden_size, cfg.vocab_size
        emb = V * h * (2 if cfg.no_weight_tying else 1)
        return cfg.num_layers * (12 * h * h + 13 * h) + emb + 2 * h

    def forward_flops(self, cfg, sequences: float, seq_length=None, passes: float = 1.0) -> float:
        """``passes`` forward passes over ``sequences`` sequences, as GPT-NeoX logs them
        (:func:`gpt_flops`)."""
        return gpt_flops(
            passes, sequences, seq_length or cfg.seq_length, cfg.num_layers, cfg.hidden_size, cfg.vocab_size
        )

    def activation_bytes(self, cfg, micro_batch: int, precision: str, recompute: bool) -> int:
        from ..zero_topo.memory import activation_bytes

        return activation_bytes(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_layers,
            cfg.seq_length,
            cfg.vocab_size,
            micro_batch,
            precision,
            recompute,
        )

    # ---------------------------------------------------------------- HF GPTNeoXForCausalLM
    def hf_head_name(self) -> str:
        return "embed_out"

    def to_hf_key(self, name: str, head_name: str | None = None) -> str:
        """``head_name``: ``embed_out`` (the published GPT-NeoX checkpoints; transformers 5 renames
        it on load) or ``lm_head`` (transformers >= 5 module name)."""
        head_name = head_name or "embed_out"
        if name.startswith("head.embed_out."):
            return head_name + name[len("head.embed_out") :]
        if name.startswith("head.final_layer_norm."):
            return "gpt_neox." + name[len("head.") :]
        return "gpt_neox." + name

    def from_hf_key(self, name: str) -> str:
        if name.startswith("embed_out.") or name.startswith("lm_head."):
            return "head.embed_out." + name.split(".", 1)[1]
        name = name[len("gpt_neox.") :] if name.startswith("gpt_neox.") else name
        if name.startswith("final_layer_norm."):
            return "head." + name
        return name

    def hf_config_kwargs(self, cfg) -> dict:
        """Keyword arguments for ``transformers.GPTNeoXConfig`` describing the same model."""
        return dict(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_attention_heads,
            intermediate_size=4 * cfg.hidden_size,
            hidden_act="gelu",
            rotary_pct=cfg.rotary_pct,
            rotary_emb_base=cfg.rotary_emb_base,
            max_position_embeddings=cfg.max_position_embeddings,
            layer_norm_eps=cfg.layernorm_epsilon,
            use_parallel_residual=cfg.gpt_j_residual,
            tie_word_embeddings=not cfg.no_weight_tying,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            attention_bias=True,
        )

    def hf_config(self, cfg) -> tuple:
        """(``GPTNeoXForCausalLM``, config dict) with the rotary settings under every name a
        transformers version that has GPT-NeoX reads: ``rotary_pct``/``rotary_emb_base`` (4.x reads
        only these, defaulting to 0.25 / 10000), ``partial_rotary_factor``/``rope_theta`` and
        ``rope_parameters`` (5.x), ``rope_scaling: null``."""
        kw = self.hf_config_kwargs(cfg)
        try:
            import transformers

            d = transformers.GPTNeoXConfig(**kw).to_dict()
        except ImportError:
            d = {"model_type": "gpt_neox", **kw}
        pct, base = float(cfg.rotary_pct), int(cfg.rotary_emb_base)
        d["rope_parameters"] = {"rope_theta": float(base), "partial_rotary_factor": pct, "rope_type": "default"}
        d.update(
            rotary_pct=pct, rotary_emb_base=base, partial_rotary_factor=pct, rope_theta=float(base), rope_scaling=None
        )
        return "GPTNeoXForCausalLM", d

    def model_keys_from_hf(self, hf: dict, where: str) -> dict:
        """Our ModelConfig keys describing the HF GPT-NeoX model; ConfigError for what we cannot build."""
        from ..config.options import ConfigError

        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        pct = hf.get("rotary_pct", rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
        base = hf.get("rotary_emb_base", rope.get("rope_theta", hf.get("rope_theta", 10000)))
        for r in (hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}):  # both: either may be stale
            kind = r.get("rope_type", r.get("type", "default"))  # "type": transformers' older name
            if kind not in ("default", None):
                raise ConfigError(f"{where}: rope_type {excerpt(kind)} is not supported (plain rotary only)")
        h = int(hf["hidden_size"])
        out = dict(
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=h,
            num_attention_heads=int(hf["num_attention_heads"]),
            vocab_size=int(hf["vocab_size"]),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rotary_pct=float(pct),
            rotary_emb_base=int(float(base)),
            layernorm_epsilon=float(hf.get("layer_norm_eps", 1e-5)),
            gpt_j_residual=bool(hf.get("use_parallel_residual", True)),
            no_weight_tying=not bool(hf.get("tie_word_embeddings", False)),
        )
        unsupported = []
        if int(hf.get("intermediate_size", 4 * h)) != 4 * h:
            unsupported.append(f"intermediate_size {hf['intermediate_size']} (ours is 4 x hidden_size = {4 * h})")
        if hf.get("hidden_act", "gelu") != "gelu":
            unsupported.append(f"hidden_act {excerpt(hf['hidden_act'])} (ours is gelu)")
        if hf.get("attention_bias", True) is not True:
            unsupported.append("attention_bias false (ours has biases)")
        if unsupported:
            raise ConfigError(f"{where}: this GPT-NeoX variant cannot be built here: {'; '.join(unsupported)}")
        return out
