"""Launch one process per GCD inside its package's namespace and forward its output.

Each rank gets the torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR = rank 0's package address, MASTER_PORT), GLOO_SOCKET_IFNAME=veth0 (gloo binds to
the package's address; two GCDs of one package reach each other over loopback), OMP_NUM_THREADS=1
and EMU_NODE/EMU_GPU/EMU_GCD. Children die with the launcher (PR_SET_PDEATHSIG) and run in their
own session, so a Ctrl-C reaches only the launcher, which stops them in order.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence, TextIO

from .cluster import VETH, Cluster


class Interrupted(Exception):
    """A signal asked the launcher to stop."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@dataclass
class LaunchResult:
    returncodes: list[int]
    max_rss_bytes: list[int]  # per rank, from wait4's rusage
    cpu_s: list[float]  # user + system seconds per rank
    wall_s: float
    first_failure: Optional[int] = None  # rank that failed first
    extra: dict = field(default_factory=dict)

    @property
    def returncode(self) -> int:
        if self.first_failure is not None:
            rc = self.returncodes[self.first_failure]
            return rc if rc > 0 else 128 - rc if rc < 0 else 1
        return 0


def _pdeathsig():
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def rank_env(cluster: Cluster, rank: int, master_port: int, base: Optional[dict] = None) -> dict:
    s = cluster.spec
    node, gpu, gcd = s.placement(rank)
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(s.world_size),
            "LOCAL_RANK": str(rank % s.ranks_per_node),
            "LOCAL_WORLD_SIZE": str(s.ranks_per_node),
            "GROUP_RANK": str(node),
            "NODE_RANK": str(node),
            "MASTER_ADDR": s.address(*s.placement(0)[:2]),
            "MASTER_PORT": str(master_port),
            "GLOO_SOCKET_IFNAME": VETH,
            "OMP_NUM_THREADS": env.get("EMU_OMP_NUM_THREADS", "1"),
            "EMU_NODE": str(node),
            "EMU_GPU": str(gpu),
            "EMU_GCD": str(gcd),
            "EMU_NAMESPACE": cluster.ns(node, gpu),
            "PYTHONUNBUFFERED": "1",
        }
    )
    for k in (
        "TORCHELASTIC_RUN_ID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NNODES",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NPROCS",
    ):
        env.pop(k, None)  # launcher_env prefers torchrun names, but do not leave stale Slurm ones
    return env


def _pump(stream, out: TextIO, prefix: str, lock: threading.Lock):
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        with lock:
            try:
                out.write(f"{prefix}{line}\n")
                out.flush()
            except (ValueError, OSError):  # sink closed (launcher finishing) or broken pipe
                pass
    stream.close()


def launch(
    cluster: Cluster,
    command: Sequence[str],
    *,
    master_port: int = 29500,
    env: Optional[dict] = None,
    stdout_ranks: str = "all",
    grace_s: float = 5.0,
    timeout_s: Optional[float] = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    cwd: Optional[str] = None,
) -> LaunchResult:
    """Run ``command`` once per rank; return exit codes and per-rank peak RSS.

    ``stdout_ranks``: ``all`` forwards every rank's stdout, ``0`` only rank 0's (stderr is always
    forwarded). When a rank fails, the others get ``grace_s`` seconds and are then stopped.
    Raises :class:`Interrupted` (after stopping the ranks) when a signal arrives.
    """
    s = cluster.spec
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    threads = []
    width = len(str(s.world_size - 1))
    t0 = time.perf_counter()
    rcs: list[Optional[int]] = [None] * s.world_size
    rss = [0] * s.world_size
    cpu = [0.0] * s.world_size
    first_fail = None
    devnull = open(os.devnull, "w")
    try:
        for r in range(s.world_size):
            node, gpu, _ = s.placement(r)
            p = subprocess.Popen(
                ["ip", "netns", "exec", cluster.ns(node, gpu), *command],
                env=rank_env(cluster, r, master_port, env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_pdeathsig,
            )
            procs.append(p)
            prefix = f"[r{r:0{width}d}] "
            show = stdout_ranks == "all" or (stdout_ranks == "0" and r == 0)
            sink = out if show else devnull
            for stream, dst in ((p.stdout, sink), (p.stderr, err)):
                t = threading.Thread(target=_pump, args=(stream, dst, prefix, lock), daemon=True)
                t.start()
                threads.append(t)
        fail_time = None
        while any(rc is None for rc in rcs):
            for r, p in enumerate(procs):
                if rcs[r] is not None:
                    continue
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == 0:
                    continue
                rcs[r] = os.waitstatus_to_exitcode(status)
                p.returncode = rcs[r]
                rss[r] = int(ru.ru_maxrss) * 1024
                cpu[r] = ru.ru_utime + ru.ru_stime
                if rcs[r] != 0 and first_fail is None:
                    first_fail, fail_time = r, time.perf_counter()
            if fail_time is not None and time.perf_counter() - fail_time > grace_s:
                _stop(procs, rcs)
                fail_time = float("inf")
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                with lock:
                    err.write(f"error: timeout after {timeout_s:g} s, stopping the ranks\n")
                _stop(procs, rcs)
                if first_fail is None:
                    first_fail = next((r for r, rc in enumerate(rcs) if rc is None), 0)
                timeout_s = None
            time.sleep(0.05)
    except BaseException:
        _stop(procs, rcs)
        raise
    finally:
        for t in threads:
            t.join(timeout=2.0)
        devnull.close()
    if first_fail is None:
        first_fail = next((r for r, rc in enumerate(rcs) if rc), None)
    return LaunchResult([int(rc) for rc in rcs], rss, cpu, time.perf_counter() - t0, first_fail)


def _stop(procs: list[subprocess.Popen], rcs: list, term_s: float = 5.0) -> None:
    """SIGTERM the ranks still running (their whole session), SIGKILL after ``term_s``; reap."""
    live = [(r, p) for r, p in enumerate(procs) if rcs[r] is None]
    for _, p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + term_s
    while live and time.time() < deadline:
        still = []
        for r, p in live:
            pid, status, _ = os.wait4(p.pid, os.WNOHANG)
            if pid:
                rcs[r] = os.waitstatus_to_exitcode(status)
                p.returncode = rcs[r]
            else:
                still.append((r, p))
        live = still
        time.sleep(0.05)
    for r, p in live:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _, status, _ = os.wait4(p.pid, 0)
            rcs[r] = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            rcs[r] = -signal.SIGKILL
        p.returncode = rcs[r]


def install_signal_handlers() -> dict:
    """SIGINT/SIGTERM/SIGHUP raise :class:`Interrupted` in the main thread; returns the old ones."""

    def handler(signum, frame):
        raise Interrupted(signum)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, handler)
    return old


def restore_signal_handlers(old: dict) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
