"""The ``model`` section of the config: the architecture and its initialisation (GPT-NeoX's flat
keys), each field declared once with its checks (``option``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .options import option

INIT_METHODS = ("normal", "scaled_normal", "small_init", "wang_init")
MAX_VOCAB = 2**31 - 1  # token ids are int32 in datasets with >= 65500 ids (GPT-NeoX)


@dataclass
class ModelConfig:
    num_layers: int = option(2, "transformer layers (required in a config file)", ge=1, le=1 << 12, neox="implemented")
    hidden_size: int = option(64, "model width (required in a config file)", ge=1, le=1 << 18, neox="implemented")
    num_attention_heads: int = option(
        4, "attention heads (must divide hidden_size; required in a config file)", ge=1, le=1 << 14, neox="implemented"
    )
    seq_length: int = option(
        64, "tokens per training sample (required in a config file)", ge=1, le=1 << 20, neox="implemented"
    )
    max_position_embeddings: Optional[int] = option(
        None, "position limit (required in a config file; in code: seq_length)", ge=1, le=1 << 30, neox="implemented"
    )
    vocab_size: int = option(
        512,
        "padded vocabulary size; unset in a config file: the tokenizer's size padded "
        "to a multiple of make_vocab_size_divisible_by (GPT-NeoX's padded_vocab_size)",
        ge=1,
        le=MAX_VOCAB,
    )
    make_vocab_size_divisible_by: int = option(
        128, "pad the derived vocabulary to a multiple of this", ge=1, le=1 << 20, neox="implemented"
    )
    pos_emb: str = option(
        "rotary",
        "positional embedding (GPT-NeoX's default is learned)",
        choices=("rotary",),
        neox="accepted",
        why="only rotary embeddings are implemented; GPT-NeoX's own configs set pos_emb: rotary",
    )
    rotary_pct: float = option(
        1.0, "fraction of each head's dims that get rotary embeddings", ge=0.0, le=1.0, neox="implemented"
    )
    rotary_emb_base: int = option(10000, "rotary frequency base", ge=1, le=10**12, neox="implemented")
    gpt_j_residual: bool = option(False, "parallel attention + MLP residual (GPT-NeoX-20B, Pythia)", neox="implemented")
    no_weight_tying: bool = option(
        False,
        "untied input/output embeddings (false: the output layer uses the "
        "embedding's weight, sharded once by the embedding unit)",
        neox="implemented",
    )
    norm: str = option(
        "layernorm",
        "normalisation layer (rmsnorm: the llama architecture)",
        choices=("layernorm", "rmsnorm"),
        neox="implemented",
        why="scalenorm is not implemented",
    )
    layernorm_epsilon: float = option(1e-5, "LayerNorm epsilon", gt=0.0, le=1.0, neox="implemented")
    init_method: str = option(
        "normal",
        "weight init of the input-side layers",
        choices=INIT_METHODS,
        neox="implemented",
        why="orthogonal and xavier inits are not implemented",
    )
    output_layer_init_method: str = option(
        "scaled_normal",
        "weight init of the attention/MLP output projections (scaled_normal: init_method_std / sqrt(2 num_layers))",
        choices=INIT_METHODS,
        neox="implemented",
        why="orthogonal and xavier inits are not implemented",
    )
    init_method_std: float = option(0.02, "std of normal and scaled_normal", gt=0.0, le=10.0, neox="implemented")
    checkpoint_activations: bool = option(
        False, "recompute each layer's activations in the backward pass", neox="implemented"
    )
    checkpoint_num_layers: int = option(
        1, "layers per recomputed chunk", choices=(1,), neox="accepted", why="each layer is recomputed on its own"
    )
    attention_dropout: float = option(0.0, "dropout on attention probabilities", ge=0.0, lt=1.0, neox="implemented")
    hidden_dropout: float = option(0.0, "dropout on residual branches", ge=0.0, lt=1.0, neox="implemented")
    attention_config: Optional[list[Any]] = option(
        None, "GPT-NeoX's per-layer attention types (global/flash; checked with num_layers)", neox="accepted"
    )
    # ---- architecture (model/spec.py): GPT-NeoX's keys pick and shape the model spec
    arch: Optional[str] = option(
        None,
        "model spec: gpt_neox | llama (default: llama when norm is rmsnorm, "
        "activation is swiglu/silu or mlp_type is llama, else gpt_neox)",
        choices=("gpt_neox", "llama"),
    )
    activation: str = option(
        "gelu",
        "MLP activation: gelu (gpt_neox), swiglu (gated, GPT-NeoX's ParallelMLP), silu (with mlp_type: llama)",
        choices=("gelu", "swiglu", "silu"),
        neox="implemented",
        why="other activations are not implemented",
    )
    mlp_type: str = option(
        "regular",
        "MLP kind: llama is GPT-NeoX's LLaMAParallelMLP (SiLU-gated, no biases, "
        "width intermediate_size or 8h/3 rounded up to 256)",
        choices=("regular", "llama"),
        neox="implemented",
    )
    intermediate_size: Optional[int] = option(
        None,
        "MLP width before GPT-NeoX's sizing rule (gpt_neox: 4 x "
        "hidden_size; swiglu: the inner width is int(2/3 x it) / 2, rounded "
        "to mlp_multiple_of)",
        ge=1,
        le=1 << 22,
        neox="implemented",
    )
    mlp_multiple_of: int = option(
        1, "round the MLP width up to a multiple of this (GPT-NeoX's ParallelMLP)", ge=1, le=1 << 16, neox="implemented"
    )
    num_kv_heads: Optional[int] = option(
        None,
        "key/value heads: grouped-query (1: multi-query) attention in the "
        "llama architecture (gpt_neox: must equal num_attention_heads)",
        ge=1,
        le=1 << 14,
        neox="implemented",
    )
    attention_type: Optional[str] = option(
        None,
        "GPT-NeoX's attention kind (llemma): the kind follows num_kv_heads",
        choices=("multihead", "groupedquery", "multiquery"),
        neox="accepted",
    )
    sliding_window_width: Optional[int] = option(
        None,
        "llama: each token attends to itself and the W - 1 tokens before it (HF Mistral's sliding window)",
        ge=1,
        neox="implemented",
    )
    rms_norm_epsilon: float = option(1e-8, "RMSNorm epsilon (GPT-NeoX's default)", gt=0.0, le=1.0, neox="implemented")
    use_bias_in_norms: bool = option(True, "norm biases (LayerNorm; RMSNorm has none: set false)", neox="implemented")
    use_bias_in_attn_linear: bool = option(True, "attention projection biases (gpt_neox: always)", neox="implemented")
    use_bias_in_mlp: bool = option(True, "MLP biases (gpt_neox: always; mlp_type llama: never)", neox="implemented")
    gpt_j_tied: bool = option(
        False,
        "one LayerNorm for both parallel branches",
        choices=(False,),
        neox="accepted",
        why="the parallel residual has a LayerNorm per branch, as GPT-NeoX-20B and Pythia",
    )
    output_layer_parallelism: str = option(
        "column", "tensor-parallel split of the output layer", choices=("column",), neox="accepted"
    )

    def __post_init__(self):
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
