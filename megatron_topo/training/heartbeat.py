"""Naming the rank that vanished when a collective fails.

:class:`Heartbeat` keeps a counter per rank in the rendezvous store (a separate client
connection, bumped by a daemon thread once a second). When a collective fails, the survivor reads
the counters twice a few seconds apart: a rank whose counter stopped and who did not announce a
deliberate exit is the one that vanished. :func:`describe_failure` turns the backend's error into
one line naming that rank (or, when the store itself is gone, the store's host), the peer
address from the error and the collective time-out. Test fault injection is in
training/fault_injection.py.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from typing import Optional


# ------------------------------------------------------------------------------- heartbeat
class Heartbeat:
    """A per-rank liveness counter in the rendezvous store (see the module docstring)."""

    PREFIX = "megatron_topo/hb/"

    def __init__(self, rank: int, world: int, host: str, port: int, interval: float = 1.0):
        import torch.distributed as dist

        self.rank, self.world, self.host, self.port, self.interval = rank, world, host, port, interval
        self.store = dist.TCPStore(
            host, port, world_size=None, is_master=False, timeout=datetime.timedelta(seconds=5), wait_for_workers=False
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.store.add(self._key("hb", rank), 1)
        self._thread = threading.Thread(target=self._run, name="megatron_topo-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, rank: int, world: int) -> Optional["Heartbeat"]:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            return None
        try:
            return cls(rank, world, host, int(port))
        except Exception:  # diagnosis is best effort; never stop training for it
            return None

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.PREFIX}{kind}/{rank}"

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                with self._lock:
                    self.store.add(self._key("hb", self.rank), 1)
            except Exception:
                return

    @property
    def hosts_store(self) -> bool:
        """Rank 0 serves the store unless torchrun's agent does (then it outlives the ranks)."""
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return self.rank == 0 and not agent

    def stop(self, deliberate: bool = True, lost: tuple = (), linger_s: float = 15.0):
        """Stop beating; ``deliberate`` tells the others this rank is leaving on purpose. The rank
        that hosts the store waits (up to ``linger_s``) until every other rank has left or is
        ``lost``, so the others can still read the heartbeats while they diagnose."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            with self._lock:
                if deliberate:
                    self.store.add(self._key("exit", self.rank), 1)
            if self.hosts_store:
                deadline = time.monotonic() + linger_s
                while time.monotonic() < deadline:
                    exited = self._read("exit")
                    if all(exited[r] or r in lost for r in range(self.world) if r != self.rank):
                        break
                    time.sleep(0.2)
        except Exception:
            pass

    def _read(self, kind: str) -> list[int]:
        with self._lock:
            return [self.store.add(self._key(kind, r), 0) for r in range(self.world)]

    def lost_ranks(self, wait: Optional[float] = None) -> list[int]:
        """Ranks whose counter did not move for ``wait`` seconds and that did not exit on purpose.
        Raises when the store cannot be reached."""
        wait = 3.0 * self.interval if wait is None else wait
        a = self._read("hb")
        time.sleep(wait)
        b = self._read("hb")
        exited = self._read("exit")
        lost = [r for r in range(self.world) if r != self.rank and a[r] == b[r] and not exited[r]]
        with self._lock:
            if lost:
                self.store.set(f"{self.PREFIX}lost", ",".join(map(str, lost)))
            elif self.store.check([f"{self.PREFIX}lost"]):
                lost = [int(x) for x in self.store.get(f"{self.PREFIX}lost").decode().split(",") if x]
        return lost


_COMM_HINTS = (
    "gloo",
    "connection closed",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "nccl",
    "peer",
    "socket",
    "distbackenderror",
    "no route to host",
    "connection refused",
)


def is_comm_failure(exc: BaseException) -> bool:
    try:
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistBackendError", ())) or isinstance(exc, getattr(dist, "DistError", ())):
            return True
    except Exception:
        pass
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, RuntimeError) and any(h in text for h in _COMM_HINTS)


_PEER_RE = re.compile(r"\[([0-9A-Za-z_.:\-]+)\]:(\d+)")


def describe_failure(
    exc: BaseException, rank: int, world: int, heartbeat: Optional[Heartbeat], timeout_s: float
) -> Optional[str]:
    """One line for a failed collective (None when ``exc`` is not a communication failure)."""
    if not is_comm_failure(exc):
        return None
    text = " ".join(str(exc).split())
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    timed_out = "timed out" in text.lower() or "timeout" in text.lower()
    m = _PEER_RE.search(text)
    peer = f"peer {m.group(1)}:{m.group(2)}" if m else "a peer"
    what = (
        f"a collective timed out after {timeout_s:g} s (distributed.collective_timeout_s)"
        if timed_out
        else f"the connection to {peer} closed"
    )
    who = None
    if heartbeat is not None:
        lost: list = []
        try:
            lost = heartbeat.lost_ranks()
            if lost:
                who = (
                    f"lost rank {lost[0]}" if len(lost) == 1 else f"lost ranks {', '.join(map(str, lost))}"
                ) + " (its heartbeat stopped)"
        except Exception:
            lost = []
            agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            host = f"{heartbeat.host}:{heartbeat.port}"
            who = (
                f"lost the launcher's rendezvous store at {host}"
                if agent
                else f"lost rank 0 (it hosts the rendezvous store at {host}, which stopped answering)"
            )
        # the store's host stays until the others have read the heartbeats too: a peer blocked in
        # a collective with this rank only notices at its own time-out, and a store gone by then
        # would make it blame rank 0 (bounded, so a failed job does not idle for long)
        heartbeat.stop(deliberate=True, lost=tuple(lost), linger_s=min(timeout_s + 10.0, 120.0))
    if who is None:
        who = "a rank stopped responding (could not tell which: no heartbeat store)"
    detail = first if len(first) <= 160 else first[:157] + "..."
    return f"rank {rank}/{world}: {who}; {what} [{detail}]"
