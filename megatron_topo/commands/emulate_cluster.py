"""Run a command as an emulated multi-node job: one network namespace per GPU package.

    tools/emulate_cluster.py --nodes 2 --gpus-per-node 2 --gcds-per-gpu 2 \\
        [--profile frontier|nvlink] [--inter-node 200mbit] [--intra-node 400mbit] [--intra-gpu unshaped] \\
        [--latency 50us[,10us]] \\
        [--stats-json FILE] [--stdout-ranks all|0] [--timeout S] -- COMMAND [ARGS...]

    tools/emulate_cluster.py --cleanup      # remove namespaces left by a killed run

One rank per GCD runs ``COMMAND`` inside its package's namespace with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's address), MASTER_PORT, GLOO_SOCKET_IFNAME,
OMP_NUM_THREADS=1 set; output lines are prefixed with the rank. Ranks on one package talk over
the namespace's loopback (unshaped unless --intra-gpu), packages of one node over veth links
shaped to --intra-node, packages of different nodes to --inter-node (one NIC per package, each
direction). Rates: 200mbit, 1.6gbit, 25MB/s or 'unshaped' (an empty value is refused). Defaults are Frontier's
200 : 50 : 25 GB/s per device scaled by 1/1000 (loopback left unshaped); ``--profile nvlink``
keeps the NIC and leaves every link inside a node unshaped, like NVLink/NVSwitch nodes. Every namespace, link
and qdisc is removed on exit, on failure and on Ctrl-C. For megatron_topo's train.py, pass the
same shape to the trainer: ``--set topology.gpus_per_node=G --set topology.gcds_per_gpu=C``.

``--stats-json`` writes exit codes, peak RSS per rank, and the bytes each package sent per link
level as measured on the wire (tc class counters on the veths, loopback for the GCD pair), with
``"tool": "emulate_cluster"``; FILE is checked before the cluster is built and replaces only an
earlier stats file of this tool (megatron_topo.tool_outputs: never a link, a FIFO, a user's file, or
a file inside a checkpoint, an HF export or a run's log folder). Needs root (network namespaces);
without it the tool exits with one line.
"""

from __future__ import annotations

import argparse
import signal
import sys

from megatron_topo.analysis.emulation import (
    Cluster,
    ClusterSpec,
    EmulationError,
    Interrupted,
    RateError,
    cleanup_leftovers,
    launch,
    parse_latency_pair,
    parse_rate,
    summarize,
)
from megatron_topo.analysis.emulation import cluster_spec as CS
from megatron_topo.analysis.emulation import rates as R
from megatron_topo.analysis.emulation.launch import install_signal_handlers, restore_signal_handlers
from megatron_topo.cli import OneLineParser, bounded, interruptible, path_arg
from megatron_topo.error_lines import clean
from megatron_topo.tool_outputs import OutputError, check_file, write_result

TOOL = "emulate_cluster"
LEGACY = ("spec", "command", "returncodes", "packages")  # stats written before the "tool" field


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=bounded(int, 1, CS.MAX_NODES, why="one /24 per node"), default=2)
    ap.add_argument(
        "--gpus-per-node", type=bounded(int, 1, CS.MAX_GPUS_PER_NODE, why="one address per GPU package"), default=2
    )
    ap.add_argument("--gcds-per-gpu", type=bounded(int, 1, CS.MAX_GCDS_PER_GPU), default=2)
    ap.add_argument(
        "--profile",
        choices=sorted(R.PROFILES),
        default="frontier",
        help="link rates: frontier = Frontier's 200:50:25 GB/s ratios scaled by 1/1000; nvlink = the "
        "same NIC, links inside a node unshaped (NVLink-like); --inter-node etc. override",
    )
    ap.add_argument(
        "--inter-node",
        default=None,
        metavar="RATE",
        help=f"per package NIC, each direction (frontier: {R.DEFAULT_INTER_NODE})",
    )
    ap.add_argument(
        "--intra-node",
        default=None,
        metavar="RATE",
        help=f"per package to the other packages of its node (frontier: {R.DEFAULT_INTRA_NODE})",
    )
    ap.add_argument(
        "--intra-gpu", default=None, metavar="RATE", help="shape the package's loopback (GCD pair); default unshaped"
    )
    ap.add_argument("--unshaped", action="store_true", help="no rate limits at all (counters still work)")
    ap.add_argument(
        "--latency", default=None, metavar="INTER[,INTRA]", help="one-way delay added per level (netem), e.g. 50us,10us"
    )
    ap.add_argument(
        "--mtu",
        type=bounded(int, CS.MIN_MTU, CS.MAX_MTU, unit="bytes", why="Linux's range for a veth link"),
        default=1500,
    )
    ap.add_argument("--subnet", default="10.213", help="first two octets of the private /16 used inside")
    ap.add_argument("--master-port", type=bounded(int, 1, 65535, why="a TCP port"), default=29500)
    ap.add_argument(
        "--stats-json",
        type=path_arg,
        default=None,
        metavar="FILE",
        help="write the run's statistics here (a new file or an earlier stats file of this tool)",
    )
    ap.add_argument(
        "--stdout-ranks",
        choices=("all", "0"),
        default="all",
        help="whose stdout to forward (stderr is always forwarded)",
    )
    ap.add_argument(
        "--timeout",
        type=bounded(float, CS.MIN_TIMEOUT_S, CS.MAX_TIMEOUT_S, unit="seconds"),
        default=None,
        metavar="S",
        help="stop the ranks after S seconds",
    )
    ap.add_argument("--cleanup", action="store_true", help="remove leftovers of killed runs and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return ap


def spec_from_args(a) -> ClusterSpec:
    lat_inter, lat_intra = parse_latency_pair(a.latency, "--latency")  # None: not given ('' is refused)
    given = {"--inter-node": a.inter_node, "--intra-node": a.intra_node, "--intra-gpu": a.intra_gpu}
    rates = {k: parse_rate(v, k) for k, v in given.items() if v is not None}  # each given value is checked
    if a.unshaped:
        inter = intra = gpu = None
    else:
        defaults = dict(zip(given, R.PROFILES[a.profile]))
        inter, intra, gpu = (rates[k] if k in rates else parse_rate(defaults[k], k) for k in given)
    return ClusterSpec(
        a.nodes,
        a.gpus_per_node,
        a.gcds_per_gpu,
        inter_node_bps=inter,
        intra_node_bps=intra,
        intra_gpu_bps=gpu,
        latency_inter_us=lat_inter,
        latency_intra_us=lat_intra,
        mtu=a.mtu,
        subnet=a.subnet,
    )


@interruptible
def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    prog = "emulate_cluster"
    if a.cleanup:
        try:
            removed = cleanup_leftovers()
        except EmulationError as e:
            print(clean(f"error: {e}"), file=sys.stderr)
            return 2
        print(f"{prog}: removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        print(f"error: no command given; usage: {prog} [options] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        spec = spec_from_args(a)
        if a.stats_json:
            check_file(a.stats_json, "--stats-json", TOOL, LEGACY)
    except (RateError, EmulationError, OutputError) as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    cluster = Cluster(spec)
    old = install_signal_handlers()
    rc = 0
    try:
        try:
            cluster.up()
        except EmulationError as e:
            print(clean(f"error: {e}"), file=sys.stderr)
            return 2
        print(f"{prog}: {spec.describe()}", file=sys.stderr, flush=True)
        before = cluster.counters()
        res = launch(cluster, cmd, master_port=a.master_port, stdout_ranks=a.stdout_ranks, timeout_s=a.timeout)
        after = cluster.counters()
        rc = res.returncode
        if a.stats_json:
            per_pkg = Cluster.delta(after, before)
            stats = {
                "spec": {**spec.__dict__, "world_size": spec.world_size, "ranks_per_node": spec.ranks_per_node},
                "command": cmd,
                "returncodes": res.returncodes,
                "max_rss_bytes": res.max_rss_bytes,
                "cpu_s": res.cpu_s,
                "wall_s": res.wall_s,
                "packages": per_pkg,
                **summarize(per_pkg),
            }
            try:
                write_result(a.stats_json, stats, TOOL)
            except OSError as e:
                print(clean(f"error: --stats-json {a.stats_json}: {e.strerror or e}; not written"), file=sys.stderr)
                rc = rc or 1
        if rc:
            print(f"error: rank {res.first_failure} exited with {res.returncodes[res.first_failure]}", file=sys.stderr)
    except Interrupted as e:
        print(f"error: interrupted ({e}); stopping ranks and removing the cluster", file=sys.stderr)
        rc = 128 + e.signum
    finally:
        # a second Ctrl-C must not abort the teardown
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)
        try:
            cluster.down()
        except EmulationError as e:
            print(clean(f"error: {e}"), file=sys.stderr)
            rc = rc or 2
        restore_signal_handlers(old)
    return rc


if __name__ == "__main__":
    sys.exit(main())
