"""An HF model folder's ``config.json`` as our model keys (``finetune_from`` / ``load`` naming an HF
GPT-NeoX / Pythia / Llama / Mistral folder).

The model architecture is read from the HF ``config.json``: keys the config files do not set are
taken from it, keys they set must agree (one line naming every differing key). Only the JSON is
read here (``model/hf_schema.py`` checks its fields, the model spec maps them); the weights are
read by ``model/hf_weights.py`` and loaded into the engine by ``zero_topo/checkpoint/weights.py``.
"""

from __future__ import annotations

import os
from typing import Optional

from ..model import hf_schema
from ..safe_files import excerpt
from .options import ConfigError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def weights_source(cfg) -> Optional[str]:
    """Where a run takes its starting weights without resuming: ``finetune_from``, or ``load`` when
    it is an HF folder or ``finetune`` / ``no_load_optim`` is set; None: resume from ``load`` (or fresh)."""
    c = cfg.checkpoint
    if c.finetune_from:
        return c.finetune_from
    if c.load and (is_hf_folder(c.load) or c.finetune or c.no_load_optim):  # (a GPT-NeoX one: finetune)
        return c.load
    return None


def is_hf_folder(path: Optional[str]) -> bool:
    """A folder with an HF ``config.json`` and weights (safetensors or bin, single or sharded)."""
    return (
        bool(path)
        and os.path.isdir(path)
        and os.path.isfile(os.path.join(path, "config.json"))
        and any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES)
    )


def read_hf_config(path: str) -> dict:
    return hf_schema.read_config(path)  # size-capped, every field we read checked (one line per problem)


def model_keys_from_hf(hf: dict, where: str) -> dict:
    """Our ModelConfig keys describing the HF model (its spec's mapping); ConfigError for what we
    cannot build."""
    from ..model.spec import spec_for_hf

    hf_schema.check_config(hf, where)  # types and bounds of the fields we read: one line naming the field
    spec = spec_for_hf(hf)
    if spec is None:
        raise ConfigError(
            f"{where}: model_type {excerpt(hf.get('model_type'))} is not supported; GPT-NeoX (gpt_neox: "
            f"GPT-NeoX-20B, Pythia), Llama (llama) and Mistral (mistral) checkpoints load"
        )
    return spec.model_keys_from_hf(hf, where)


def apply_hf_model_config(cfg, path: str, origin: dict) -> list:
    """Take the model keys the config files leave unset from the HF config; return one problem
    line naming every key that the files set to another value (empty: they agree)."""
    where = os.path.join(path, "config.json")
    keys = model_keys_from_hf(read_hf_config(path), where)
    m = cfg.model
    diff = []
    for k, v in keys.items():
        if k in origin:
            if getattr(m, k) != v:
                diff.append(f"{k}: config {getattr(m, k)} vs HF {v}")
        else:
            setattr(m, k, v)
    if "seq_length" not in origin:
        m.seq_length = min(m.seq_length, m.max_position_embeddings)
    if diff:
        return [
            f"the model config differs from {where} ({'; '.join(diff)}); drop those keys to take the HF "
            f"model's values, or set them to match"
        ]
    return []
