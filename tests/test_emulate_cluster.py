"""The emulated cluster (tools/emulate_cluster.py, megatron_topo.analysis.emulation): rates, counters,
a 2-node training run, and that nothing is left behind (namespaces, links, qdiscs, /etc/netns).

Tests that create namespaces are skipped, with the reason printed, where that is not possible
(not root, no `ip netns`, no htb/veth in the kernel).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from megatron_topo.analysis.emulation import cluster as C
from megatron_topo.analysis.emulation.rates import RateError, format_rate, parse_latency_us, parse_rate
from megatron_topo.commands import emulate_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "emulate_cluster.py")
PY = sys.executable

_WHY = C.check_privileges()
needs_netns = pytest.mark.skipif(_WHY is not None, reason=f"cannot create network namespaces: {_WHY}")
if _WHY is not None:
    print(f"\ntest_emulate_cluster: namespace tests skipped: {_WHY}", file=sys.stderr)


def host_state() -> dict:
    """What the emulator must leave untouched / clean up: root-namespace links and qdiscs, our
    namespaces and their /etc/netns directories."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    qd = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    ours = [n for n in C.list_namespaces() if n.startswith(C.PREFIX + "-")]
    etc = sorted(d for d in os.listdir(C.ETC_NETNS) if d.startswith(C.PREFIX)) if os.path.isdir(C.ETC_NETNS) else []
    names = sorted(re.findall(r"^\d+: ([^:@]+)", links, flags=re.M))
    qdiscs = sorted(re.sub(r" refcnt \d+", "", ln) for ln in qd.splitlines())
    return {"links": names, "qdiscs": qdiscs, "namespaces": ours, "etc_netns": etc}


# ------------------------------------------------------------------------------ pure
def test_rates_parse_and_format():
    assert parse_rate("200mbit") == 200_000_000
    assert parse_rate("1.6gbit") == 1_600_000_000
    assert parse_rate("25MB/s") == 200_000_000
    assert parse_rate("unshaped") is None and parse_rate(None) is None and parse_rate("0") is None
    assert format_rate(200_000_000) == "200mbit" and format_rate(None) == "unshaped"
    assert parse_latency_us("50us") == 50 and parse_latency_us("1ms") == 1000 and parse_latency_us("7") == 7
    for bad in ("fast", "10mbps", "5 furlongs", "1bit"):
        with pytest.raises(RateError):
            parse_rate(bad)


def test_spec_placement_and_addresses():
    s = C.ClusterSpec(nodes=2, gpus_per_node=2, gcds_per_gpu=2)
    assert s.world_size == 8 and s.ranks_per_node == 4
    assert [s.placement(r) for r in (0, 1, 2, 5, 7)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert s.address(1, 0) == "10.213.1.1" and s.node_subnet(1) == "10.213.1.0/24"
    with pytest.raises(C.EmulationError):
        C.ClusterSpec(nodes=0, gpus_per_node=1, gcds_per_gpu=1)
    with pytest.raises(C.EmulationError, match="private"):
        C.ClusterSpec(nodes=1, gpus_per_node=1, gcds_per_gpu=1, subnet="8.8")


def test_parse_tc_class_stats():
    text = (
        "class htb 1:10 root leaf 10: prio 0 rate 400Mbit ceil 400Mbit burst 100000b cburst 100000b \n"
        " Sent 1234 bytes 10 pkt (dropped 1, overlimits 0 requeues 0) \n backlog 0b 0p requeues 0\n"
        "class htb 1:20 root leaf 20: prio 0 rate 200Mbit ceil 200Mbit burst 67136b cburst 67136b \n"
        " Sent 99 bytes 1 pkt (dropped 0, overlimits 0 requeues 0) \n"
    )
    assert C.parse_class_stats(text) == ({"intra_node": 1234, "inter_node": 99}, 1)


def test_without_privileges_one_line(monkeypatch, capsys):
    monkeypatch.setattr(C.os, "geteuid", lambda: 1000)
    why = C.check_privileges()
    assert why and "root" in why and "\n" not in why
    rc = emulate_cluster.main(["--nodes", "2", "--", "true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs root" in err[0], err


# ------------------------------------------------------------------------------ namespaces
@needs_netns
def test_two_node_training_and_clean_teardown(tmp_path):
    before = host_state()
    stats = tmp_path / "stats.json"
    log_dir = tmp_path / "run"
    cmd = [
        PY,
        TOOL,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--gcds-per-gpu",
        "2",
        "--stats-json",
        str(stats),
        "--timeout",
        "150",
        "--",
        PY,
        "train.py",
        "configs/tiny.yml",
        "configs/topo.yml",
        "configs/local_cpu.yml",
        "--set",
        "topology.gpus_per_node=1",
        "--set",
        "topology.gcds_per_gpu=2",
        "--set",
        "train_iters=2",
        "--set",
        "log_interval=1",
        "--set",
        "eval_interval=0",
        "--set",
        "save=null",
        "--set",
        f"log_dir={log_dir}",
        "--set",
        "progress_bar=false",
        "--set",
        "num_layers=2",
        "--set",
        "train_micro_batch_size_per_gpu=2",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[r0] done: step 2" in p.stdout
    assert "[r0] topology: 2 node(s) x 1 GPU(s) x 2 GCD(s) = 4 ranks" in p.stdout
    recs = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in recs] == [1, 2]
    st = json.loads(stats.read_text())
    assert st["returncodes"] == [0, 0, 0, 0]
    assert all(b > 50 * 2**20 for b in st["max_rss_bytes"])  # peak RSS per rank from wait4
    # topo: the GCD pair gathers over loopback, the node = the package here, the rest crosses nodes
    assert st["wire_bytes"]["intra_gpu"] > 1e5 and st["wire_bytes"]["inter_node"] > 1e5
    assert st["wire_bytes"]["intra_node"] == 0  # one package per node: no intra-node veth traffic
    assert st["tx_drops"] == 0
    assert host_state() == before


@needs_netns
def test_loopback_inside_a_package_and_shaped_rates(tmp_path):
    """Two GCDs of one package never touch the veth; other packages get their class's rate."""
    script = tmp_path / "bw.py"
    script.write_text(
        "import time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo'); r = dist.get_rank()\n"
        "t = torch.ones(1 << 20)  # 4 MiB\n"
        "for peer in (1, 2, 4):\n"
        "    dist.barrier(); t0 = time.perf_counter()\n"
        "    if r == 0: dist.send(t, peer)\n"
        "    elif r == peer: dist.recv(t, 0)\n"
        "    dist.barrier()\n"
        "    if r == 0: print(f'peer {peer} {4 * 2**20 * 8 / (time.perf_counter() - t0) / 1e6:.1f}', flush=True)\n"
        # a rank leaves as the tools do (lifecycle.leave_rank): no gloo teardown abort
        "from megatron_topo.lifecycle import leave_rank; leave_rank(0)\n"
    )
    stats = tmp_path / "s.json"
    p = subprocess.run(
        [
            PY,
            TOOL,
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--gcds-per-gpu",
            "2",
            "--inter-node",
            "100mbit",
            "--intra-node",
            "200mbit",
            "--stats-json",
            str(stats),
            "--stdout-ranks",
            "0",
            "--timeout",
            "60",
            "--",
            PY,
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    mbit = {int(a): float(b) for a, b in re.findall(r"peer (\d) ([\d.]+)", p.stdout)}
    assert mbit[2] < 200 * 1.1 and mbit[4] < 100 * 1.1, mbit  # never faster than the shaped rate
    assert mbit[4] > 100 * 0.4 and mbit[1] > mbit[2] > mbit[4], mbit
    st = json.loads(stats.read_text())
    pkg0 = st["packages"][0]
    assert pkg0["lo_tx_bytes"] > 4 * 2**20  # rank 0 -> rank 1 over loopback
    assert pkg0["tx_bytes"]["intra_node"] > 4 * 2**20 and pkg0["tx_bytes"]["inter_node"] > 4 * 2**20
    assert pkg0["veth_tx_bytes"] < 2 * 4 * 2**20 * 1.2  # ... and not over the veth
    # the receiving side counts the same bytes in its switch port's classes
    assert st["packages"][2]["rx_bytes"]["inter_node"] >= 4 * 2**20


@needs_netns
def test_ctrl_c_removes_everything():
    before = host_state()
    p = subprocess.Popen(
        [PY, TOOL, "--nodes", "2", "--gpus-per-node", "1", "--gcds-per-gpu", "2", "--", "sleep", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0 = time.time()
    while time.time() - t0 < 20 and len(host_state()["namespaces"]) < 3:
        time.sleep(0.1)
    assert len(host_state()["namespaces"]) == 3
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err
    assert host_state() == before


@needs_netns
def test_leftovers_of_a_killed_run_are_removed():
    before = host_state()
    p = subprocess.Popen(
        [PY, TOOL, "--nodes", "1", "--gpus-per-node", "1", "--gcds-per-gpu", "2", "--", "sleep", "60"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    t0 = time.time()
    while time.time() - t0 < 20 and len(host_state()["namespaces"]) < 2:
        time.sleep(0.1)
    p.kill()  # no chance to clean up
    p.wait()
    assert len(host_state()["namespaces"]) == 2
    r = subprocess.run([PY, TOOL, "--cleanup"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "removed 2 namespace(s)" in r.stdout
    assert host_state() == before
