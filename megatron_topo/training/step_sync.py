"""The collectives the training loop runs after an optimizer step besides the engine's own: the
pipelined stop/save agreement (:meth:`megatron_topo.lifecycle.Lifecycle.poll`) and the reduction of
the logged loss and traffic counters. Both go through a tensor on the runtime device (NCCL/RCCL
reduce no CPU tensors) and are left out of the traffic counters they report."""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.distributed as dist

from .. import lifecycle
from ..zero_topo.comm import Comm
from .runtime import Runtime


def start_reduce_max(comm: Comm, device: torch.device, values: list) -> Callable[[], list]:
    """Launch a MAX all-reduce of a few numbers over all ranks; returns a function that waits for
    it and returns the values."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    work = comm.all_reduce(t, comm.world, op=dist.ReduceOp.MAX, async_op=True, account=False)

    def finish() -> list:
        if work is not None:
            work.wait()
        return comm.to_host(t).tolist()

    return finish


def agreement(
    comm: Comm, rt: Runtime, signals: lifecycle.StopSignals, save_interval_minutes: float = 0.0
) -> lifecycle.Lifecycle:
    """The per-step stop/save agreement over ``comm``'s world (pipelined by one step; local in a
    single process)."""
    return lifecycle.Lifecycle(
        signals,
        save_interval_minutes,
        rank=rt.rank,
        start_reduce_max=(functools.partial(start_reduce_max, comm, rt.device) if rt.distributed else None),
    )


def reduce_log(comm: Comm, world_size: int, loss_sum: torch.Tensor, comm_bytes: dict) -> tuple[float, dict]:
    """Mean loss and summed traffic counters over ranks: one all-reduce of a device tensor."""
    loss = comm.to_host(loss_sum.reshape(1).double()).item()
    vec = comm.all_reduce_host(
        [loss, comm_bytes["intra_gpu"], comm_bytes["intra_node"], comm_bytes["inter_node"], comm_bytes["control"]]
    )
    return vec[0] / world_size, {
        "comm_bytes_intra_gpu": int(vec[1]),
        "comm_bytes_intra_node": int(vec[2]),
        "comm_bytes_inter_node": int(vec[3]),
        "comm_bytes_control": int(vec[4]),
    }
