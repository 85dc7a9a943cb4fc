"""The job's rendezvous, bounded and checked: every rank's inputs agree before the first collective.

``rendezvous(cfg, rank, world, local_world, timeout_s)`` connects to (rank 0: serves) the TCP store
at MASTER_ADDR:MASTER_PORT and, through the store alone (no collective, so ranks that disagree on the
world size cannot hang in a process group that never forms), compares what every rank brings:
its WORLD_SIZE, LOCAL_WORLD_SIZE, the composed config (files, ``--set``) and a digest of the code.

Every rank posts a record under an arrival number (``add`` on one counter, so rank 0 also sees a
process with a duplicate RANK or a rank beyond its own WORLD_SIZE). Rank 0 reads the records as
they arrive and posts a verdict: ``ok`` once ranks 0..world-1 have each come once with the same
inputs, else one line naming the first difference (the key, the two ranks and their values). Rank
0 prints that line (:class:`RendezvousError`), the others stop quietly (:class:`PeerRefused`): the
line is printed once per job. Rank 0 waits at most ``timeout_s`` for the others
(``distributed.rendezvous_timeout_s``) and then names the ranks that never came; a rank waits as
long for rank 0's store and verdict.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from typing import Callable, Optional

from ..config import ConfigError
from ..safe_files import excerpt

PREFIX = "megatron_topo/rdzv/"
POLL_S = 0.05


class RendezvousError(ConfigError):
    """The job's ranks disagree or did not all come: one line, printed by the rank that found it."""


class RendezvousStopped(RendezvousError):
    """A stop signal came while the ranks were joining: the job never formed (exit 128 + signal)."""

    def __init__(self, signum: int, where: str):
        from ..lifecycle import signal_name

        self.signum = signum
        super().__init__(f"stopped by {signal_name(signum)} {where}; no step trained, nothing saved")


class PeerRefused(ConfigError):
    """Rank 0 refused the job (its line says why): train.py stops this rank without a line of its
    own (a tool that does not know it prints the verdict as its own error line)."""


def _flat(obj, prefix: str = "") -> dict:
    out = {}
    for k, v in obj.items() if isinstance(obj, dict) else ():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


_CODE_DIGEST: Optional[str] = None


def code_digest() -> str:
    """SHA-256 over megatron_topo's Python sources (path and bytes), computed once per process."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    h.update(os.path.relpath(p, root).encode() + b"\0")
                    try:
                        with open(p, "rb") as fh:
                            h.update(fh.read())
                    except OSError:
                        h.update(b"?")
        _CODE_DIGEST = h.hexdigest()[:16]
    return _CODE_DIGEST


def record(cfg, rank: int, world: int, local_world: Optional[int]) -> dict:
    """What this rank brings to the job (JSON-able): compared key by key on rank 0."""
    import torch

    conf = _flat(json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "")
    return {
        "rank": rank,
        "inputs": {
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": local_world,
            "megatron_topo code (SHA-256 of its sources)": code_digest(),
            "torch version": torch.__version__,
            **{k: v for k, v in conf.items()},
        },
    }


def first_difference(ref: dict, other: dict) -> Optional[str]:
    """'key: A on rank i, B on rank j' for the first keys (at most 3) whose values differ, else None."""
    a, b = ref["inputs"], other["inputs"]
    keys = [k for k in list(a) + [k for k in b if k not in a] if a.get(k, "<unset>") != b.get(k, "<unset>")]
    if not keys:
        return None
    ra, rb = ref["rank"], other["rank"]
    parts = [
        f"{k} is {_show(a.get(k, '<unset>'))} on rank {ra} but {_show(b.get(k, '<unset>'))} on rank {rb}"
        for k in keys[:3]
    ]
    more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
    return "; ".join(parts) + more


def _show(v) -> str:
    s = json.dumps(v)  # escapes control bytes and non-ASCII
    return s if len(s) <= 40 else excerpt(s, 40)


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True"


def _wait_listening(rank: int, host: str, port: int, timeout_s: float, stop: Callable) -> None:
    """Wait until the store's port accepts connections: torch's client would retry as long, but
    log a C++ stack for a store that never came."""
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            pass
        if stop():
            raise RendezvousStopped(stop(), f"on rank {rank} while waiting for rank 0's rendezvous")
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"rank {rank}: rank 0's rendezvous store at {host}:{port} did not answer within {timeout_s:g} s "
                f"(distributed.rendezvous_timeout_s); is rank 0 running, and do MASTER_ADDR/MASTER_PORT name "
                f"its node and port?"
            )
        time.sleep(0.2)


def connect(rank: int, host: str, port: int, timeout_s: float, stop: Optional[Callable] = None):
    """The rendezvous store: rank 0 serves it (unless torchrun's agent does), the others connect,
    waiting for at most ``timeout_s``."""
    import torch.distributed as dist

    serve = rank == 0 and not _agent_store()
    if not serve:
        _wait_listening(rank, host, port, timeout_s, stop or (lambda: None))
    try:
        return dist.TCPStore(
            host,
            port,
            world_size=None,
            is_master=serve,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except Exception as e:
        text = str(e)
        if "EADDRINUSE" in text or "address already in use" in text.lower():
            raise ConfigError(
                f"MASTER_PORT {port} on {host} is already in use (another job or run on this node, or two "
                f"processes with RANK=0?); pick another port (export MASTER_PORT=N; the Slurm scripts derive "
                f"it from the job id)"
            ) from None
        if serve:  # (the schema keeps timeouts >= 1 s; anything else torch raises here is still one line)
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
            raise RendezvousError(
                f"rank 0: cannot serve the rendezvous store on {host}:{port}: {first[:200]}; check MASTER_ADDR/"
                f"MASTER_PORT and distributed.rendezvous_timeout_s"
            ) from None
        raise RendezvousError(
            f"rank {rank}: rank 0's rendezvous store at {host}:{port} did not answer within {timeout_s:g} s "
            f"(distributed.rendezvous_timeout_s); is rank 0 running, and do MASTER_ADDR/MASTER_PORT name "
            f"its node and port?"
        ) from None


def _digest(rec: dict) -> str:
    return hashlib.sha256(json.dumps(rec["inputs"], sort_keys=True, default=str).encode()).hexdigest()


def agree(
    store, cfg, rank: int, world: int, local_world: Optional[int], timeout_s: float, stop: Optional[Callable] = None
) -> None:
    """Post this rank's record and wait for rank 0's verdict (rank 0: compute it). Raises
    RendezvousError (the line to print) or PeerRefused (rank 0 prints); returns when all agree.
    ``stop()`` returns a stop signal's number once one came (then the waiting ends), else None.

    Rank 0 posts the digest of its inputs (and the inputs); every other rank compares its own with
    them and posts only its rank and, when they differ, the line naming the difference: rank 0
    reads one short record per rank, whatever the config's size."""
    stop = stop or (lambda: None)
    pre = PREFIX + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") + "/"
    mine = record(cfg, rank, world, local_world)
    if rank == 0:
        store.set(pre + "ref", json.dumps(mine, default=str))
        store.set(pre + "ref_digest", _digest(mine))
        _arbitrate(store, pre, world, timeout_s, stop)
        return
    try:
        _wait_key(store, pre + "ref_digest", rank, timeout_s, stop)
        diff = None
        if store.get(pre + "ref_digest").decode() != _digest(mine):
            diff = first_difference(json.loads(store.get(pre + "ref")), mine)
        n = store.add(pre + "arrived", 1)
        store.set(f"{pre}arrival/{n}", json.dumps({"rank": rank, "diff": diff}))
        _wait_key(store, pre + "verdict", rank, timeout_s + 10.0, stop)  # rank 0 decides within its timeout_s
        verdict = store.get(pre + "verdict").decode()
    except RendezvousError:
        raise
    except Exception:
        raise RendezvousError(f"rank {rank}: rank 0 left the rendezvous before the job started") from None
    try:
        store.add(pre + "seen", 1)
    except Exception:  # the verdict is read: rank 0 may leave now
        pass
    if verdict != "ok":
        raise PeerRefused(verdict)


def _wait_key(store, key: str, rank: int, timeout_s: float, stop: Callable) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.check([key]):
        if stop():
            raise RendezvousStopped(stop(), f"on rank {rank} while waiting for rank 0's rendezvous")
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"rank {rank}: rank 0 gave no answer within {timeout_s:g} s (distributed.rendezvous_timeout_s)"
            )
        time.sleep(POLL_S)


def _missing(came: set, world: int) -> str:
    missing = []
    for r in range(world):
        if r not in came:
            missing.append(r)
            if len(missing) > 8:
                break
    n = world - len(came)
    return ", ".join(map(str, missing[:8])) + (f" and {n - 8} more" if n > 8 else "")


def _arbitrate(store, pre: str, world: int, timeout_s: float, stop: Callable) -> None:
    came = {0}
    read = 0
    problem, stopped = None, None
    deadline = time.monotonic() + timeout_s
    while problem is None and len(came) < world:
        n = store.add(pre + "arrived", 0)
        if n > read:  # every rank sets its record right after it takes its arrival number
            keys = [f"{pre}arrival/{i}" for i in range(read + 1, n + 1)]
            for raw in store.multi_get(keys):
                rec = json.loads(raw)
                r = rec["rank"]
                if rec["diff"] is not None:
                    problem = (
                        f"the ranks' inputs differ: {rec['diff']}; every rank must run the same code, config "
                        f"files, --set options and launcher variables"
                    )
                elif r in came:
                    problem = f"two processes have RANK={r}; every process of the job needs its own rank 0..{world - 1}"
                elif not 0 <= r < world:
                    problem = f"a process has RANK={r}, outside WORLD_SIZE={world}"
                came.add(r)
                if problem is not None:
                    break
            read = n
        if problem is None and len(came) < world:
            if stop():
                stopped = RendezvousStopped(
                    stop(), f"on rank 0 while waiting for rank(s) {_missing(came, world)} to join"
                )
                problem = str(stopped)  # the verdict the others read
            elif time.monotonic() > deadline:
                problem = (
                    f"rank(s) {_missing(came, world)} of {world} did not join within {timeout_s:g} s "
                    f"(distributed.rendezvous_timeout_s); did they start, and with the same MASTER_ADDR/MASTER_PORT?"
                )
            else:
                time.sleep(POLL_S)
    store.set(pre + "verdict", "ok" if problem is None else problem)
    # keep the store up until the ranks that came have read the verdict (at most 3 s): also on "ok",
    # after which every rank may refuse the same topology, and rank 0 leaving would take the store
    t0 = time.monotonic()
    while store.add(pre + "seen", 0) < read and time.monotonic() - t0 < 3:
        time.sleep(POLL_S)
    if problem is None:
        return
    if stopped is not None:
        raise stopped
    raise RendezvousError(problem)
