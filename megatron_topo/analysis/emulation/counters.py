"""Wire-byte counters of the emulated cluster: per package (``PackageCounters``), parsed from
``tc -s class show`` (``parse_class_stats``), and totals per link level (``summarize``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class PackageCounters:
    node: int
    gpu: int
    veth_tx_bytes: int = 0
    veth_rx_bytes: int = 0
    lo_tx_bytes: int = 0
    tx_bytes: dict = field(default_factory=dict)  # level -> bytes sent (package egress classes)
    rx_bytes: dict = field(default_factory=dict)  # level -> bytes received (switch-port classes)
    tx_drops: int = 0


_CLASS_RE = re.compile(r"^class htb (\S+) ")
_SENT_RE = re.compile(r"Sent (\d+) bytes \d+ pkts? \(dropped (\d+)")


def parse_class_stats(text: str) -> tuple[dict, int]:
    """``tc -s class show`` text -> ({"intra_node": bytes, "inter_node": bytes}, drops)."""
    out, drops, cur = {}, 0, None
    for line in text.splitlines():
        m = _CLASS_RE.match(line)
        if m:
            cur = {"1:10": "intra_node", "1:20": "inter_node"}.get(m.group(1))
            continue
        m = _SENT_RE.search(line)
        if m and cur:
            out[cur] = int(m.group(1))
            drops += int(m.group(2))
            cur = None
    return out, drops


def summarize(per_package: list[dict]) -> dict:
    """Totals over packages: bytes sent per link level (intra_gpu = loopback) and the busiest NIC."""
    tot = {"intra_gpu": 0, "intra_node": 0, "inter_node": 0}
    busiest = 0
    for p in per_package:
        tot["intra_gpu"] += p["lo_tx_bytes"]
        tot["intra_node"] += p["tx_bytes"].get("intra_node", 0)
        tot["inter_node"] += p["tx_bytes"].get("inter_node", 0)
        busiest = max(busiest, p["tx_bytes"].get("inter_node", 0), p["rx_bytes"].get("inter_node", 0))
    return {"wire_bytes": tot, "busiest_nic_bytes": busiest, "tx_drops": sum(p.get("tx_drops", 0) for p in per_package)}
