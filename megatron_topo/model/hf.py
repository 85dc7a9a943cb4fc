"""Name and config mapping between our GPT-NeoX and HuggingFace ``GPTNeoXForCausalLM``."""
from __future__ import annotations

from ..config import ModelConfig


def to_hf_key(name: str, head_name: str = "embed_out") -> str:
    """``head_name``: ``embed_out`` (the published GPT-NeoX checkpoints; transformers 5 renames it
    on load) or ``lm_head`` (transformers >= 5 module name)."""
    if name.startswith("head.embed_out."):
        return head_name + name[len("head.embed_out"):]
    if name.startswith("head.final_layer_norm."):
        return "gpt_neox." + name[len("head."):]
    return "gpt_neox." + name


def from_hf_key(name: str) -> str:
    if name.startswith("embed_out.") or name.startswith("lm_head."):
        return "head.embed_out." + name.split(".", 1)[1]
    name = name[len("gpt_neox."):] if name.startswith("gpt_neox.") else name
    if name.startswith("final_layer_norm."):
        return "head." + name
    return name


def to_hf_state_dict(state: dict, head_name: str = "embed_out") -> dict:
    return {to_hf_key(k, head_name): v for k, v in state.items()}


def hf_head_name(hf_model) -> str:
    """The output projection's name in an instantiated HF model."""
    return "lm_head" if hasattr(hf_model, "lm_head") else "embed_out"


def hf_config_kwargs(cfg: ModelConfig) -> dict:
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
