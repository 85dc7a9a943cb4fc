"""Declaring a config field with its checks, and checking a value against them.

``option(default, doc, ge=, gt=, le=, lt=, choices=, ...)`` puts the bounds, the valid choices and
a one-line doc into the dataclass field's metadata; :func:`_check_declared` checks a value from that
metadata. Also here: the one-line errors, key normalisation, type names and value rendering for
messages, and the checks of single fields that a bound cannot say.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import typing
from dataclasses import field
from typing import Any, Optional

from ..safe_files import excerpt
from ..zero_topo.plan_space import BLOCK_SIZE_RULE, is_block_size

MAX_INT = 2**63 - 1  # an integer key without its own upper bound: what int64 (torch, numpy) holds
MAX_FLOAT = 1e15  # a number key without its own upper bound (far past any rate, size or time it sets)


class ConfigError(ValueError):
    """A bad configuration value; the message is one line meant for the user."""


class ConfigErrors(ConfigError):
    """Several problems of the given files at once: one line each (``problems``)."""

    def __init__(self, problems: list):
        self.problems = list(dict.fromkeys(problems))  # in order, each once
        super().__init__("\n".join(self.problems))


def raise_problems(problems: list) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigErrors(problems)


def option(
    default=dataclasses.MISSING,
    doc: str = "",
    *,
    factory=None,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    choices=None,
    ignore_case: bool = False,
    allow_inf: bool = False,
    length=None,
    why: str = "",
    check=None,
    neox: str = "",
):
    """A config field with its checks: bounds (``ge``/``gt``/``le``/``lt``; on each item of a
    list), ``choices`` (a tuple, or a callable returning one), ``length`` of a list, non-finite
    floats refused unless ``allow_inf``; ``why`` is appended to a choices error; ``check(value)``
    returns an error text or None for rules a bound cannot say. ``neox``: how a GPT-NeoX /
    DeepSpeed key of that name is handled, for the compatibility table (docs/neox_compat.md):
    ``implemented`` (it does what it does there) or ``accepted`` (valid values change nothing
    because they are what this trainer does anyway; others are refused with ``why``)."""
    meta = dict(
        doc=doc,
        ge=ge,
        gt=gt,
        le=le,
        lt=lt,
        choices=choices,
        ignore_case=ignore_case,
        allow_inf=allow_inf,
        length=length,
        why=why,
        check=check,
        neox=neox,
    )
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _norm(key: str) -> str:
    return str(key).replace("-", "_")


# ------------------------------------------------------------------------------ type names and values
def _strip_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _type_name(tp) -> str:
    tp = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (arg, *_) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(arg)}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "a boolean (true/false)", str: "a string"}.get(tp, str(tp))


class _Int(int):
    """An int read from YAML that remembers how it was written (``0755`` for a string field)."""

    text = ""


class _Float(float):
    text = ""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def _short(value) -> str:
    """A bounded rendering of a config value for error messages (never walks a whole structure)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (_Int, _Float)):
        t = value.text
        return t if len(t) <= 40 else f"{t[:12]}...({len(t):,} characters)"
    return _REPR.repr(value)


def _kind(value) -> str:
    return {_Int: "int", _Float: "float"}.get(type(value), type(value).__name__)


def _scalar(v) -> bool:
    return isinstance(v, (bool, int, float)) or v is None


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and len(str(abs(v))) > 24:  # a 400-digit value: its start and its size
        s = str(v)
        return f"{s[:12]}...({len(s.lstrip('-')):,} digits)"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


# ------------------------------------------------------------------------------ checking declared fields
def _bounds_text(meta) -> str:
    ge, gt, le, lt = (meta.get(k) for k in ("ge", "gt", "le", "lt"))
    lo = ("[", ge) if ge is not None else ("(", gt) if gt is not None else None
    hi = (le, "]") if le is not None else (lt, ")") if lt is not None else None
    if lo and hi:
        return f"lie in {lo[0]}{_fmt(lo[1])}, {_fmt(hi[0])}{hi[1]}"
    if lo:
        return f"be {'>=' if lo[0] == '[' else '>'} {_fmt(lo[1])}"
    if hi:
        return f"be {'<=' if hi[1] == ']' else '<'} {_fmt(hi[0])}"
    return ""


def _check_declared(path: str, value, meta) -> None:
    if value is None or not meta:
        return
    if isinstance(value, list):
        n = meta.get("length")
        if n is not None and len(value) != n:
            raise ConfigError(f"{path} must have {n} values, got {len(value)}: {_short(value)}")
        for i, v in enumerate(value):
            _check_declared(f"{path}[{i}]", v, {**meta, "length": None})
        return
    if isinstance(value, float) and not math.isfinite(value) and not meta.get("allow_inf"):
        raise ConfigError(f"{path} must be a finite number, got {value}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ge, gt, le, lt = (meta.get(k) for k in ("ge", "gt", "le", "lt"))
        if (
            (ge is not None and not value >= ge)
            or (gt is not None and not value > gt)
            or (le is not None and not value <= le)
            or (lt is not None and not value < lt)
        ):
            raise ConfigError(f"{path} must {_bounds_text(meta)}, got {_fmt(value)}")
        cap = MAX_INT if isinstance(value, int) else MAX_FLOAT
        if le is None and lt is None and not meta.get("choices") and value > cap:
            # no upper bound declared: still one the arithmetic can hold (int64; floats: see MAX_FLOAT)
            raise ConfigError(
                f"{path} must be <= {cap if isinstance(cap, int) else format(cap, 'g')}, got {_fmt(value)}"
            )
    choices = meta.get("choices")
    if choices is not None:
        choices = tuple(choices() if callable(choices) else choices)
        fold = (lambda x: x.lower() if isinstance(x, str) else x) if meta.get("ignore_case") else (lambda x: x)
        if fold(value) not in [fold(c) for c in choices] or (isinstance(value, bool) != isinstance(choices[0], bool)):
            why = f" ({meta['why']})" if meta.get("why") else ""
            shown = excerpt(value, 60) if isinstance(value, str) else _fmt(value) if _scalar(value) else _short(value)
            raise ConfigError(f"{path}={shown} is not valid; use one of {', '.join(_fmt(c) for c in choices)}{why}")
    check = meta.get("check")
    if check is not None:
        err = check(value)
        if err:
            shown = excerpt(value, 60) if isinstance(value, str) else _short(value)
            raise ConfigError(f"{path}={shown} is not valid; {err}")


def _collect(problems: Optional[list], fn, *args) -> None:
    """Run ``fn``; with a ``problems`` list, a ConfigError is recorded there instead of raised."""
    if problems is None:
        fn(*args)
        return
    try:
        fn(*args)
    except ConfigErrors as e:
        problems.extend(e.problems)
    except ConfigError as e:
        problems.append(str(e))


# ------------------------------------------------------------------------------ single-field checks
def _check_split(split: str) -> Optional[str]:
    from ..cli import ascii_number, split_items

    expect = "up to 3 non-negative numbers with a positive sum, e.g. 949,50,1"
    parts, why = split_items(split, ",/")  # 969,,30: the empty share named (skipping it would shift the test share)
    if why:
        return f"{why}; expected {expect}"
    try:
        nums = [float(s) for s in parts if ascii_number(s)]  # ASCII digits only ('١٠٠' is not 100)
    except ValueError:
        nums = []
    if (
        len(nums) != len(parts)
        or not nums
        or len(nums) > 3
        or any(not (math.isfinite(x) and x >= 0) for x in nums)
        or sum(nums) <= 0
    ):
        return "expected up to 3 non-negative numbers with a positive sum, e.g. 949,50,1"
    return None


def _check_block(b: int) -> Optional[str]:
    return None if is_block_size(b) else f"use {BLOCK_SIZE_RULE}"


def _check_attention_config(v) -> Optional[str]:
    """GPT-NeoX's ``[[["global"], N], ...]`` (a count may be ``"all"``: the pattern repeats over
    every layer), or the expanded list of one type per layer: only global (dense causal)
    attention, which is also what ``flash`` computes; the layer count is checked against
    num_layers separately."""
    bad = 'expected [[[types], count], ...] with types global or flash, e.g. [[["global"], 12]]'
    if not isinstance(v, list) or not v:
        return bad
    if all(isinstance(item, str) for item in v):  # already expanded, as GPT-NeoX accepts it
        v = [[v, 1]]
    for item in v:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], list)
            and item[0]
            and (item[1] == "all" or isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 1)
        ):
            return bad
        other = [t for t in item[0] if t not in ("global", "flash")]
        if other:
            return (
                f"attention type {other[0]!r} is not supported; only dense causal attention is implemented "
                f"(global, or flash: the same attention, which scaled_dot_product_attention runs as a "
                f"flash kernel where it can)"
            )
    return None


def attention_config_layers(v, num_layers: Optional[int] = None) -> Optional[int]:
    """Layers a valid attention_config covers; ``None`` when a pattern with count ``"all"`` does not
    divide ``num_layers`` (GPT-NeoX asserts it does), ``num_layers`` when it does."""
    if all(isinstance(item, str) for item in v):
        return len(v)
    for types, n in v:
        if n == "all":  # GPT-NeoX: this pattern fills every layer (and ends the list)
            return num_layers if num_layers is not None and num_layers % len(types) == 0 else None
    return sum(len(types) * n for types, n in v)


def _tokenizer_names() -> tuple:
    from ..data.tokenizer import TOKENIZERS

    return tuple(TOKENIZERS)
