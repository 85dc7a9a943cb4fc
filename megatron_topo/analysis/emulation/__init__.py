"""Emulated multi-node clusters on one Linux machine (network namespaces + veth + tc).

See ``tools/emulate_cluster.py`` for the command line and ``docs/benchmark.md`` for how the
strategy benchmark uses it.
"""

from .cluster import Cluster, ClusterSpec, EmulationError, check_privileges, cleanup_leftovers, summarize
from .launch import Interrupted, LaunchResult, launch
from .rates import RateError, format_rate, parse_latency_pair, parse_latency_us, parse_rate

__all__ = [
    "Cluster",
    "ClusterSpec",
    "EmulationError",
    "Interrupted",
    "LaunchResult",
    "RateError",
    "check_privileges",
    "cleanup_leftovers",
    "format_rate",
    "launch",
    "parse_latency_pair",
    "parse_latency_us",
    "parse_rate",
    "summarize",
]
