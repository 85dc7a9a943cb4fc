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


def load_hf_into_engine(engine, path: str, weights=None) -> None:
    """Fill every unit's master shard ``[lo, hi)`` from the HF weights (fp32), fresh optimizer
    state, then publish the working weights. Reads only the parameters overlapping this rank's
    range of each unit. ``weights``: another reader with HF names (a GPT-NeoX checkpoint's)."""
    w = weights if weights is not None else HFWeights(path)
    by_ours = _our_to_hf_names(w, getattr(engine.module, "cfg", None))
    names = {id(p): n for n, p in engine.module.named_parameters()}
    missing = [names[id(s.param)] for u in engine.units for s in u.specs if names[id(s.param)] not in by_ours]
    if missing:
        raise ConfigError(
            f"{path}: the HF weights lack {len(missing)} of the model's tensors (first: "
            f"{missing[0]}); is it a GPT-NeoX checkpoint of this shape?"
        )
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        master = torch.zeros(hi - lo, dtype=torch.float32)
        for s in u.specs:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if a >= b:
                continue
            name = names[id(s.param)]
            t = w.get(by_ours[name])
            if tuple(t.shape) != tuple(s.shape):
                raise ConfigError(
                    f"{path}: tensor {by_ours[name]} has shape {tuple(t.shape)}, the model's {name} is {tuple(s.shape)}"
                )
            master[a - lo : b - lo] = t.reshape(-1)[a - s.offset : b - s.offset].float()
            del t
        dev = engine.optimizer.params[i].device
        engine.optimizer.load_shard_state(i, master.to(dev), None, None, None)
    engine.republish()


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
    for i, u in enumerate(engine.units):
        lo, hi = u.optim_range
        st = offline.unit_state_range(sp, meta, i, lo, hi, files, keys=("master",))
        engine.optimizer.load_shard_state(i, st["master"].to(engine.optimizer.params[i].device), None, None, None)
    engine.republish()
    return meta["trainer"]


def load_neox_into_engine(engine, path: str, num_layers: int) -> None:
    """The checkpoint's weights into every unit's master shard (each rank reads only its ranges)."""
    load_hf_into_engine(engine, path, weights=NeoxWeights(path, num_layers))
