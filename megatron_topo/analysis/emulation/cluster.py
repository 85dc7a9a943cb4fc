"""An emulated multi-node cluster built from Linux network namespaces, veth links and ``tc``.

Layout (nothing is created in the host's own network namespace)::

    namespace {tag}-sw            bridge br0 + one port per GPU package ("the switch")
    namespace {tag}-n{node}g{gpu} one per GPU package: lo + veth0 = {subnet}.{node}.{gpu+1}/16

Every GCD rank of a package runs inside that package's namespace. Ranks of the same package
talk to each other over the shared address, which the kernel delivers through the namespace's
loopback (never the veth: verified by the counters), so the GCD pair is the fastest, unshaped
level (``intra_gpu_bps`` may shape ``lo`` too). Traffic to another package leaves through
``veth0``, whose egress is an HTB qdisc with two classes chosen by destination subnet: one /24
per node, so ``1:10`` (same node) is shaped to ``intra_node_bps`` and ``1:20`` (other nodes: the
package's NIC, one per MI250X as on Frontier) to ``inter_node_bps``. The switch port towards a
package carries the same two classes chosen by *source* subnet, so a package's receive
direction is limited too (a NIC is full duplex: each direction has the rate). Unshaped levels
keep their HTB class at a rate no link here reaches, so bytes per level are counted either way.

The tag is ``mtemu-{pid}-{n}``: a run that was killed leaves namespaces whose pid is dead, which
the next run (or ``cleanup_leftovers()``) removes. Deleting a namespace deletes its veth end (and
the peer with it), its bridge and its qdiscs.

The namespace commands are in ``netns``, the cluster's shape in ``cluster_spec`` and the byte
counters in ``counters``; this module holds ``Cluster`` and re-exports them.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import asdict

from .cluster_spec import ClusterSpec
from .counters import PackageCounters, parse_class_stats, summarize
from .netns import (
    ETC_NETNS,
    PREFIX,
    EmulationError,
    _kill_namespace,
    _run,
    check_privileges,
    cleanup_leftovers,
    list_namespaces,
    namespace_pids,
)

# what the namespace, spec and counter modules declare is re-exported: callers import it from here
__all__ = [
    "BRIDGE",
    "ETC_NETNS",
    "PREFIX",
    "UNLIMITED_BPS",
    "VETH",
    "Cluster",
    "ClusterSpec",
    "EmulationError",
    "PackageCounters",
    "check_privileges",
    "cleanup_leftovers",
    "list_namespaces",
    "namespace_pids",
    "parse_class_stats",
    "summarize",
]

UNLIMITED_BPS = 100_000_000_000  # classification-only class for unshaped levels
VETH = "veth0"
BRIDGE = "br0"
_counter = itertools.count()


# ---------------------------------------------------------------------------------- cluster
class Cluster:
    """Create with ``up()`` (or ``with Cluster(spec) as c:``), tear down with ``down()``."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch_ns = f"{self.tag}-sw"
        self.created: list[str] = []
        self.is_up = False

    def ns(self, node: int, gpu: int) -> str:
        return f"{self.tag}-n{node}g{gpu}"

    def port(self, node: int, gpu: int) -> str:
        return f"p{node}-{gpu}"

    def namespaces(self) -> list[str]:
        return [self.ns(n, g) for n, g in self.spec.packages()] + [self.switch_ns]

    # -------------------------------------------------------------------- setup
    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        # no IPv6: its neighbour discovery would add stray bytes to the counters
        for key in ("all", "default", "lo"):
            _run(["ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)

    def up(self) -> "Cluster":
        why = check_privileges()
        if why:
            raise EmulationError(f"cannot emulate a cluster here: {why}")
        cleanup_leftovers()
        s = self.spec
        try:
            self._add_ns(self.switch_ns)
            sw = self.switch_ns
            _run(["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", BRIDGE, "up"])
            for node, gpu in s.packages():
                ns, port = self.ns(node, gpu), self.port(node, gpu)
                self._add_ns(ns)
                _run(
                    [
                        "ip",
                        "-n",
                        sw,
                        "link",
                        "add",
                        port,
                        "mtu",
                        str(s.mtu),
                        "type",
                        "veth",
                        "peer",
                        "name",
                        VETH,
                        "netns",
                        ns,
                    ]
                )
                _run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE])
                _run(["ip", "-n", sw, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "link", "set", VETH, "mtu", str(s.mtu)])
                _run(["ip", "-n", ns, "addr", "add", f"{s.address(node, gpu)}/16", "dev", VETH])
                _run(["ip", "-n", ns, "link", "set", VETH, "up"])
                self._shape(ns, VETH, node, match="dst")
                self._shape(sw, port, node, match="src")
                if s.intra_gpu_bps:
                    self._shape_loopback(ns)
            self._write_hosts()
            self.is_up = True
            self._wait_links()
        except BaseException:
            self.down()
            raise
        return self

    def _write_hosts(self) -> None:
        """Names for every package address, so reverse lookups (gloo, c10d) resolve from files
        instead of asking a DNS server that is unreachable from inside the namespaces."""
        s = self.spec
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        for n, g in s.packages():  # IPv4 and the v4-mapped form a dual-stack listener reports
            lines += [f"{s.address(n, g)} {self.ns(n, g)}", f"::ffff:{s.address(n, g)} {self.ns(n, g)}"]
        for ns in self.namespaces():
            d = os.path.join(ETC_NETNS, ns)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("\n".join(lines) + "\n")

    def _shape(self, ns: str, dev: str, node: int, match: str) -> None:
        """HTB root on ``dev``: 1:10 same node (matched by dst/src subnet), 1:20 everything else."""
        s = self.spec
        tc = ["tc", "-n", ns]
        _run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"])
        for cls, bps, lat in (
            ("10", s.intra_node_bps, s.latency_intra_us),
            ("20", s.inter_node_bps, s.latency_inter_us),
        ):
            rate = f"{bps or UNLIMITED_BPS}bit"
            # burst: ~2 ms at the rate, at least a 64 KiB GSO segment, so TSO packets pass whole
            burst = max(65536 + 1600, int((bps or UNLIMITED_BPS) / 8 * 0.002))
            _run(
                tc
                + [
                    "class",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "classid",
                    f"1:{cls}",
                    "htb",
                    "rate",
                    rate,
                    "ceil",
                    rate,
                    "burst",
                    str(burst),
                    "cburst",
                    str(burst),
                    "quantum",
                    "60000",
                ]
            )
            if lat:
                p = _run(
                    tc
                    + [
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        f"1:{cls}",
                        "handle",
                        f"{cls}:",
                        "netem",
                        "delay",
                        f"{lat:g}us",
                        "limit",
                        "100000",
                    ],
                    check=False,
                )
                if p.returncode != 0:
                    raise EmulationError(
                        "--latency needs the netem qdisc (sch_netem), which this kernel does not "
                        f"provide ({p.stderr.strip()}); run without --latency"
                    )
            else:
                _run(
                    tc
                    + ["qdisc", "add", "dev", dev, "parent", f"1:{cls}", "handle", f"{cls}:", "pfifo", "limit", "10000"]
                )
        _run(
            tc
            + [
                "filter",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                match,
                s.node_subnet(node),
                "flowid",
                "1:10",
            ]
        )

    def _shape_loopback(self, ns: str) -> None:
        bps = self.spec.intra_gpu_bps
        burst = max(65536 * 2, int(bps / 8 * 0.002))
        _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10"])
        _run(
            [
                "tc",
                "-n",
                ns,
                "class",
                "add",
                "dev",
                "lo",
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                f"{bps}bit",
                "ceil",
                f"{bps}bit",
                "burst",
                str(burst),
                "cburst",
                str(burst),
                "quantum",
                "60000",
            ]
        )

    def _wait_links(self, timeout: float = 10.0) -> None:
        """Wait until every veth is up (carrier) so the first connection does not stall."""
        t0 = time.time()
        pending = set(self.spec.packages())
        while pending and time.time() - t0 < timeout:
            for node, gpu in list(pending):
                p = _run(["ip", "-j", "-n", self.ns(node, gpu), "link", "show", VETH], check=False)
                try:
                    if "LOWER_UP" in json.loads(p.stdout)[0].get("flags", []):
                        pending.discard((node, gpu))
                except (ValueError, IndexError):
                    pass
            if pending:
                time.sleep(0.05)
        if pending:
            raise EmulationError(f"veth links of {sorted(pending)} did not come up within {timeout:g} s")

    # -------------------------------------------------------------------- teardown
    def down(self) -> list[str]:
        """Kill what runs in our namespaces, delete them; returns namespaces that survived."""
        names = list(dict.fromkeys(self.created + (self.namespaces() if self.is_up else [])))
        for ns in reversed(names):  # packages first, the switch last
            _kill_namespace(ns)
        self.is_up = False
        self.created = []
        existing = set(list_namespaces())
        left = [n for n in names if n in existing]
        if left:
            raise EmulationError(f"namespaces left after teardown: {', '.join(left)}")
        return left

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -------------------------------------------------------------------- counters
    def _class_bytes(self, ns: str, dev: str) -> tuple[dict, int]:
        """Bytes and drops per HTB class (iproute2 6.1 has no JSON for class stats: parse text)."""
        return parse_class_stats(_run(["tc", "-s", "-n", ns, "class", "show", "dev", dev], check=False).stdout)

    def counters(self) -> list[PackageCounters]:
        """Cumulative wire bytes per package (L2 bytes, headers included)."""
        res = []
        for node, gpu in self.spec.packages():
            ns = self.ns(node, gpu)
            pc = PackageCounters(node, gpu)
            p = _run(["ip", "-j", "-s", "-n", ns, "link", "show"], check=False)
            for link in json.loads(p.stdout or "[]"):
                st = link.get("stats64", {})
                if link.get("ifname") == VETH:
                    pc.veth_tx_bytes = int(st.get("tx", {}).get("bytes", 0))
                    pc.veth_rx_bytes = int(st.get("rx", {}).get("bytes", 0))
                elif link.get("ifname") == "lo":
                    pc.lo_tx_bytes = int(st.get("tx", {}).get("bytes", 0))
            pc.tx_bytes, pc.tx_drops = self._class_bytes(ns, VETH)
            pc.rx_bytes, _ = self._class_bytes(self.switch_ns, self.port(node, gpu))
            res.append(pc)
        return res

    @staticmethod
    def delta(after: list[PackageCounters], before: list[PackageCounters]) -> list[dict]:
        out = []
        for a, b in zip(after, before):
            d = asdict(a)
            for k in ("veth_tx_bytes", "veth_rx_bytes", "lo_tx_bytes", "tx_drops"):
                d[k] = getattr(a, k) - getattr(b, k)
            for k in ("tx_bytes", "rx_bytes"):
                d[k] = {lvl: v - getattr(b, k).get(lvl, 0) for lvl, v in getattr(a, k).items()}
            out.append(d)
        return out
