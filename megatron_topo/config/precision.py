"""The training precision a config asks for: ``precision`` (GPT-NeoX's key) or, unset, DeepSpeed's
``fp16`` / ``bf16`` blocks. Its own module so that schema.py and deepspeed.py (which schema
imports) both use it without importing each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import ConfigError

if TYPE_CHECKING:
    from .schema import TrainConfig


def _asked_by_blocks(t: TrainConfig) -> list:
    """(flag as written, precision) for every fp16/bf16 block setting that asks for a precision."""
    out = []
    if t.fp16.type == "bfloat16":
        out.append(("fp16.type: bfloat16", "bf16"))
    elif t.fp16.type == "fp16":
        out.append(("fp16.type: fp16", "fp16"))
    half = "bf16" if t.fp16.type == "bfloat16" else "fp16"  # GPT-NeoX: the fp16 block with type bfloat16 is bf16
    if t.fp16.enabled:
        out.append(("fp16.enabled: true", half))
    if t.fp16.fp16:
        out.append(("fp16.fp16: true", half))
    if t.bf16.enabled:
        out.append(("bf16.enabled: true", "bf16"))
    return out


def resolve_precision(t: TrainConfig) -> str:
    """``precision`` when given (every fp16/bf16 flag set true must ask for the same one; a flag set
    false asks for nothing: ``precision: fp16`` with ``fp16.enabled: false`` is fp16), else the
    blocks' flags."""
    if t.precision is not None:
        p = t.precision.lower()
        if p in ("float32", "fp32"):
            p = "fp32"
        elif p in ("bfloat16", "bf16"):
            p = "bf16"
        elif p in ("float16", "fp16", "half"):
            p = "fp16"
        else:
            raise ConfigError(f"precision: '{t.precision}' is not valid; use one of fp32, bf16, fp16")
        asked = _asked_by_blocks(t)
        other = [flag for flag, q in asked if q != p]
        if other:  # a flag set true asks for another precision: refused, never silently overridden
            raise ConfigError(
                f"precision: {t.precision} contradicts {', '.join(other)}; give one of them, or make them "
                f"agree (a flag set to false asks for nothing)"
            )
        return p
    if t.fp16.type == "bfloat16":  # GPT-NeoX: fp16.type bfloat16 is bf16, whatever fp16.enabled says
        return "bf16"
    fp16 = t.fp16.enabled or bool(t.fp16.fp16) or t.fp16.type == "fp16"
    if fp16 and t.bf16.enabled:
        raise ConfigError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if fp16:
        return "fp16"
    if t.bf16.enabled:
        return "bf16"
    return "fp32"
