"""One optimizer step: forward and backward of each micro-batch, then the engine's step. The
trainer (:meth:`~megatron_topo.training.Trainer.train_step`) and preset auto's timed trials
(:func:`~megatron_topo.training.auto_trials.time_plan`) both run it, so a trial times the step the
run trains."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .batches import loss_fn

Micro = Callable[[int], "tuple[torch.Tensor, torch.Tensor]"]


def run_step(
    engine,
    micro: Micro,
    accum: int,
    lr: float,
    *,
    loss_of: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    backward: Optional[Callable[[torch.Tensor, int, int], None]] = None,
    stop: Optional[Callable[[], bool]] = None,
    before_step: Optional[Callable[[], None]] = None,
) -> Optional[dict]:
    """Accumulate ``accum`` micro-batches (``micro(m)``: inputs and targets of micro-batch ``m``)
    and step the engine at ``lr``. Returns the engine's step record with ``lr`` and ``loss`` (the
    mean of the micro-batches' losses, a device tensor), or None when ``stop()`` (asked before
    every micro-batch but the first) says to stop: the step's gradients are then partial and the
    caller discards them. ``loss_of(x, y)`` and ``backward(loss, m, accum)`` default to the loss
    of the engine's output and the engine's backward of ``loss / accum``; ``before_step`` runs
    after the last backward."""
    loss_of = loss_of or (lambda x, y: loss_fn(engine(x), y))
    backward = backward or (lambda loss, m, n: engine.backward(loss / n, last_micro_batch=m == n - 1))
    engine.train()
    losses = []
    for m in range(accum):
        if m and stop is not None and stop():
            return None
        x, y = micro(m)
        loss = loss_of(x, y)
        losses.append(loss.detach())
        backward(loss, m, accum)
    if before_step is not None:
        before_step()
    stats = engine.step(lr)
    stats["lr"] = lr
    stats["loss"] = torch.stack(losses).float().mean()
    return stats
