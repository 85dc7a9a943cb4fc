"""Weights only into an engine, a fresh optimizer: one of our checkpoints (any plan / world size),
an HF folder or a GPT-NeoX checkpoint's layer files (``finetune`` semantics: step 0).

The weights go into the sharded engine one unit (one layer) at a time: each rank reads from the
files only the parameters overlapping its own optimizer range ``[lo, hi)`` of each unit, so no
rank holds more than one unit of the model, under any plan and world size.
"""

from __future__ import annotations

import torch

from ...config.options import ConfigError
from ...model.hf_weights import HFWeights
from ...model.neox_checkpoint import NeoxWeights
from . import live, offline, storage


def _our_to_hf_names(weights: HFWeights, cfg=None) -> dict:
    from ...model.hf import from_hf_key

    out = {}
    for k in weights.names():
        out.setdefault(from_hf_key(k, cfg), k)
    return out


def load_hf_into_engine(engine, path: str, model_cfg, weights=None) -> None:
    """Fill every unit's master shard ``[lo, hi)`` from the HF weights (fp32), fresh optimizer
    state, then publish the working weights. Reads only the parameters overlapping this rank's
    range of each unit. ``model_cfg``: the model's ModelConfig (how HF names map to ours);
    ``weights``: another reader with HF names (a GPT-NeoX checkpoint's)."""
    w = weights if weights is not None else HFWeights(path)
    by_ours = _our_to_hf_names(w, model_cfg)
    table = engine.unit_table()
    missing = [name for u in table for name, *_ in u["params"] if name not in by_ours]
    if missing:
        raise ConfigError(
            f"{path}: the HF weights lack {len(missing)} of the model's tensors (first: "
            f"{missing[0]}); is it a GPT-NeoX checkpoint of this shape?"
        )

    def master(params, lo: int, hi: int) -> torch.Tensor:
        out = torch.zeros(hi - lo, dtype=torch.float32)
        for name, offset, numel, shape in params:
            a, b = max(lo, offset), min(hi, offset + numel)
            if a >= b:
                continue
            t = w.get(by_ours[name])
            if tuple(t.shape) != tuple(shape):
                raise ConfigError(
                    f"{path}: tensor {by_ours[name]} has shape {tuple(t.shape)}, the model's {name} is {tuple(shape)}"
                )
            out[a - lo : b - lo] = t.reshape(-1)[a - offset : b - offset].float()
            del t
        return out

    shards = (
        {"master": master(u["params"], lo, hi), "step": None} for u, (lo, hi) in zip(table, engine.shard_ranges())
    )  # one unit read at a time
    engine.load_state_dict({"shards": shards})  # the weights alone: a fresh optimizer


def load_weights_only(engine, path: str, config=None, read_config=None) -> dict:
    """One of our checkpoints' master weights (any plan / world size), no optimizer state;
    returns the checkpoint's trainer state (for no_load_optim, which keeps its step). With
    ``config`` (the run's Config), architecture keys that differ from the saved ones are refused
    unless ``checkpoint.finetune_architecture_change`` is set, and rank files without a recorded
    SHA-256 unless ``checkpoint.load_unverified`` is; ``read_config`` (the caller's
    ``config.load_config`` on one file) parses the saved config.yml for that comparison."""
    c = config.checkpoint if config is not None else None
    sp = storage.resolve(path)
    meta = storage.read_meta(sp, unverified=bool(c and c.load_unverified))
    live.check_compatible(sp, meta, live.unit_table(engine))
    diff = live.architecture_diff(sp, meta, config, read_config) if config is not None else []
    if diff and not c.finetune_architecture_change:
        raise storage.CheckpointError(
            f"{sp}: the model config differs from the checkpoint's ({'; '.join(diff)}); its weights were trained for "
            f"the saved architecture: use the saved values, or set finetune_architecture_change: true to "
            f"change it deliberately"
        )
    files: dict = {}
    masters = (
        {"master": offline.unit_state_range(sp, meta, i, lo, hi, files, keys=("master",))["master"], "step": None}
        for i, (lo, hi) in enumerate(engine.shard_ranges())
    )  # one unit read at a time
    engine.load_state_dict({"shards": masters})  # the weights alone: a fresh optimizer
    return meta.trainer


def load_neox_into_engine(engine, path: str, model_cfg) -> None:
    """The checkpoint's weights into every unit's master shard (each rank reads only its ranges)."""
    load_hf_into_engine(engine, path, model_cfg, weights=NeoxWeights(path, model_cfg.num_layers))
