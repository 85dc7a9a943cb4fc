"""Faults: a rank SIGKILLed mid-step, a SIGKILL during a checkpoint save, NaN/inf in the loss or
the gradients, and 1% packet loss on an emulated inter-node link.

Multi-process cases run ``train.py`` on configs/tiny.yml as real processes over gloo (ranks get
RANK/WORLD_SIZE/MASTER_ADDR like torchrun gives them); faults are injected with the
``MEGATRON_TOPO_FAULT`` hook (megatron_topo/training/fault_injection.py).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from megatron_topo.config import ConfigError
from megatron_topo.training import Trainer, TrainingError, fault_injection
from megatron_topo.zero_topo import checkpoint as ckpt

from .dist_utils import run_distributed
from .train_utils import datasets, local_runtime, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
PY = sys.executable


# ------------------------------------------------------------------------------ launching
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data_cache"))


def _args(cache, tmp, *configs, steps=4, **sets):
    base = {
        "train_iters": steps,
        "eval_interval": 0,
        "log_interval": 1,
        "progress_bar": "false",
        "data_cache_dir": cache,
        "builtin_corpus_bytes": 100000,
        "log_dir": str(tmp / "run"),
        "save": None,
        "distributed.backend": "gloo",
        "distributed.device": "cpu",
        "distributed.collective_timeout_s": 30,
    }
    base.update(sets)
    out = [
        os.path.join(ROOT, "train.py"),
        os.path.join(CONFIGS, "tiny.yml"),
        *[os.path.join(CONFIGS, c) for c in configs],
    ]
    for k, v in base.items():
        out += ["--set", f"{k}={'null' if v is None else v}"]
    return out


def _launch(world, args, tmp, fault=None, netns=None, master="127.0.0.1", ifname=None):
    """Start ``world`` train.py ranks; ``netns[r]`` = (namespace, interface) places rank r."""
    port = _port()
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r % 2 if netns else r),
            LOCAL_WORLD_SIZE=str(2 if netns else world),
            MASTER_ADDR=master,
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop(fault_injection.ENV, None)
        if fault:
            env[fault_injection.ENV] = fault
        cmd = [PY, *args]
        if netns:
            ns, dev = netns[r]
            env["GLOO_SOCKET_IFNAME"] = dev
            cmd = ["ip", "netns", "exec", ns, *cmd]
        elif ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=str(tmp), stdout=open(tmp / f"out{r}", "w"), stderr=open(tmp / f"err{r}", "w")
            )
        )
    return procs


def _wait(procs, timeout):
    """Return codes and exit times (s since the call); kills whatever is left at ``timeout``."""
    t0 = time.monotonic()
    times = [None] * len(procs)
    try:
        while any(t is None for t in times) and time.monotonic() - t0 < timeout:
            for i, p in enumerate(procs):
                if times[i] is None and p.poll() is not None:
                    times[i] = time.monotonic() - t0
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs], times


def _errors(tmp, r):
    return [line for line in (tmp / f"err{r}").read_text().splitlines() if line.startswith("error:")]


# ------------------------------------------------------------------------------ SIGKILL mid-step
def test_sigkill_one_rank_mid_step_others_exit_naming_it(cache, tmp_path):
    """4 ranks (1 node x 2 GPUs x 2 GCDs, topo): rank 3 dies in the middle of step 2; ranks 0-2
    exit non-zero within 60 s of its death, each with one error line naming rank 3."""
    # 30 s: a rank blocked in a collective with a survivor notices at its time-out, and the store's
    # host (rank 0) lingers until then so every rank can read who stopped beating
    args = _args(cache, tmp_path, "topo.yml", "local_cpu.yml", steps=4, **{"distributed.collective_timeout_s": 30})
    procs = _launch(4, args, tmp_path, fault="kill:rank=3:step=2")
    rcs, times = _wait(procs, 240)
    assert rcs[3] == -signal.SIGKILL, (rcs, (tmp_path / "err3").read_text()[-2000:])
    for r in range(3):
        err = (tmp_path / f"err{r}").read_text()
        assert rcs[r] not in (0, None), (r, rcs, err[-2000:])
        assert times[r] - times[3] < 60, (r, times)
        lines = _errors(tmp_path, r)
        assert len(lines) == 1 and "lost rank 3" in lines[0], err[-2000:]
        assert "Traceback" not in err


# ------------------------------------------------------------------------------ SIGKILL in save
def test_sigkill_during_checkpoint_save_keeps_previous_and_resume_works(cache, tmp_path):
    """2 ranks save at steps 2 and 4; rank 1 is killed while step 4 is being written (steps 3 and 4
    were trained and logged). The step-2 checkpoint stays intact (every file matches the SHA-256
    recorded in its meta.json) and 'latest' still names it; resuming from it retrains steps 3 and
    4 with exactly the losses the killed run had, and publishes step 4."""
    ck = tmp_path / "ck"

    def run(tag, fault=None, **sets):
        d = tmp_path / tag
        d.mkdir()
        a = _args(cache, d, steps=4, checkpoint_factor=2, save=str(ck), **sets)
        rcs, _ = _wait(_launch(2, a, d, fault=fault), 240)
        return d, rcs

    crash, rcs = run("crash", fault="kill:rank=1:step=4:at=save")
    assert rcs[1] == -signal.SIGKILL and rcs[0] not in (0, None), (rcs, (crash / "err0").read_text()[-2000:])
    lines = _errors(crash, 0)
    assert len(lines) == 1 and "lost rank 1" in lines[0], (crash / "err0").read_text()[-2000:]
    assert (ck / "latest").read_text() == "global_step2\n"
    assert not (ck / "global_step4").exists() and (ck / ".tmp_global_step4").is_dir()
    snapshot = {f: (ck / "global_step2" / f).read_bytes() for f in os.listdir(ck / "global_step2")}
    good = ckpt.read_full_state(str(ck))  # opens and verifies every file against meta.json
    assert good["step_dir"].endswith("global_step2") and good["meta"].trainer.step == 2
    # resume from the surviving checkpoint, no fault
    resumed, rcs = run("resume", load=str(ck))
    assert rcs == [0, 0], (resumed / "err0").read_text()[-2000:]
    assert "resumed from" in (resumed / "out0").read_text() and "at step 2" in (resumed / "out0").read_text()
    assert sorted(os.listdir(ck)) == ["global_step2", "global_step4", "latest"]  # leftovers cleaned
    assert {f: (ck / "global_step2" / f).read_bytes() for f in os.listdir(ck / "global_step2")} == snapshot
    assert ckpt.read_full_state(str(ck))["meta"].step == 4
    la = [json.loads(x) for x in open(crash / "run" / "metrics.jsonl")]
    lb = [json.loads(x) for x in open(resumed / "run" / "metrics.jsonl")]
    assert [r["step"] for r in la] == [1, 2, 3, 4] and [r["step"] for r in lb] == [3, 4]
    assert [r["loss"] for r in la[2:]] == [r["loss"] for r in lb], (la, lb)


# ------------------------------------------------------------------------------ NaN / inf
def _nan_trainer(tmp_path, monkeypatch, precision, fault, max_bad=3, steps=8):
    monkeypatch.setenv(fault_injection.ENV, fault)
    cfg = small_config(
        tmp_path, **{"train.precision": precision, "train.max_bad_steps": max_bad, "train.train_iters": steps}
    )
    return Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)


def test_nan_gradient_fp32_aborts_after_k_steps_naming_step_and_unit(tmp_path, monkeypatch):
    tr = _nan_trainer(tmp_path, monkeypatch, "fp32", "nan:step=2:unit=1:count=10")
    tr.train_step()
    before = {n: p.clone() for n, p in tr.engine.full_parameters().items()}
    for _ in range(2):  # steps 2 and 3: skipped, counted
        assert tr.train_step()["skipped"]
    with pytest.raises(TrainingError) as e:
        tr.train_step()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("step 4:") and "3 consecutive steps in fp32" in msg
    assert "unit 1 (layers.0)" in msg and "units" not in msg, msg
    after = tr.engine.full_parameters()
    assert all(torch.equal(after[n], before[n]) for n in before)  # bad steps never updated weights


def test_inf_loss_bf16_aborts_naming_every_unit(tmp_path, monkeypatch):
    tr = _nan_trainer(tmp_path, monkeypatch, "bf16", "inf:step=1:where=loss:count=5", max_bad=2)
    tr.train_step()
    with pytest.raises(TrainingError) as e:
        tr.train_step()
    msg = str(e.value)
    assert msg.startswith("step 2:") and "bf16" in msg and "units 0 (embed_in), 1 (layers.0)" in msg, msg


def test_isolated_bad_steps_do_not_abort(tmp_path, monkeypatch):
    tr = _nan_trainer(tmp_path, monkeypatch, "fp32", "nan:step=2:unit=0;nan:step=4:unit=3", max_bad=2, steps=5)
    tr.train()
    assert tr.state.step == 5 and tr.state.bad_steps == 0


def test_nan_gradient_fp16_skips_steps_and_keeps_training(tmp_path, monkeypatch):
    tr = _nan_trainer(tmp_path, monkeypatch, "fp16", "nan:step=2:unit=2:count=4", max_bad=2)
    tr.cfg.train.fp16.hysteresis = 1
    tr.engine.scaler.hysteresis = 1
    tr.train_step()
    before = {n: p.clone() for n, p in tr.engine.full_parameters().items()}
    scale = tr.engine.loss_scale
    for i in range(4):  # more bad steps than max_bad_steps: fp16 skips them all
        st = tr.train_step()
        assert st["skipped"] and tr.engine.loss_scale == scale / 2 ** (i + 1)
    after = tr.engine.full_parameters()
    assert all(torch.equal(after[n], before[n]) for n in before)
    st = tr.train_step()
    assert not st["skipped"] and torch.isfinite(torch.tensor(st["grad_norm"]))


def _nan_one_rank(rank, world, tmp):
    os.environ[fault_injection.ENV] = "nan:step=1:unit=2:rank=2:count=3"
    try:
        cfg = small_config(tmp, **{"train.max_bad_steps": 2, "zero_topo.preset": "zero2"})
        cfg.logging.log_dir = str(tmp / "run")
        tr = Trainer(cfg, local_runtime(rank, world), datasets=datasets(cfg), log=lambda *a, **k: None)
        tr.train_step()
        try:
            tr.train_step()
        except TrainingError as e:
            return str(e)
        return None
    finally:
        del os.environ[fault_injection.ENV]


def test_nan_on_one_rank_is_reported_by_every_rank(tmp_path):
    """zero2 on 4 ranks: the NaN enters rank 2's gradient shard of unit 2 only; every rank aborts
    at the same step and names unit 2."""
    msgs = run_distributed(_nan_one_rank, 4, tmp_path)
    assert all(m is not None and m.startswith("step 2:") and "unit 2 (layers.1)" in m for m in msgs), msgs


def test_fault_spec_errors_are_one_line(monkeypatch):
    for spec, needle in (
        ("explode:step=1", "unknown"),
        ("kill:rank=x:step=1", "not an integer"),
        ("kill:rank=1", "needs step"),
        ("kill:step=1:at=lunch", "at=lunch"),
    ):
        with pytest.raises(ConfigError, match=needle):
            fault_injection.parse(spec)


# ------------------------------------------------------------------------------ packet loss
def _sh(*cmd, check=True):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


def _lossy_link(tag: str, subnet: str):
    """Two namespaces joined by a veth pair whose both directions drop ~1% of packets: netem
    when the kernel has it, else an HTB class with a zero-length FIFO fed by a u32 filter on the
    IP ID (two residues: 1/128 + 1/512 of packets; a retransmission gets a new ID)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("packet-loss emulation needs root with iproute2 (ip, tc)")
    ns = [f"{tag}-a", f"{tag}-b"]
    devs = [f"{tag[-8:]}a", f"{tag[-8:]}b"]
    p = _sh("ip", "netns", "add", ns[0], check=False)
    if p.returncode:
        pytest.skip(f"cannot create network namespaces: {p.stderr.strip()}")
    try:
        _sh("ip", "netns", "add", ns[1])
        _sh("ip", "link", "add", devs[0], "type", "veth", "peer", "name", devs[1])
        method = "netem loss 1%"
        for i in (0, 1):
            _sh("ip", "link", "set", devs[i], "netns", ns[i])
            _sh("ip", "-n", ns[i], "addr", "add", f"{subnet}.{i + 1}/24", "dev", devs[i])
            _sh("ip", "-n", ns[i], "link", "set", "lo", "up")
            _sh("ip", "-n", ns[i], "link", "set", devs[i], "up")
            if (
                _sh(
                    "tc", "-n", ns[i], "qdisc", "add", "dev", devs[i], "root", "netem", "loss", "1%", check=False
                ).returncode
                == 0
            ):
                continue
            method = "u32 IP-ID filter into a dropping class (~1%; netem is not in this kernel)"
            _sh("ip", "-n", ns[i], "link", "set", "dev", devs[i], "gso_max_segs", "1")  # one packet per skb
            tc = ["tc", "-n", ns[i]]
            _sh(*tc, "qdisc", "add", "dev", devs[i], "root", "handle", "1:", "htb", "default", "1", "r2q", "100000")
            for c in ("1:1", "1:2"):
                _sh(*tc, "class", "add", "dev", devs[i], "parent", "1:", "classid", c, "htb", "rate", "10gbit")
            _sh(*tc, "qdisc", "add", "dev", devs[i], "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")
            # residues are non-zero: ID 0 (SYN-ACKs, RSTs) always passes, so connections open
            for val, mask in (("0x0040", "0x007f"), ("0x0101", "0x01ff")):
                _sh(
                    *tc,
                    "filter",
                    "add",
                    "dev",
                    devs[i],
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    "match",
                    "u16",
                    val,
                    mask,
                    "at",
                    "4",
                    "flowid",
                    "1:2",
                )
    except (RuntimeError, subprocess.SubprocessError) as e:
        _teardown(ns)
        pytest.skip(f"cannot build the lossy link: {e}")
    return ns, devs, method


def _teardown(ns):
    for n in ns:
        for pid in _sh("ip", "netns", "pids", n, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _sh("ip", "netns", "del", n, check=False)


def _link_stats(ns, devs) -> tuple[int, int]:
    """(packets passed, packets dropped) on both ends of the lossy link."""
    import re

    sent = dropped = 0
    for n, d in zip(ns, devs):
        q = _sh("tc", "-n", n, "-s", "qdisc", "show", "dev", d, check=False).stdout
        if "netem" in q:
            m = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", q)
        else:  # HTB: class 1:1 passes, class 1:2 (zero-length FIFO) drops
            c = _sh("tc", "-n", n, "-s", "class", "show", "dev", d, check=False).stdout
            ok = re.search(r"class htb 1:1 .*?Sent \d+ bytes (\d+) pkt", c, re.S)
            bad = re.search(r"class htb 1:2 .*?dropped (\d+)", c, re.S)
            m = None
            sent += int(ok.group(1)) if ok else 0
            dropped += int(bad.group(1)) if bad else 0
        if m:
            sent, dropped = sent + int(m.group(1)), dropped + int(m.group(2))
    return sent, dropped


def test_one_percent_packet_loss_between_nodes_trains_identically(cache, tmp_path):
    """2 nodes x 1 GPU x 2 GCDs under topo; the nodes are two network namespaces joined by a
    veth pair dropping ~1% of packets each way. TCP retransmits: the losses equal a loopback run's
    bit for bit."""
    tag = f"mtf{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250 + 1}"
    sets = {
        "topology.gcds_per_gpu": 2,
        "topology.gpus_per_node": 1,
        "zero_topo.preset": "topo",
        "zero_topo.quant_block_size": 256,
        "zero_topo.grad_quant_block_size": 256,
    }
    loop = tmp_path / "loopback"
    loop.mkdir()
    rcs, _ = _wait(_launch(4, _args(cache, loop, steps=3, **sets), loop, ifname="lo"), 240)
    assert rcs == [0] * 4, (loop / "err0").read_text()[-2000:]
    ns, devs, method = _lossy_link(tag, subnet)
    print(f"packet loss emulation: {method}")
    lossy = tmp_path / "lossy"
    lossy.mkdir()
    try:
        place = [(ns[0], devs[0]), (ns[0], devs[0]), (ns[1], devs[1]), (ns[1], devs[1])]
        rcs, _ = _wait(_launch(4, _args(cache, lossy, steps=3, **sets), lossy, netns=place, master=f"{subnet}.1"), 300)
        sent, dropped = _link_stats(ns, devs)
    finally:
        _teardown(ns)
    assert rcs == [0] * 4, (lossy / "err0").read_text()[-2000:]
    print(
        f"inter-node link: {dropped} of {sent + dropped} packets dropped "
        f"({100 * dropped / max(1, sent + dropped):.2f}%)"
    )
    assert dropped > 0 and 0.002 < dropped / (sent + dropped) < 0.03
    la = [json.loads(x)["loss"] for x in open(loop / "run" / "metrics.jsonl")]
    lb = [json.loads(x)["loss"] for x in open(lossy / "run" / "metrics.jsonl")]
    assert len(la) == 3 and la == lb, (la, lb)
