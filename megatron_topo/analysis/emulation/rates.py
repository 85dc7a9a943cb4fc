"""Link rates: parsing, formatting and the defaults of the emulated cluster.

Rates are bits per second internally (what ``tc`` takes). Accepted spellings: ``400mbit``,
``1.6gbit``, ``200000kbit``, ``5e8bit``, ``50MB/s``, ``1GB/s`` (bytes per second, SI), ``unshaped``
(no shaping on that level). Note that ``tc`` itself reads ``mbps`` as *megabytes* per second; to
avoid that trap the ``*bps`` spellings are refused here.

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


def parse_rate(text: str | float | int | None) -> int | None:
    """Bits per second, or None for ``unshaped`` / ``none`` / ``0``."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return None if text <= 0 else int(text)
    s = str(text).strip().lower().replace(" ", "")
    if s in ("", "unshaped", "none", "off", "0"):
        return None
    if s.endswith("bps"):
        raise RateError(f"rate '{text}': write bits as 'mbit' or bytes as 'MB/s' ('mbps' is ambiguous)")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)([a-z/]*)", s)
    if not m:
        raise RateError(f"rate '{text}' is not a rate; examples: 200mbit, 1.6gbit, 25MB/s, unshaped")
    num, unit = float(m.group(1)), m.group(2) or "bit"
    if unit in _UNITS_BIT:
        bps = num * _UNITS_BIT[unit]
    elif unit in _UNITS_BYTE:
        bps = num * _UNITS_BYTE[unit]
    else:
        raise RateError(f"rate '{text}': unknown unit '{unit}'; use bit, kbit, mbit, gbit or B/s, KB/s, MB/s, GB/s")
    if not math.isfinite(bps) or bps < 8000:
        raise RateError(f"rate '{text}' is below 8 kbit/s or not finite")
    return int(bps)


def format_rate(bps: int | None) -> str:
    if bps is None:
        return "unshaped"
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= f:
            return f"{bps / f:g}{unit}"
    return f"{bps}bit"


def parse_latency_us(text: str | float | None) -> float:
    """Microseconds from ``50us``, ``1ms``, ``0.2ms`` or a bare number of microseconds."""
    if text is None:
        return 0.0
    s = str(text).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(us|ms|s)?", s)
    if not m:
        raise RateError(f"latency '{text}' is not a duration; examples: 50us, 1ms")
    v = float(m.group(1))
    return v * {"us": 1.0, None: 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]


def parse_latency_pair(text: str | None) -> tuple[float, float]:
    """``--latency INTER[,INTRA]``: (inter-node, intra-node) one-way delays in microseconds; one
    value sets the inter-node delay only. More than two values is refused (a third was dropped)."""
    if text is None:
        return 0.0, 0.0
    parts = str(text).split(",")
    if len(parts) > 2:
        raise RateError(f"latency '{text}' gives {len(parts)} values; give INTER[,INTRA] (at most two, e.g. 50us,10us)")
    return parse_latency_us(parts[0]), parse_latency_us(parts[1]) if len(parts) > 1 else 0.0
