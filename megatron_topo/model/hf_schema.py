"""The fields of a HuggingFace ``config.json`` and weight index that we read, validated before use
(issue 29): each bad field is one line naming the file and the field (``config.json: hidden_size:
expected an integer >= 1, got str 'abc'``), and every file an index names is resolved inside the
model folder (no absolute path, no ``..``, no symlink out, no FIFO or device).

Only the fields' types and bounds are checked here; which values the model builder supports is
decided by its reader (config.hf_config.model_keys_from_hf)."""

from __future__ import annotations

import json
import math
import os

from ..config.options import ConfigError
from ..error_lines import brief
from ..safe_files import MIB, excerpt, inside, read_small_text

CONFIG_CAP = 4 * MIB
INDEX_CAP = 64 * MIB  # a 20B model's index is about 60 KB

REQUIRED_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
OPTIONAL_INTS = ("max_position_embeddings", "intermediate_size", "num_key_value_heads")
OPTIONAL_FLOATS = (
    "rotary_pct",
    "partial_rotary_factor",
    "rotary_emb_base",
    "rope_theta",
    "layer_norm_eps",
    "rms_norm_eps",
)
OPTIONAL_BOOLS = ("use_parallel_residual", "tie_word_embeddings", "attention_bias")
OPTIONAL_STRS = ("model_type", "hidden_act")
BOUNDS = {"rotary_pct": (0.0, 1.0), "partial_rotary_factor": (0.0, 1.0)}
INT_MAX = 2**31 - 1
# the ModelConfig key each HF field sets: its schema bounds are checked here, so that a value out of
# them is refused naming the file and the HF field (not "layernorm_epsilon must lie in (0, 1], got 2")
OURS = {
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
    "intermediate_size": "intermediate_size",
    "num_key_value_heads": "num_kv_heads",
    "layer_norm_eps": "layernorm_epsilon",
    "rms_norm_eps": "layernorm_epsilon",
    "rotary_emb_base": "rotary_emb_base",
    "rope_theta": "rotary_emb_base",
}


def _show(v) -> str:
    return f"{type(v).__name__} {excerpt(v) if isinstance(v, str) else repr(v)[:40]}"


class _Repeated(Exception):
    """A key given twice in one JSON object (json keeps the last silently)."""


def _pairs(pairs: list) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Repeated(k, out[k], v)
        out[k] = v
    return out


def _load_json(path: str, cap: int, what: str):
    """The JSON in ``path`` (at most ``cap`` bytes); a key given twice in one object is refused,
    naming the key (json would keep the last value without a word)."""
    text = read_small_text(path, cap, ConfigError)
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except _Repeated as e:
        k, first, last = e.args
        raise ConfigError(
            f"{path}: key '{brief(k)}' is given twice ({_show(first)}, then {_show(last)}); state each key once"
        ) from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON ({str(e).splitlines()[0][:100]}); is it the {what}?") from None


def read_config(folder: str) -> dict:
    """The folder's config.json, size-capped, every field we read checked."""
    p = inside(folder, "config.json", os.path.join(folder, "config.json"), ConfigError, link_roots(folder))
    hf = _load_json(p, CONFIG_CAP, "HuggingFace config")
    if not isinstance(hf, dict):
        raise ConfigError(f"{p}: not a HuggingFace config (the top level is not an object)")
    check_config(hf, p)
    return hf


def check_config(hf: dict, where: str) -> None:
    for k in REQUIRED_INTS:
        if k not in hf:
            raise ConfigError(f"{where}: {k}: missing; a HuggingFace model config states it")
    for k in REQUIRED_INTS + OPTIONAL_INTS:
        if k in hf and hf[k] is not None:
            v = hf[k]
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= INT_MAX:
                raise ConfigError(f"{where}: {k}: expected an integer in [1, {INT_MAX}], got {_show(v)}")
    for k in OPTIONAL_FLOATS:
        if k in hf and hf[k] is not None:
            v = hf[k]
            lo, hi = BOUNDS.get(k, (0.0, math.inf))
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or not lo <= v <= hi
                or (k not in BOUNDS and v <= 0)
            ):
                rng = f"in [{lo:g}, {hi:g}]" if k in BOUNDS else "> 0"
                raise ConfigError(f"{where}: {k}: expected a finite number {rng}, got {_show(v)}")
    _check_schema_bounds(hf, where)
    for k in OPTIONAL_BOOLS:
        if k in hf and not isinstance(hf[k], bool):
            raise ConfigError(f"{where}: {k}: expected true or false, got {_show(hf[k])}")
    for k in OPTIONAL_STRS:
        if k in hf and not isinstance(hf[k], str):
            raise ConfigError(f"{where}: {k}: expected a string, got {_show(hf[k])}")
    for k in ("rope_parameters", "rope_scaling"):
        if hf.get(k) is not None and not isinstance(hf[k], dict):
            raise ConfigError(f"{where}: {k}: expected an object, got {_show(hf[k])}")
    if hf["hidden_size"] % hf["num_attention_heads"]:
        raise ConfigError(
            f"{where}: hidden_size {hf['hidden_size']} is not a multiple of num_attention_heads "
            f"{hf['num_attention_heads']}"
        )


def _check_schema_bounds(hf: dict, where: str) -> None:
    """Each numeric HF field inside the bounds of the ModelConfig key it sets (:data:`OURS`)."""
    import dataclasses

    from ..config.schema_model import ModelConfig

    fields = {f.name: f.metadata for f in dataclasses.fields(ModelConfig)}
    for k, ours in OURS.items():
        v = hf.get(k)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or ours not in fields:
            continue
        meta = fields[ours]
        lo, lo_open = (meta["ge"], False) if meta.get("ge") is not None else (meta.get("gt"), True)
        hi, hi_open = (meta["le"], False) if meta.get("le") is not None else (meta.get("lt"), True)
        low = lo is not None and (v <= lo if lo_open else v < lo)
        high = hi is not None and (v >= hi if hi_open else v > hi)
        if low or high:
            lo_s, hi_s = ("-inf" if lo is None else f"{lo:g}"), ("inf" if hi is None else f"{hi:g}")
            span = f"{'(' if lo_open else '['}{lo_s}, {hi_s}{')' if hi_open else ']'}"
            raise ConfigError(f"{where}: {k}: {_show(v)} is outside {span}, the range of {ours} it sets")


def link_roots(folder: str) -> list:
    """Where the files of ``folder`` may link to besides itself: a HuggingFace hub cache snapshot
    (``models--X/snapshots/REV``) links each file into ``models--X/blobs``."""
    real = os.path.realpath(folder)
    if os.path.basename(os.path.dirname(real)) == "snapshots":
        return [os.path.join(os.path.dirname(os.path.dirname(real)), "blobs")]
    return []


def read_weight_map(folder: str, index: str) -> dict:
    """``{tensor name: path}`` from the index file ``index`` in ``folder``; every file it names is a
    regular file inside ``folder``."""
    p = inside(folder, index, os.path.join(folder, index), ConfigError, link_roots(folder))
    data = _load_json(p, INDEX_CAP, "weight index")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object with a weight_map, got {type(data).__name__}")
    wm = data.get("weight_map")
    if wm is None:
        raise ConfigError(f"{p}: weight_map: missing; the index must map each tensor name to its file")
    if not isinstance(wm, dict) or not wm:
        raise ConfigError(f"{p}: weight_map: expected a non-empty object of tensor name -> file, got {_show(wm)}")
    files: dict = {}
    out = {}
    for name, f in wm.items():
        if not isinstance(f, str):
            raise ConfigError(f"{p}: weight_map[{excerpt(name)}]: expected a file name, got {_show(f)}")
        if f not in files:
            files[f] = inside(folder, f, f"{p}: weight_map[{excerpt(name)}]", ConfigError, link_roots(folder))
        out[name] = f
    return out
