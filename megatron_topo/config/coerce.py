"""A config value checked against its field's annotation and converted: numbers keep the literal
the user wrote (``1e400`` and ``1e-400`` are refused rather than read as inf or 0, ``5e8`` names
an integer, ``1e-400`` does not), other scripts' digits are refused, a string field keeps
``0755`` as written."""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
import typing
from typing import Any

from .options import ConfigError, _Float, _fmt, _Int, _kind, _short, _strip_optional, _type_name


def plain(value):
    """YAML's remembered-text ints/floats as plain ones, through lists and mappings."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def coerce(value, tp, where: str):
    """Check ``value`` against the annotation ``tp``; return it converted (ints to floats etc.)."""
    optional = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    base = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed; expected {_type_name(base)}")
    if base is Any:  # free-form (GPT-NeoX's attention_config): plain Python values, checked elsewhere
        return plain(value)
    origin = typing.get_origin(base)
    bad = ConfigError(f"{where}: expected {_type_name(base)}, got {_kind(value)} {_short(value)}")
    if dataclasses.is_dataclass(base):
        if not isinstance(value, dict):
            raise bad
        return value  # merged field by field by the caller
    if origin in (list, tuple):
        (arg,) = typing.get_args(base)
        if isinstance(value, str) and arg is str:
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad
        return [coerce(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
    if base is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if base is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            _not_overflowed(float(value), getattr(value, "text", None), where)  # 1e400: the literal quoted
        if isinstance(value, float) and value.is_integer() and names_an_integer(getattr(value, "text", None)):
            return int(value)
        if isinstance(value, str):  # "5e8" quoted in JSON/YAML (DeepSpeed files do this)
            _ascii_number(value, where, base)
            text = value.strip()  # '_' only between digits, as Python's int() and float() say ("1_" is not 1)
            if re.fullmatch(r"[-+]?[0-9]+(?:_[0-9]+)*", text):
                if len(text) > 1000:  # int() refuses over 4,300 digits; no count or size has this many
                    raise ConfigError(f"{where}: an integer of {len(text):,} digits; expected {_type_name(base)}")
                return int(text.replace("_", ""))
            try:
                f = float(text)
            except ValueError:
                raise bad from None
            _not_overflowed(f, text, where)
            if math.isfinite(f) and f.is_integer() and names_an_integer(text):
                return int(f)
        raise bad
    if base is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            try:
                return _not_underflowed(float(value), getattr(value, "text", None), where)
            except OverflowError:  # an integer past float's range (hundreds of digits)
                raise ConfigError(f"{where}: {_fmt(value)} is too large; expected {_type_name(base)}") from None
        if isinstance(value, str):  # e.g. 1_000.5 or "6e-4" quoted
            _ascii_number(value, where, base)
            try:
                f = float(value)
            except ValueError:
                raise bad from None
            return _not_underflowed(f, value.strip(), where)
        raise bad
    if base is str:
        if isinstance(value, (_Int, _Float)):  # a path such as 0755 or 1e3 stays as written
            return value.text
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad
    return value


def _ascii_number(value: str, where: str, base) -> None:
    """A number written as text in a config value is ASCII: other scripts' digits (``٣``, ``１``)
    and Unicode spaces (a no-break space), which Python's float() reads, are refused."""
    from ..cli import ascii_number

    if not ascii_number(value):
        raise ConfigError(
            f"{where}: {_short(value)} is not written in ASCII; expected {_type_name(base)} "
            f"in the digits 0-9 (e.g. {'3, 5e8' if base is int else '0.1, 6e-4'})"
        )


def _not_overflowed(f: float, text, where: str) -> None:
    """Refuse ``f`` = inf read from a finite literal ``text`` (``1e400``), quoting the literal."""
    if math.isinf(f) and text and not any(w in str(text).lower() for w in ("inf", "nan")):
        raise ConfigError(  # 1e400 (also 1e99999999999999999999, past even Decimal's exponents)
            f"{where}: {str(text).strip()} is beyond the largest float (about 1.8e308) and would be read as "
            f"{'-' if f < 0 else ''}inf; a finite number is needed"
        )


def _not_underflowed(f: float, text, where: str) -> float:
    """``f``, unless its literal ``text`` names a number other than 0 that a float reads as 0
    (``1e-400``) or a finite number that a float reads as inf (``1e400``): refused, rather than a
    value the user did not write (or a bound's "got 0" / "got inf")."""
    _not_overflowed(f, text, where)
    if f == 0 and text:
        try:
            d = decimal.Decimal(str(text).strip().replace("_", ""))
        except decimal.InvalidOperation:
            return f
        if d.is_finite() and d != 0:
            raise ConfigError(
                f"{where}: {text} is below the smallest float (about 5e-324) and would be read as 0; "
                f"write 0 if zero is meant"
            )
    return f


def names_an_integer(text) -> bool:
    """Whether a float literal's text (None: no text kept) is an integer as written: ``5e8`` and
    ``2.0`` are; ``1e-400`` (0.0 once read: it underflows) and ``1.0000000000000000001`` are not."""
    if text is None:
        return True
    try:
        d = decimal.Decimal(str(text).strip().replace("_", ""))
    except decimal.InvalidOperation:
        return True  # .inf and friends: float's own checks refuse them
    return not d.is_finite() or d == d.to_integral_value()
