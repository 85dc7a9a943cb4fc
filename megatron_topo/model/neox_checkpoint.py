"""GPT-NeoX / DeepSpeed checkpoint folders given to ``load`` or ``finetune_from``.

A GPT-NeoX save folder holds a ``latest`` file naming ``global_stepN/``, which holds DeepSpeed's files:
``layer_XX-model_YY-model_states.pt`` (one per pipeline layer XX and model-parallel rank YY: the
layer's ``state_dict``), ``mp_rank_YY_model_states.pt`` (the engine's client state; with
``pipe_parallel_size`` 0 also the whole model under ``module``, keys ``sequential.XX.*``) and
``zero_pp_rank_*`` optimizer shards. GPT-NeoX's layer list: 0 the embedding, 1 a parameter-free
step, 2..L+1 the transformer layers, L+2 another parameter-free step, L+3 the final LayerNorm,
L+4 the output layer (``final_linear``; the embedding again when tied).

The weights of a model-parallel-1 checkpoint are imported with GPT-NeoX's ``finetune`` semantics
(step 0, a fresh optimizer: DeepSpeed's optimizer shards are another format), through the same
unit-by-unit loader as an HF folder (``zero_topo/checkpoint/weights.py``); the architecture comes
from the config files (the checkpoint carries no config) and every tensor's shape is checked.
Other checkpoints are refused with the conversion path: GPT-NeoX's
``tools/ckpts/convert_neox_to_hf.py`` (merges model-parallel shards) and then ``finetune_from`` the
HF folder.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Optional

import torch

from ..config.options import ConfigError
from ..safe_files import excerpt, not_linked_out, read_small_text

MAX_LATEST_BYTES = 4096  # GPT-NeoX's latest holds a step folder's name

LAYER_FILE = re.compile(r"layer_([0-9]+)-model_([0-9]+)-model_states\.pt$")
MP_FILE = re.compile(r"mp_rank_([0-9]+)_model_states\.pt$")
TRANSFORMER_KEYS = tuple(
    f"{m}.{p}"
    for m in (
        "input_layernorm",
        "attention.query_key_value",
        "attention.dense",
        "post_attention_layernorm",
        "mlp.dense_h_to_4h",
        "mlp.dense_4h_to_h",
    )
    for p in ("weight", "bias")
)
BUFFERS = ("attention.rotary_emb.inv_freq", "attention.bias", "attention.masked_bias")  # not weights
CONVERT = (
    "convert it with GPT-NeoX's tools/ckpts/convert_neox_to_hf.py (it merges model-parallel shards) and "
    "give the HF folder as finetune_from"
)


def _model_files(d: str) -> list:
    try:
        names = os.listdir(d)
    except OSError:
        return []
    if "meta.json" in names:  # one of ours
        return []
    return sorted(n for n in names if LAYER_FILE.match(n) or MP_FILE.match(n))


def step_folder(path: Optional[str]) -> Optional[str]:
    """The ``global_stepN`` folder of the GPT-NeoX/DeepSpeed checkpoint at ``path`` (its save folder,
    whose ``latest`` names the step, or the step folder itself); None when it is not one."""
    if not path or not os.path.isdir(path):
        return None
    if _model_files(path):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest) and not os.path.islink(latest):
        try:  # a step name: a few bytes (a huge, non-blocking-unreadable or non-UTF-8 file is not one)
            name = read_small_text(latest, MAX_LATEST_BYTES, ValueError).strip()
        except ValueError:
            return None
        d = os.path.join(path, name)
        if name and os.sep not in name and "\0" not in name and name not in (".", "..") and _model_files(d):
            return d
    return None


def is_neox_checkpoint(path: Optional[str]) -> bool:
    return step_folder(path) is not None


def _linked_out(path: str, d: str) -> Optional[str]:
    """A line when the step folder ``d`` that ``path``'s ``latest`` names is a symbolic link out of
    ``path`` (as our checkpoints' reader refuses one); None when it lies inside."""
    if os.path.realpath(d) == os.path.realpath(path):
        return None
    try:
        not_linked_out(path, os.path.basename(d), os.path.join(path, "latest"), ConfigError)
    except ConfigError as e:
        return str(e)
    return None


def check(path: str, key: str, finetune: bool) -> list:
    """Problem lines for a GPT-NeoX checkpoint given as ``key`` (load / finetune_from)."""
    d = step_folder(path)
    out_of = _linked_out(path, d)
    if out_of:
        return [f"{key} {path}: {out_of}"]
    files = _model_files(d)
    ranks = {int(m.group(2)) for m in map(LAYER_FILE.match, files) if m} | {
        int(m.group(1)) for m in map(MP_FILE.match, files) if m
    }
    out = []
    if len(ranks) > 1:
        out.append(
            f"{key} {path}: a GPT-NeoX checkpoint of model-parallel size {len(ranks)} ({os.path.basename(d)}); "
            f"only model-parallel-1 checkpoints are imported here: {CONVERT}"
        )
    elif key == "load" and not finetune:
        out.append(
            f"load {path}: a GPT-NeoX/DeepSpeed checkpoint ({os.path.basename(d)}); its optimizer state "
            f"(DeepSpeed's zero_pp_rank files) cannot be resumed here: set finetune: true (or give it as "
            f"finetune_from) to start from its weights at step 0 with a fresh optimizer"
        )
    return out


class NeoxWeights:
    """The tensors of a model-parallel-1 GPT-NeoX checkpoint under HF GPT-NeoX names (``names``,
    ``get``, as model.hf_weights.HFWeights), read one layer file at a time (memory-mapped)."""

    def __init__(self, path: str, num_layers: int):
        self.path = path
        self.dir = step_folder(path)
        if self.dir is None:
            raise ConfigError(f"{path}: not a GPT-NeoX checkpoint (no layer_XX-model_00 or mp_rank_00 model files)")
        out_of = _linked_out(path, self.dir)
        if out_of:
            raise ConfigError(out_of)
        self.num_layers = num_layers
        self._where: dict = {}  # HF name -> (file, key in that file)
        self._cache: tuple = (None, None)
        files = _model_files(self.dir)
        layers = sorted((int(m.group(1)), n) for n, m in ((n, LAYER_FILE.match(n)) for n in files) if m)
        if layers:
            for idx, name in layers:
                for k in self._load(name):
                    self._add(idx, k, (name, k))
        else:
            sd = self._load("mp_rank_00_model_states.pt")
            for full in sd:
                m = re.match(r"(?:module\.)?sequential\.([0-9]+)\.(.+)$", full)
                if m is None:
                    raise ConfigError(
                        f"{self.dir}/mp_rank_00_model_states.pt: tensor {excerpt(full)} is not a GPT-NeoX "
                        f"layer tensor (sequential.N.*); {CONVERT}"
                    )
                self._add(int(m.group(1)), m.group(2), ("mp_rank_00_model_states.pt", full))

    def _add(self, idx: int, key: str, where: tuple) -> None:
        L = self.num_layers
        if any(key.endswith(b) for b in BUFFERS):
            return
        if idx == 0 and key == "word_embeddings.weight":
            hf = "gpt_neox.embed_in.weight"
        elif 2 <= idx < L + 2 and key in TRANSFORMER_KEYS:
            hf = f"gpt_neox.layers.{idx - 2}.{key}"
        elif idx == L + 3 and key in ("norm.weight", "norm.bias"):
            hf = "gpt_neox.final_layer_norm." + key.split(".")[-1]
        elif idx == L + 4 and key == "final_linear.weight":
            hf = "embed_out.weight"
        elif idx == L + 4 and key == "word_embeddings.weight":
            return  # tied output layer: the embedding itself
        else:
            raise ConfigError(
                f"{self.path}: GPT-NeoX layer {idx} tensor {excerpt(key)} has no place in this model "
                f"(num_layers {L}, GPT-NeoX's gelu MLP with biases, rotary positions, LayerNorm); "
                f"check num_layers and the architecture keys, or {CONVERT}"
            )
        self._where[hf] = where

    def _load(self, name: str) -> dict:
        if self._cache[0] != name:
            p = os.path.join(self.dir, name)
            not_linked_out(self.dir, name, p, ConfigError)  # a link within the folder is read, as HF's reader does
            try:
                st = os.stat(p)  # listed by _model_files: a FIFO or device would block torch.load for good
            except OSError as e:
                raise ConfigError(f"{p}: cannot be read ({e.strerror or e}); {CONVERT}") from None
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{p}: not a regular file (a FIFO, device or folder); refusing to read it; {CONVERT}")
            try:
                obj = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
            except Exception as e:  # a damaged file, or pickled objects beyond tensors: one line
                raise ConfigError(
                    f"{p}: cannot read it as a GPT-NeoX state dict ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]}); {CONVERT}"
                ) from None
            if name.startswith("mp_rank_"):
                obj = obj.get("module") if isinstance(obj, dict) else None
                if not isinstance(obj, dict):
                    raise ConfigError(f"{p}: holds no model weights (module); {CONVERT}")
            if not isinstance(obj, dict):
                raise ConfigError(f"{p}: not a GPT-NeoX layer state dict; {CONVERT}")
            self._cache = (name, obj)
        return self._cache[1]

    def names(self) -> list:
        return list(self._where)

    def get(self, hf_name: str) -> torch.Tensor:
        name, key = self._where[hf_name]
        return self._load(name)[key]
