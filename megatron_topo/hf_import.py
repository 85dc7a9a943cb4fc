"""Start training from a HuggingFace GPT-NeoX / Pythia / Llama / Mistral folder, or from a checkpoint's
weights only.

``finetune_from: PATH`` (or ``load: PATH`` naming an HF folder) gives GPT-NeoX's ``finetune``
semantics: the weights are loaded, the step is 0 and the optimizer starts fresh. The weights go
into the sharded engine one unit (one layer) at a time: each rank reads from the files only the
parameters overlapping its own optimizer range ``[lo, hi)`` of each unit, so no rank holds more
than one unit of the model, under any plan and world size. safetensors files are opened lazily
(one tensor at a time); ``pytorch_model.bin`` files are memory-mapped (``torch.load(mmap=True)``).

The model architecture is read from the HF ``config.json``: keys the config files do not set are
taken from it, keys they set must agree (one line naming every differing key).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .config import ConfigError
from .model import hf_schema

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


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
    return bool(path) and os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")) and any(
        os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES)


def read_hf_config(path: str) -> dict:
    return hf_schema.read_config(path)  # size-capped, every field we read checked (one line per problem)


def model_keys_from_hf(hf: dict, where: str) -> dict:
    """Our ModelConfig keys describing the HF model (its spec's mapping); ConfigError for what we
    cannot build."""
    from .model.spec import spec_for_hf

    hf_schema.check_config(hf, where)  # types and bounds of the fields we read: one line naming the field
    spec = spec_for_hf(hf)
    if spec is None:
        raise ConfigError(f"{where}: model_type {hf.get('model_type')!r} is not supported; GPT-NeoX (gpt_neox: "
                          f"GPT-NeoX-20B, Pythia), Llama (llama) and Mistral (mistral) checkpoints load")
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
        return [f"the model config differs from {where} ({'; '.join(diff)}); drop those keys to take the HF "
                f"model's values, or set them to match"]
    return []


class HFWeights:
    """Read single tensors by HF name from safetensors (lazily) or pytorch_model.bin (mmap) files."""

    def __init__(self, path: str):
        self.path = path
        self._where: dict[str, str] = {}
        self._open: dict = {}
        for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            p = os.path.join(path, index)
            if os.path.isfile(p):
                self._where = hf_schema.read_weight_map(path, index)  # files inside `path` only
                break
        else:
            for name in ("model.safetensors", "pytorch_model.bin"):
                p = os.path.join(path, name)
                if os.path.isfile(p):
                    for k in self._keys(name):
                        self._where[k] = name
                    break

    def _file(self, name: str):
        if name not in self._open:
            p = os.path.join(self.path, name)
            try:
                if name.endswith(".safetensors"):
                    from safetensors import safe_open

                    self._open[name] = safe_open(p, framework="pt")
                else:
                    self._open[name] = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
            except Exception as e:  # a damaged or foreign file: one line
                raise ConfigError(f"{p}: cannot read the weights ({type(e).__name__}: {e})") from None
        return self._open[name]

    def _keys(self, name: str):
        f = self._file(name)
        return list(f.keys())

    def names(self) -> list:
        return list(self._where)

    def get(self, hf_name: str) -> torch.Tensor:
        f = self._file(self._where[hf_name])
        return f.get_tensor(hf_name) if hasattr(f, "get_tensor") else f[hf_name]


def _our_to_hf_names(weights: HFWeights, cfg=None) -> dict:
    from .model.hf import from_hf_key

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
        raise ConfigError(f"{path}: the HF weights lack {len(missing)} of the model's tensors (first: "
                          f"{missing[0]}); is it a GPT-NeoX checkpoint of this shape?")
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
                raise ConfigError(f"{path}: tensor {by_ours[name]} has shape {tuple(t.shape)}, the model's "
                                  f"{name} is {tuple(s.shape)}")
            master[a - lo:b - lo] = t.reshape(-1)[a - s.offset:b - s.offset].float()
            del t
        dev = engine.optimizer.params[i].device
        engine.optimizer.load_shard_state(i, master.to(dev), None, None, None)
    engine.republish()


def load_weights_only(engine, path: str, config=None) -> dict:
    """One of our checkpoints' master weights (any plan / world size), no optimizer state;
    returns the checkpoint's trainer state (for no_load_optim, which keeps its step). With
    ``config`` (the run's Config), architecture keys that differ from the saved ones are refused
    unless ``checkpoint.finetune_architecture_change`` is set, and rank files without a recorded
    SHA-256 unless ``checkpoint.load_unverified`` is."""
    from .zero_topo import checkpoint as ckpt

    c = config.checkpoint if config is not None else None
    sp = ckpt.resolve(path)
    meta = ckpt.read_meta(sp, unverified=bool(c and c.load_unverified))
    ckpt.check_compatible(sp, meta, ckpt.unit_table(engine))
    diff = ckpt.architecture_diff(sp, meta, config) if config is not None else []
    if diff and not c.finetune_architecture_change:
        raise ckpt.CheckpointError(
            f"{sp}: the model config differs from the checkpoint's ({'; '.join(diff)}); its weights were trained for "
            f"the saved architecture: use the saved values, or set finetune_architecture_change: true to "
            f"change it deliberately")
    files: dict = {}
    masters = ({"master": ckpt.unit_state_range(sp, meta, i, lo, hi, files, keys=("master",))["master"], "step": None}
               for i, (lo, hi) in enumerate(engine.shard_ranges()))  # one unit read at a time
    engine.load_state_dict({"shards": masters})  # the weights alone: a fresh optimizer
    return meta.trainer
