"""An HF model folder's ``config.json`` as our model keys (``finetune_from`` / ``load`` naming an HF
GPT-NeoX / Pythia / Llama / Mistral folder).

The model architecture is read from the HF ``config.json``: keys the config files do not set are
taken from it, keys they set must agree (one line naming every differing key). Only the JSON is
read here (``model/hf_schema.py`` checks its fields, the model spec maps them); the weights are
read by ``model/hf_weights.py`` and loaded into the engine by ``zero_topo/checkpoint/weights.py``.
"""

from __future__ import annotations

import math
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
    """A folder with an HF ``config.json`` and weights (safetensors or bin, single or sharded).
    The names decide, not what they are: a ``config.json`` or weight file that is a device, a FIFO
    or a dangling link makes it an HF folder whose reader then names that file and what it is
    (not a checkpoint folder lacking a meta.json)."""
    return (
        bool(path)
        and os.path.isdir(path)
        and os.path.lexists(os.path.join(path, "config.json"))
        and any(os.path.lexists(os.path.join(path, f)) for f in WEIGHT_FILES)
    )


def read_hf_config(path: str) -> dict:
    return hf_schema.read_config(path)  # size-capped, every field we read checked (one line per problem)


# the names transformers versions give one setting: a config.json may carry several (they must agree)
_SAME_SETTING = {
    "rotary_pct": ("rotary_pct", "partial_rotary_factor", "rope_parameters.partial_rotary_factor"),
    "rotary_emb_base": ("rotary_emb_base", "rope_theta", "rope_parameters.rope_theta"),
}


def _check_same_setting(hf: dict, where: str) -> None:
    """One line when a config.json gives one setting two different values under its names
    (``rotary_pct`` 0.25 and ``partial_rotary_factor`` 0.5): which one the model uses is not ours to guess."""
    for ours, names in _SAME_SETTING.items():
        given = []
        for name in names:
            obj, *rest = name.split(".")
            v = hf.get(obj) if not rest else (hf.get(obj) if isinstance(hf.get(obj), dict) else {}).get(rest[0])
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                given.append((name, v))
        if any(not math.isclose(float(v), float(given[0][1]), rel_tol=1e-9) for _, v in given[1:]):
            shown = ", ".join(f"{n} {excerpt(v) if isinstance(v, str) else v}" for n, v in given)
            raise ConfigError(f"{where}: {shown} name one setting ({ours}) with different values; make them agree")


def model_keys_from_hf(hf: dict, where: str) -> dict:
    """Our ModelConfig keys describing the HF model (its spec's mapping); ConfigError for what we
    cannot build."""
    from ..model.spec import spec_for_hf

    hf_schema.check_config(hf, where)  # types and bounds of the fields we read: one line naming the field
    _check_same_setting(hf, where)
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
