"""Fault injection for reliability tests, and naming the rank that vanished when a collective fails.

Injection (tests only): ``MEGATRON_TOPO_FAULT`` holds one or more faults separated by ``;``::

    kill:rank=3:step=2              SIGKILL rank 3 in the middle of step 2 (after the first
                                    micro-batch's backward, gradients in flight)
    kill:rank=1:step=4:at=save      SIGKILL rank 1 while checkpoint step 4 is being saved (after its
                                    rank file is written, before the step directory is published)
    kill:rank=0:step=4:at=publish   the same, on rank 0 after meta.json, before the rename
    nan:step=3:unit=2[:rank=0][:count=5]
                                    put NaN into unit 2's gradient shard on rank 0 at steps 3..7
    inf:step=3:where=loss[:count=2] multiply the loss by inf (every unit's gradient goes bad)

``step`` is the optimizer step being computed (1-based, as in metrics.jsonl); a missing ``rank``
means every rank. A malformed spec is a ConfigError.

Diagnosis: :class:`Heartbeat` keeps a counter per rank in the rendezvous store (a separate client
connection, bumped by a daemon thread once a second). When a collective fails, the survivor reads
the counters twice a few seconds apart: a rank whose counter stopped and who did not announce a
deliberate exit is the one that vanished. :func:`describe_failure` turns the backend's error into
one line naming that rank (or, when the store itself is gone, the store's host), the peer
address from the error and the collective time-out.
"""
from __future__ import annotations

import datetime
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Optional

ENV = "MEGATRON_TOPO_FAULT"
KINDS = ("kill", "nan", "inf")
POINTS = ("step", "save", "publish")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: Optional[int] = None
    at: str = "step"
    unit: Optional[int] = None
    count: int = 1
    where: str = "grad"

    def hits(self, rank: int, step: int) -> bool:
        return (self.rank is None or self.rank == rank) and self.step <= step < self.step + self.count


def parse(spec: str) -> list[Fault]:
    from .config import ConfigError

    out = []
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        kind, *fields = item.split(":")
        if kind not in KINDS:
            raise ConfigError(f"{ENV}: fault '{kind}' in {item!r} is unknown; valid: {', '.join(KINDS)}")
        kw: dict = {}
        for f in fields:
            key, sep, val = f.partition("=")
            if not sep or key not in ("rank", "step", "at", "unit", "count", "where"):
                raise ConfigError(f"{ENV}: {f!r} in {item!r} is not valid; use rank=, step=, at=, unit=, count=, where=")
            if key in ("at", "where"):
                kw[key] = val
            else:
                try:
                    kw[key] = int(val)
                except ValueError:
                    raise ConfigError(f"{ENV}: {key}={val!r} in {item!r} is not an integer") from None
        if "step" not in kw:
            raise ConfigError(f"{ENV}: {item!r} needs step=N")
        if kw.get("at", "step") not in POINTS:
            raise ConfigError(f"{ENV}: at={kw['at']} in {item!r} is not valid; use one of {', '.join(POINTS)}")
        if kw.get("where", "grad") not in ("grad", "loss"):
            raise ConfigError(f"{ENV}: where={kw['where']} in {item!r} is not valid; use grad or loss")
        out.append(Fault(kind, **kw))
    return out


_cache: dict[str, list[Fault]] = {}


def active() -> list[Fault]:
    spec = os.environ.get(ENV, "")
    if not spec:
        return []
    if spec not in _cache:
        _cache[spec] = parse(spec)
    return _cache[spec]


def _kill_self(where: str):
    import sys

    print(f"[fault] SIGKILL rank {os.environ.get('RANK', '0')} ({where})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_fail(point: str, *, rank: int, step: int) -> None:
    """Kill this process if a ``kill`` fault names this point, rank and step."""
    for f in active():
        if f.kind == "kill" and f.at == point and f.hits(rank, step):
            _kill_self(f"{point} of step {step}")


def before_backward(step: int, micro: int, accum: int, engine, rank: int) -> None:
    """Training-loop hook before each micro-batch's backward: mid-step kills, gradient poisoning.

    Gradients are poisoned before the last backward of the step (the fp32 shard accumulates, so
    the value survives the reduction) rather than after it: after it, the engine's cross-replica
    combine may already be in flight on that buffer."""
    for f in active():
        if not f.hits(rank, step):
            continue
        if f.kind == "kill" and f.at == "step" and micro == 0:
            _kill_self(f"mid-step {step}")
        if f.kind in ("nan", "inf") and f.where == "grad" and micro == accum - 1:
            units = engine.units if f.unit is None else [engine.units[f.unit]]
            for u in units:
                u.grad_acc.view(-1)[0] = float("nan") if f.kind == "nan" else float("inf")


def corrupt_loss(step: int, loss, rank: int):
    for f in active():
        if f.kind in ("nan", "inf") and f.where == "loss" and f.hits(rank, step):
            return loss * (float("nan") if f.kind == "nan" else float("inf"))
    return loss


# ------------------------------------------------------------------------------- heartbeat
class Heartbeat:
    """A per-rank liveness counter in the rendezvous store (see the module docstring)."""

    PREFIX = "megatron_topo/hb/"

    def __init__(self, rank: int, world: int, host: str, port: int, interval: float = 1.0):
        import torch.distributed as dist

        self.rank, self.world, self.host, self.port, self.interval = rank, world, host, port, interval
        self.store = dist.TCPStore(host, port, world_size=None, is_master=False,
                                   timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
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


_COMM_HINTS = ("gloo", "connection closed", "connection reset", "broken pipe", "timed out", "timeout",
               "nccl", "peer", "socket", "distbackenderror", "no route to host", "connection refused")


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


def describe_failure(exc: BaseException, rank: int, world: int, heartbeat: Optional[Heartbeat],
                     timeout_s: float) -> Optional[str]:
    """One line for a failed collective (None when ``exc`` is not a communication failure)."""
    if not is_comm_failure(exc):
        return None
    text = " ".join(str(exc).split())
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    timed_out = "timed out" in text.lower() or "timeout" in text.lower()
    m = _PEER_RE.search(text)
    peer = f"peer {m.group(1)}:{m.group(2)}" if m else "a peer"
    what = (f"a collective timed out after {timeout_s:g} s (distributed.collective_timeout_s)" if timed_out
            else f"the connection to {peer} closed")
    who = None
    if heartbeat is not None:
        lost: list = []
        try:
            lost = heartbeat.lost_ranks()
            if lost:
                who = (f"lost rank {lost[0]}" if len(lost) == 1 else
                       f"lost ranks {', '.join(map(str, lost))}") + " (its heartbeat stopped)"
        except Exception:
            lost = []
            agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            host = f"{heartbeat.host}:{heartbeat.port}"
            who = (f"lost the launcher's rendezvous store at {host}" if agent else
                   f"lost rank 0 (it hosts the rendezvous store at {host}, which stopped answering)")
        # the store's host stays until the others have read the heartbeats too: a peer blocked in
        # a collective with this rank only notices at its own time-out, and a store gone by then
        # would make it blame rank 0 (bounded, so a failed job does not idle for long)
        heartbeat.stop(deliberate=True, lost=tuple(lost), linger_s=min(timeout_s + 10.0, 120.0))
    if who is None:
        who = "a rank stopped responding (could not tell which: no heartbeat store)"
    detail = first if len(first) <= 160 else first[:157] + "..."
    return f"rank {rank}/{world}: {who}; {what} [{detail}]"
