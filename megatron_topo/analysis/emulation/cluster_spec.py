"""``ClusterSpec``: the shape of an emulated cluster (nodes x GPUs x GCDs), its link rates and
latencies, and where each rank and package sits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from megatron_topo.error_lines import brief

from .netns import EmulationError
from .rates import format_rate

# the emulated cluster's shape (one /24 per node, one address per GPU package), its links' MTU
# (Linux's range for a veth) and how long a run may be given: the bounds of the tools' flags
MAX_NODES, MAX_GPUS_PER_NODE, MAX_GCDS_PER_GPU = 254, 253, 8
MIN_MTU, MAX_MTU = 68, 65535
MAX_TIMEOUT_S = 7 * 86400.0
MIN_TIMEOUT_S = 1.0  # a run stopped before it can start measures nothing (as the config's timeouts)


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    gcds_per_gpu: int
    inter_node_bps: Optional[int] = None  # None: unshaped
    intra_node_bps: Optional[int] = None
    intra_gpu_bps: Optional[int] = None  # shapes the package namespace's loopback
    latency_inter_us: float = 0.0  # netem delay (needs sch_netem in the kernel)
    latency_intra_us: float = 0.0
    mtu: int = 1500
    subnet: str = "10.213"

    def __post_init__(self):
        for k in ("nodes", "gpus_per_node", "gcds_per_gpu"):
            if getattr(self, k) < 1:
                raise EmulationError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(self, k)}")
        if self.nodes > 254 or self.gpus_per_node > 253:
            raise EmulationError("at most 254 nodes and 253 GPUs per node (one /24 per node)")
        # ASCII digits only (re's \d takes '٣'), and 10.x's second octet 0..255
        m = re.fullmatch(r"(10\.([0-9]{1,3})|172\.(1[6-9]|2[0-9]|3[01])|192\.168)", self.subnet)
        if not m or (m.group(2) is not None and int(m.group(2)) > 255):
            raise EmulationError(
                f"--subnet '{brief(self.subnet, 40)}' must be the first two octets of a private /16 "
                f"(10.0-10.255, 172.16-172.31 or 192.168)"
            )

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node * self.gcds_per_gpu

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def placement(self, rank: int) -> tuple[int, int, int]:
        """(node, gpu, gcd) of a rank; node-major as in megatron_topo.topology."""
        gcd = rank % self.gcds_per_gpu
        gpu = (rank // self.gcds_per_gpu) % self.gpus_per_node
        return rank // self.ranks_per_node, gpu, gcd

    def packages(self) -> list[tuple[int, int]]:
        return [(n, g) for n in range(self.nodes) for g in range(self.gpus_per_node)]

    def address(self, node: int, gpu: int) -> str:
        return f"{self.subnet}.{node}.{gpu + 1}"

    def node_subnet(self, node: int) -> str:
        return f"{self.subnet}.{node}.0/24"

    def describe(self) -> str:
        lat = ""
        if self.latency_inter_us or self.latency_intra_us:
            lat = f", latency intra-node {self.latency_intra_us:g} us, inter-node {self.latency_inter_us:g} us"
        return (
            f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s) x {self.gcds_per_gpu} GCD(s) = "
            f"{self.world_size} ranks; per package: intra-gpu {format_rate(self.intra_gpu_bps)} (loopback), "
            f"intra-node {format_rate(self.intra_node_bps)}, inter-node {format_rate(self.inter_node_bps)} "
            f"(each direction){lat}"
        )
