"""Fault injection for reliability tests (never active in a normal run).

``MEGATRON_TOPO_FAULT`` holds one or more faults separated by ``;``::

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

With the variable set, :func:`install` wraps the trainer's per-micro-batch loss and backward; the
normal loop calls nothing here. Checkpoint saving calls :func:`maybe_fail` at its two kill points (the
trainer hands it to ``checkpoint.save`` as its ``fault`` callback).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import Optional

from ..config.options import ConfigError
from ..safe_files import excerpt

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
    out = []
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        kind, *fields = item.split(":")
        if kind not in KINDS:
            raise ConfigError(f"{ENV}: fault {excerpt(kind)} in {excerpt(item)} is unknown; valid: {', '.join(KINDS)}")
        kw: dict = {}
        for f in fields:
            key, sep, val = f.partition("=")
            if not sep or key not in ("rank", "step", "at", "unit", "count", "where"):
                raise ConfigError(
                    f"{ENV}: {excerpt(f)} in {excerpt(item)} is not valid; use rank=, step=, at=, unit=, count=, where="
                )
            if key in ("at", "where"):
                kw[key] = val
            else:
                try:
                    if not val.isascii():  # ASCII digits only: int() also reads '٣' and '３'
                        raise ValueError(val)
                    kw[key] = int(val)
                except ValueError:
                    raise ConfigError(f"{ENV}: {key}={excerpt(val)} in {excerpt(item)} is not an integer") from None
        if "step" not in kw:
            raise ConfigError(f"{ENV}: {excerpt(item)} needs step=N")
        if kw.get("at", "step") not in POINTS:
            raise ConfigError(
                f"{ENV}: at={excerpt(kw['at'])} in {excerpt(item)} is not valid; use one of {', '.join(POINTS)}"
            )
        if kw.get("where", "grad") not in ("grad", "loss"):
            raise ConfigError(f"{ENV}: where={excerpt(kw['where'])} in {excerpt(item)} is not valid; use grad or loss")
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


def install(trainer) -> None:
    """With ``MEGATRON_TOPO_FAULT`` set, wrap ``trainer``'s micro-batch hooks (``_loss``,
    ``_backward``) so the faults hit; without it, leave the trainer as it is."""
    if not active():
        return
    rank, loss_of, backward = trainer.rt.rank, trainer._loss, trainer._backward

    def _loss(x, y):
        return corrupt_loss(trainer.state.step + 1, loss_of(x, y), rank)

    def _backward(loss, m: int, accum: int) -> None:
        before_backward(trainer.state.step + 1, m, accum, trainer.engine, rank)
        backward(loss, m, accum)

    trainer._loss, trainer._backward = _loss, _backward
