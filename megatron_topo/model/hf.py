"""Name and config mapping between our GPT-NeoX and HuggingFace ``GPTNeoXForCausalLM``."""
from __future__ import annotations

import os

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


# ------------------------------------------------------------------------------ tokenizer export
PAD_NAMES = ("<|padding|>", "<pad>", "[PAD]")


def tokenizer_from_config(cfg, tokenizer_type=None, vocab_file=None, merge_file=None):
    """Our tokenizer as the checkpoint's config names it (``data.tokenizer_type`` / ``vocab_file`` /
    ``merge_file``), each overridable (files moved since training). Raises DataError."""
    from ..data import build_tokenizer

    data = cfg.data
    ttype = tokenizer_type or data.tokenizer_type
    vfile = vocab_file or getattr(data, "vocab_file", None)
    mfile = merge_file or getattr(data, "merge_file", None)
    char_vocab = cfg.model.vocab_size if str(ttype).lower() == "charleveltokenizer" else None
    return build_tokenizer(ttype, vfile, char_vocab, mfile)


def hf_special_ids(tok) -> dict:
    """bos/eos/pad for the export: GPT-NeoX uses its EOD token as both bos and eos; pad is the
    tokenizer's padding token where it has one (``<|padding|>`` in GPT-NeoX-20B's and
    HFGPT2Tokenizer's vocabularies), else EOD."""
    backend = tok.hf_backend()
    eod = tok.eod
    pad = next((i for i in map(backend.token_to_id, PAD_NAMES) if i is not None), eod)
    return {"bos_token_id": eod, "eos_token_id": eod, "pad_token_id": pad}


def write_hf_tokenizer(tok, out_dir: str, model_vocab_size: int, max_length: int) -> dict:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json
    (and the tokenizer's own source files: vocab.json + merges.txt, or tokenizer.model) so that
    ``AutoTokenizer.from_pretrained(out_dir)`` gives our ids and ``generate`` stops at our EOD.
    Returns the special ids (also to be put into config.json). Raises DataError if the tokenizer
    has more ids than the model."""
    import json
    import shutil

    from ..data import DataError

    if tok.vocab_size > model_vocab_size:
        raise DataError(f"the tokenizer ({tok.name}) has {tok.vocab_size} ids but the model only "
                        f"{model_vocab_size}")
    backend = tok.hf_backend()
    ids = hf_special_ids(tok)
    names = {k: backend.id_to_token(v) for k, v in ids.items()}
    backend.save(os.path.join(out_dir, "tokenizer.json"))
    special = {"bos_token": names["bos_token_id"], "eos_token": names["eos_token_id"],
               "pad_token": names["pad_token_id"]}
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
            "model_max_length": int(max_length), "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False,
            "split_special_tokens": bool(tok.split_special_tokens),
            "megatron_topo_tokenizer_type": tok.name}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(conf, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2, ensure_ascii=False)
    gen = {**ids, "_from_model_config": False}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    if tok.name in ("GPT2BPETokenizer", "HFGPT2Tokenizer") and tok.merge_file:
        shutil.copyfile(tok.vocab_file, os.path.join(out_dir, "vocab.json"))
        shutil.copyfile(tok.merge_file, os.path.join(out_dir, "merges.txt"))
    elif tok.name == "SPMTokenizer":
        shutil.copyfile(tok.vocab_file, os.path.join(out_dir, "tokenizer.model"))
    return ids
