"""The training precision a config asks for: ``precision`` (GPT-NeoX's key) or, unset, DeepSpeed's
``fp16`` / ``bf16`` blocks. Its own module so that schema.py and deepspeed.py (which schema
imports) both use it without importing each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import ConfigError

if TYPE_CHECKING:
    from .schema import TrainConfig


def resolve_precision(t: TrainConfig) -> str:
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
