"""Loading a config: files merged in order into a ``Config`` (each key checked against its
annotation, unknown keys named with the closest valid one, a key set in two files refused),
``--set`` overrides, GPT-NeoX / DeepSpeed aliases resolved, the vocabulary size derived, every
problem reported at once."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Optional

from ..error_lines import brief, first_line
from ..safe_files import excerpt
from .checks import mentions, reset_out_of_bounds, validate
from .coerce import coerce
from .deepspeed import AUTO, BATCH_KEYS, HF_AUTO_KEYS, apply_scheduler, resolve_autos
from .neox import REJECTED_KEYS
from .neox_keys import NEOX_UNSUPPORTED
from .options import ConfigError, _collect, _fmt, _norm, _strip_optional, raise_problems
from .schema import _BLOCK_SECTIONS, MAX_VOCAB, Config, _key_index, _section_type
from .yaml_io import load_yaml, parse_set

REPORTED = "reported:"  # origin key prefix of a key whose value the merge refused (one line said so)


def _is_text_key(parts: list) -> bool:
    """Whether the dotted key ``parts`` (GPT-NeoX flat or nested) is a declared string field."""
    index = _key_index()
    key = _norm(parts[0])
    if key not in index:
        return False
    sec = index[key]
    obj_type, rest = (_section_type(sec), parts[1:]) if sec in _BLOCK_SECTIONS else (_section_type(sec), parts)
    tp = None
    for p in rest:
        if not dataclasses.is_dataclass(obj_type):
            return False
        tp = typing.get_type_hints(obj_type).get(_norm(p))
        if tp is None:
            return False
        obj_type = _strip_optional(tp)
    return tp is not None and _strip_optional(tp) is str


def _suggest(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# ------------------------------------------------------------------------------- merging
def _merge_block(obj, data: dict, where: str, origin: dict, src: str, problems: Optional[list] = None):
    """Merge ``data`` into dataclass instance ``obj``; ``origin`` remembers which file set each key;
    with ``problems``, every bad key is recorded there and the others are still merged."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    for raw_key, value in data.items():
        _collect(problems, _merge_key, obj, raw_key, value, where, origin, src, problems)


def _merge_key(obj, raw_key, value, where: str, origin: dict, src: str, problems: Optional[list]):
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    key = _norm(raw_key)
    path = f"{where}.{key}" if where else key
    if key not in names:
        valid = ", ".join(sorted(names))
        raise ConfigError(f"{src}: unknown key {excerpt(path, 60)}{_suggest(key, names)} (valid: {valid})")
    tp = hints[key]
    base = _strip_optional(tp)
    if isinstance(value, str) and value == "auto" and path in HF_AUTO_KEYS:
        origin.setdefault(AUTO + path, src)  # HF Trainer's "auto": the rest of the config gives the value
        return
    if dataclasses.is_dataclass(base) and isinstance(value, dict):
        child = getattr(obj, key)
        if child is None:
            child = base()
            setattr(obj, key, child)
        _merge_block(child, value, path, origin, src, problems)
        return
    if path in origin:
        raise ConfigError(f"key '{path}' is set in both {origin[path]} and {src}; set it in one file")
    origin[path] = src
    try:
        setattr(obj, key, coerce(value, tp, f"{src}: {path}"))
    except ConfigError:
        origin[REPORTED + path] = src  # reported here: rules that depend on it are not reported on top
        raise


def merge_into(cfg: Config, data: dict, src: str, origin: dict, problems: Optional[list] = None) -> None:
    """Merge one YAML document (GPT-NeoX flat keys + nested blocks) into ``cfg``; with ``problems``,
    every bad key is recorded there (one line each) and the rest is still merged."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the top level must be a mapping of keys, got {type(data).__name__}")
    index = _key_index()
    for raw_key, value in data.items():
        _collect(problems, _merge_top, cfg, index, raw_key, value, src, origin, problems)


def _merge_top(cfg, index, raw_key, value, src, origin, problems):
    key = _norm(raw_key)
    if key == "deepspeed_extra_args" and isinstance(value, dict):  # GPT-NeoX hands these to DeepSpeed as top-level
        for k, v in value.items():  # keys and refuses one set elsewhere as well
            if any(p == _norm(k) or p.startswith(_norm(k) + ".") for p in origin):
                raise ConfigError(f"{src}: deepspeed_extra_args.{brief(k)} is also set elsewhere; give it once")
            _collect(problems, _merge_top, cfg, index, k, v, src, origin, problems)
        return
    if key not in index:
        why = REJECTED_KEYS.get(key) or NEOX_UNSUPPORTED.get(key)
        if why:  # declared by GPT-NeoX / DeepSpeed: the reason, not a look-alike key
            raise ConfigError(f"{src}: GPT-NeoX key {excerpt(raw_key, 60)} is not supported here: {why}")
        raise ConfigError(f"{src}: unknown key {excerpt(raw_key, 60)}{_suggest(key, index)}")
    sec = index[key]
    if key == "zero_optimization" and isinstance(value, bool):  # DeepSpeed's old form: true is stage 1
        value = {"stage": 1 if value else 0}
    if sec in _BLOCK_SECTIONS:
        block = getattr(cfg, sec)
        if block is None:
            block = _section_type(sec)()
            setattr(cfg, sec, block)
        _merge_block(block, value, sec, origin, src, problems)
    else:
        _merge_block(getattr(cfg, sec), {key: value}, "", origin, src, problems)


def _arch_problems(model_cfg) -> list:
    """The model spec's own rules for ``model_cfg`` (one line each; empty: it builds)."""
    from ..model.spec import spec_for

    return spec_for(model_cfg).check(model_cfg)


_KINDS = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (list, "list"), (bytes, "bytes"))


def load_config(paths: list[str], overrides: Optional[list[str]] = None, require: bool = True) -> Config:
    """Merge config files in order (YAML: GPT-NeoX; ``.json``: a DeepSpeed config, the same
    top-level keys), then ``--set`` overrides (which may replace earlier values). Every problem
    of the files is reported at once (ConfigErrors, one line each). ``require``: GPT-NeoX's
    required keys must be given (training, dry runs); False for reading a ``system:`` file alone."""
    cfg = Config()
    origin: dict = {}
    problems: list = []
    unreadable = False  # a file that could not be read: its keys are unknown, so none is called missing
    for p in paths:
        try:
            data = load_yaml(p)
        except ConfigError as e:
            problems.append(str(e))
            unreadable = True
            continue
        if data is None or data == {}:  # would silently give the default model
            problems.append(
                f"{p}: the file sets no keys (it is empty or only comments); give the config it was meant to hold"
            )
            unreadable = True  # its keys are unknown: none is called missing (one line)
            continue
        if not isinstance(data, dict):  # a list, a string: no keys at all, so none is called missing either
            kind = next((n for t, n in _KINDS if isinstance(data, t)), type(data).__name__)  # YAML's int is _Int
            problems.append(f"{p}: the top level must be a mapping of keys, got {kind}")
            unreadable = True
            continue
        _collect(problems, merge_into, cfg, data, p, origin, problems)
    for expr in overrides or []:
        try:
            data = parse_set(expr, _is_text_key)
        except ConfigError as e:
            problems.append(str(e))
            continue
        # overrides win over files: forget who set the keys they touch
        for path in _paths(data):
            origin.pop(path, None)
            origin.pop(path.split(".", 1)[-1], None)
        _collect(problems, merge_into, cfg, data, f"--set {brief(expr)}", origin, problems)
    reported = frozenset(p[len(REPORTED) :] for p in origin if p.startswith(REPORTED))
    out_of_bounds, bad_fields = reset_out_of_bounds(cfg)  # reported here; nothing is derived from them
    problems.extend(out_of_bounds)
    merged = len(problems)
    cfg.auto_values.update({k: None for k in BATCH_KEYS if AUTO + k in origin and k not in origin})
    _collect(problems, resolve_autos, cfg, origin)
    _resolve_aliases(cfg, origin, problems)
    cfg.batch_given = frozenset(k for k in BATCH_KEYS if k in origin and getattr(cfg.train, k) is not None)
    d = cfg.data
    if "tokenizer_type" not in origin and (d.vocab_file or d.merge_file):
        d.tokenizer_type = "GPT2BPETokenizer"  # GPT-NeoX's default, for the GPT-2 files a config names
    c = cfg.checkpoint
    hf_path = c.finetune_from or c.load
    from_hf = False
    if hf_path and not problems:
        from .hf_config import apply_hf_model_config, is_hf_folder

        if is_hf_folder(hf_path):  # the architecture comes from (and must agree with) its config.json
            from_hf = True
            try:
                problems.extend(apply_hf_model_config(cfg, hf_path, origin))
            except ConfigError as e:
                problems.append(str(e))
            origin.setdefault("vocab_size", hf_path)
    require = require and not unreadable
    if require:
        _collect(problems, check_required, origin, from_hf)
    from ..model.neox_checkpoint import check as check_neox
    from ..model.neox_checkpoint import is_neox_checkpoint

    for key in ("finetune_from", "load"):  # a GPT-NeoX/DeepSpeed checkpoint: imported or refused with the way
        path = getattr(c, key)
        if path and not from_hf and is_neox_checkpoint(path):
            problems.extend(check_neox(path, key, c.finetune))
    reported |= bad_fields
    problems[merged:] = [line for line in problems[merged:] if not mentions(line, reported)]  # one line per value
    validate(cfg, problems, arch_problems=_arch_problems, reported=reported)
    if not problems:
        _collect(problems, resolve_vocab_size, cfg, "vocab_size" in origin, "tokenizer_type" in origin)
    raise_problems(problems)
    cfg.no_effect = no_effect_settings(cfg, origin)
    cfg.origin = dict(origin)
    from ..data.tokenizer import MERGE_FILE_IGNORED

    if cfg.data.merge_file and str(cfg.data.tokenizer_type).lower() in {t.lower() for t in MERGE_FILE_IGNORED}:
        cfg.no_effect = sorted(cfg.no_effect + [f"merge_file={cfg.data.merge_file}"])  # GPT-NeoX ignores it too
    return cfg


# GPT-NeoX's required keys (NeoXArgs.validate_values) and seq_length, which it has no default for
# either (its data pipeline fails without it): no config-file default may build a model nobody asked for
REQUIRED_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "seq_length")
HF_SUPPLIED = REQUIRED_KEYS[:4]  # what an HF folder's config.json gives (finetune_from / load)


def check_required(origin: dict, from_hf: bool = False) -> None:
    """One line naming every required key the files and ``--set`` leave unset."""
    missing = [k for k in REQUIRED_KEYS if k not in origin and not (from_hf and k in HF_SUPPLIED)]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (GPT-NeoX has no "
            f"default for {'it' if len(missing) == 1 else 'them'}); set "
            f"{'it' if len(missing) == 1 else 'them'} in a config file or with --set"
        )


def no_effect_settings(cfg: Config, origin: dict) -> list[str]:
    """``key=value`` of every setting the files or ``--set`` gave a non-default value although it
    changes nothing here (fields marked ``neox="accepted"``): the trainer prints them in one
    note line at start, so no accepted key is a silent no-op."""
    index, out = _key_index(), []
    for path in origin:
        parts = path.split(".")
        obj = cfg if parts[0] in _BLOCK_SECTIONS else getattr(cfg, index.get(parts[0], ""), None)
        for name in parts[:-1]:  # nested blocks: zero_optimization.*, fp16.* (of the train section)
            obj = getattr(obj, name, None)
        if obj is None or not dataclasses.is_dataclass(obj):
            continue
        f = next((f for f in dataclasses.fields(obj) if f.name == parts[-1]), None)
        if f is None or f.metadata.get("neox") != "accepted":
            continue
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        value = getattr(obj, f.name)
        if value != default:
            out.append(f"{path}={value}")
    return sorted(out)


def _resolve_aliases(cfg: Config, origin: dict, problems: list) -> None:
    """GPT-NeoX / DeepSpeed spellings of our settings: keep_last_n_checkpoints,
    optimizer.params.weight_decay, the DeepSpeed scheduler block."""
    c, t = cfg.checkpoint, cfg.train
    if cfg.zero_optimization is not None and cfg.zero_topo.preset == "ddp" and "zero_topo.preset" in origin:
        problems.append(
            f"zero_optimization and zero_topo.preset=ddp (set in {origin['zero_topo.preset']}) both "
            f"choose the sharding; keep one of them"
        )
    if c.keep_last_n_checkpoints is not None:
        if "keep_last" in origin and c.keep_last != c.keep_last_n_checkpoints:
            problems.append(
                f"keep_last {c.keep_last} and keep_last_n_checkpoints {c.keep_last_n_checkpoints} "
                f"are the same setting; give one"
            )
        c.keep_last = c.keep_last_n_checkpoints
        c.keep_last_n_checkpoints = None
    wd = t.optimizer.params.weight_decay
    if wd is not None:
        if "weight_decay" in origin and wd != t.weight_decay:
            problems.append(
                f"weight_decay {_fmt(t.weight_decay)} and optimizer.params.weight_decay {_fmt(wd)} are "
                f"the same setting; give one"
            )
        t.weight_decay = wd
        t.optimizer.params.weight_decay = None
    apply_scheduler(cfg, origin, problems)


def padded_vocab_size(n: int, divisible_by: int, model_parallel: int = 1) -> int:
    """GPT-NeoX's rule: the tokenizer's size padded up to a multiple of divisible_by x tensor parallel."""
    m = divisible_by * model_parallel
    return -(-n // m) * m


def resolve_vocab_size(cfg: Config, explicit: bool, tokenizer_explicit: bool) -> None:
    """``vocab_size`` unset: the tokenizer's size padded like GPT-NeoX. Set: it must hold the ids
    of the tokenizer the config names by its files (``vocab_file``) when that can be built."""
    from ..data import DataError, build_tokenizer

    d, m = cfg.data, cfg.model
    if explicit and not (tokenizer_explicit and d.vocab_file):  # file-less tokenizers: toy data may use fewer ids
        return
    char_vocab = m.vocab_size if explicit and str(d.tokenizer_type).lower() == "charleveltokenizer" else None
    try:
        tok = build_tokenizer(d.tokenizer_type, d.vocab_file, char_vocab, d.merge_file)
    except (DataError, OSError, ValueError) as e:
        if explicit:
            return  # the data pipeline reports an unusable tokenizer when it needs one
        raise ConfigError(
            f"vocab_size is unset and the tokenizer ({d.tokenizer_type}) cannot be built to derive it: "
            f"{first_line(e)}; fix the tokenizer files or set vocab_size"
        ) from None
    n = tok.vocab_size
    if not explicit:
        m.vocab_size = padded_vocab_size(n, m.make_vocab_size_divisible_by, cfg.neox.model_parallel_size)
        if m.vocab_size > MAX_VOCAB:
            raise ConfigError(f"the tokenizer's {n} ids pad to {m.vocab_size}, over {MAX_VOCAB}")
    elif m.vocab_size < n:
        raise ConfigError(
            f"vocab_size {m.vocab_size} is smaller than the tokenizer's {n} ids ({d.tokenizer_type}); "
            f"use at least {n}, e.g. {padded_vocab_size(n, m.make_vocab_size_divisible_by)} "
            f"(or drop vocab_size: it is then derived like GPT-NeoX's)"
        )


def _paths(d: dict, prefix: str = ""):
    """Every dotted path in ``d``, prefixes included (a dict given to a scalar key names the key)."""
    for k, v in d.items():
        p = f"{prefix}{_norm(k)}"
        yield p
        if isinstance(v, dict):
            yield from _paths(v, p + ".")
