"""Link rates: parsing, formatting and the defaults of the emulated cluster.

Rates are bits per second internally (what ``tc`` takes). Accepted spellings: ``400mbit``,
``1.6gbit``, ``200000kbit``, ``5e8bit``, ``50MB/s``, ``1GB/s`` (bytes per second, SI), ``unshaped``
(no shaping on that level; also ``none``, ``off`` or ``0``). Note that ``tc`` itself reads ``mbps``
as *megabytes* per second; to avoid that trap the ``*bps`` spellings are refused here. An empty or
blank value (an unset shell variable), digits other than ASCII 0-9, and a space inside the number
(``2 00mbit``) are refused naming the flag: "no limit" is said explicitly.

Default rates keep Frontier's per-device ratios (docs/design.md §3.5: GCD pair 200 GB/s, GPU-GPU in a node
50 GB/s, one 25 GB/s NIC per MI250X) scaled by 1/1000, which puts the inter-node link at
200 Mbit/s: a scale at which 8 ranks on 2 CPU cores spend more time waiting for ZeRO-3's
inter-node traffic than computing (see docs/benchmark.md for the measurements behind it).
"""

from __future__ import annotations

import math
import re

FRONTIER_GBS = {"intra_gpu": 200.0, "intra_node": 50.0, "inter_node": 25.0}
SCALE = 1.0 / 1000.0  # emulated bytes/s per Frontier byte/s

DEFAULT_INTER_NODE = "200mbit"  # 25 GB/s / 1000
DEFAULT_INTRA_NODE = "400mbit"  # 50 GB/s / 1000
DEFAULT_INTRA_GPU = "unshaped"  # namespace loopback; 200 GB/s / 1000 would be 1.6gbit

# named link profiles (inter-node, intra-node, intra-GPU): Frontier's ratios, and a node whose
# GPUs talk over NVLink/NVSwitch-class links, far faster than the NIC (left unshaped)
PROFILES = {
    "frontier": (DEFAULT_INTER_NODE, DEFAULT_INTRA_NODE, DEFAULT_INTRA_GPU),
    "nvlink": (DEFAULT_INTER_NODE, "unshaped", "unshaped"),
}

_UNITS_BIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_UNITS_BYTE = {"b/s": 8, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9}


class RateError(ValueError):
    pass


RATE_EXAMPLES = "a rate such as 200mbit, 1.6gbit, 25MB/s, or 'unshaped' (no limit)"
LATENCY_EXAMPLES = "a one-way delay such as 50us, 1ms or 0 (none)"
UNSHAPED = ("unshaped", "none", "off", "0")  # the explicit ways to say "no limit"
_NUMBER = r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)"
_SPACED = re.compile(r"[0-9.e][ \t]+[0-9.]|[0-9.][ \t]+e[0-9]")  # "2 00mbit", "1. 5ms", "5 e8bit"


def _checked_text(text, name: str, expect: str) -> str:
    """``text`` lower-cased and stripped, or RateError naming ``name``: empty or blank (an unset
    shell variable is not "no limit"), not ASCII (digits other than 0-9, a no-break space), or a space
    inside the number (``2 00mbit`` is not 200mbit). A space between number and unit is fine."""
    from megatron_topo.cli import ascii_number
    from megatron_topo.error_lines import brief

    s = str(text)
    if not s.strip(" \t\r\n"):
        raise RateError(f"{name} '{brief(s, 40)}' is empty; expected {expect}")
    if not ascii_number(s):
        raise RateError(f"{name} '{brief(s, 40)}' is not written in ASCII (digits 0-9); expected {expect}")
    s = s.strip(" \t\r\n").lower()
    if _SPACED.search(s):
        raise RateError(f"{name} '{brief(text, 40)}' holds a space inside the number; expected {expect}")
    return s


def parse_rate(text: str | float | int | None, name: str = "rate") -> int | None:
    """Bits per second, or None for ``unshaped`` / ``none`` / ``off`` / ``0`` (said explicitly: an
    empty or blank value is refused, naming ``name``, the flag it came from)."""
    from megatron_topo.error_lines import brief

    if text is None:
        return None
    if isinstance(text, (int, float)):
        return None if text <= 0 else int(text)
    s = _checked_text(text, name, RATE_EXAMPLES)
    if s in UNSHAPED:
        return None
    shown = f"{name} '{brief(text, 40)}'"
    if s.endswith("bps"):
        raise RateError(f"{shown}: write bits as 'mbit' or bytes as 'MB/s' ('mbps' is ambiguous)")
    m = re.fullmatch(_NUMBER + r"[ \t]*([a-z/]*)", s)
    if not m:
        raise RateError(f"{shown} is not a rate; expected {RATE_EXAMPLES}")
    num, unit = float(m.group(1)), m.group(2) or "bit"
    if unit in _UNITS_BIT:
        bps = num * _UNITS_BIT[unit]
    elif unit in _UNITS_BYTE:
        bps = num * _UNITS_BYTE[unit]
    else:
        raise RateError(f"{shown}: unknown unit '{unit}'; use bit, kbit, mbit, gbit or B/s, KB/s, MB/s, GB/s")
    if not math.isfinite(bps) or bps < 8000:
        raise RateError(f"{shown} is below 8 kbit/s or not finite")
    return int(bps)


def format_rate(bps: int | None) -> str:
    if bps is None:
        return "unshaped"
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= f:
            return f"{bps / f:g}{unit}"
    return f"{bps}bit"


def parse_latency_us(text: str | float | None, name: str = "latency") -> float:
    """Microseconds from ``50us``, ``1ms``, ``0.2ms`` or a bare number of microseconds; an empty
    or blank value is refused naming ``name`` (``0`` says "no delay")."""
    from megatron_topo.error_lines import brief

    if text is None:
        return 0.0
    s = _checked_text(text, name, LATENCY_EXAMPLES)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)[ \t]*(us|ms|s)?", s)
    if not m:
        raise RateError(f"{name} '{brief(text, 40)}' is not a duration; expected {LATENCY_EXAMPLES}")
    v = float(m.group(1)) * {"us": 1.0, None: 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]
    if not v <= MAX_LATENCY_US:
        raise RateError(f"{name} '{brief(text, 40)}' exceeds {MAX_LATENCY_US / 1e6:g} s (netem's delay, one way)")
    return v


MAX_LATENCY_US = 60e6  # a minute one way: far past any network's; a larger value is a typo


def parse_latency_pair(text: str | None, name: str = "--latency") -> tuple[float, float]:
    """``--latency INTER[,INTRA]``: (inter-node, intra-node) one-way delays in microseconds; one
    value sets the inter-node delay only. An empty value or item, and more than two values, are
    refused (a third was dropped)."""
    from megatron_topo.cli import comma_items
    from megatron_topo.error_lines import brief

    if text is None:
        return 0.0, 0.0
    parts = comma_items(text, name, "INTER[,INTRA] delays such as 50us,10us", error=RateError)
    if len(parts) > 2:
        raise RateError(
            f"{name} '{brief(text, 40)}' gives {len(parts)} values; give INTER[,INTRA] (at most two, e.g. 50us,10us)"
        )
    names = (f"{name} (inter-node)", f"{name} (intra-node)")
    return parse_latency_us(parts[0], names[0]), parse_latency_us(parts[1], names[1]) if len(parts) > 1 else 0.0
