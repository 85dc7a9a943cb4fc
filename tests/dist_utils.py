"""Run a function on N local processes over gloo and collect what each returns."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, outdir):
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(("ok", result), f)
    except BaseException:
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(("error", traceback.format_exc()), f)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world: int, *args):
    """Returns the list of per-rank results; raises with the first rank's traceback on error."""
    with tempfile.TemporaryDirectory() as outdir:
        try:
            mp.start_processes(
                _worker, args=(world, free_port(), fn, args, outdir), nprocs=world, join=True, start_method="fork"
            )
        except Exception:
            pass
        results = []
        for r in range(world):
            path = os.path.join(outdir, f"{r}.pkl")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} produced no result")
            with open(path, "rb") as f:
                status, val = pickle.load(f)
            if status != "ok":
                raise RuntimeError(f"rank {r} failed:\n{val}")
            results.append(val)
        return results
