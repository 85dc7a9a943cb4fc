"""The process's place in the job: rank, world, device, topology, the process group and the
heartbeat that names a vanished rank."""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ..config import Config, ConfigError
from ..topology import JobWideError, Topology, every_rank_finds, launcher_env, show_int, topology_from_config
from .heartbeat import Heartbeat


@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    topo: Topology
    device: torch.device
    distributed: bool
    heartbeat: Optional[object] = None  # heartbeat.Heartbeat: names a vanished rank when a collective fails
    strict: bool = False  # Comm checks that every collective's tensors live on ``device``


def setup_runtime(cfg: Config, stop=None) -> Runtime:
    """The process's place in the job; distributed, after a rendezvous where the ranks agree on
    their inputs (training.rendezvous). ``stop()``: a stop signal's number once one came (it ends
    the rendezvous wait), else None."""
    try:
        env = launcher_env()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"launcher environment: {e} (WORLD_SIZE, RANK, LOCAL_RANK must be integers)") from None
    world, rank = env["world_size"], env["rank"]
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"launcher environment: RANK={show_int(rank)} is outside WORLD_SIZE={world}; valid ranks 0..{world - 1}"
        )

    def topology() -> Topology:
        # needs only the config and the launcher's variables: with the ranks agreed on those, a misfit
        # stops every rank at the same point (rank 0 prints it), before init_process_group; checked
        # after it, the ranks still connecting waited in gloo for the ranks that had left
        with every_rank_finds():
            return topology_from_config(cfg.topology, world, env["local_world_size"])

    topo = None
    dcfg = cfg.distributed
    use_cuda = dcfg.device == "cuda" or (dcfg.device == "auto" and torch.cuda.is_available())
    if dcfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("distributed.device=cuda but no GPU is visible; use cpu or auto")
    if use_cuda:
        # under srun --gpus-per-task=1 each task sees one device; otherwise pick by local rank
        torch.cuda.set_device(env["local_rank"] % max(1, torch.cuda.device_count()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    distributed = world > 1
    if distributed and not dist.is_initialized():
        backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(var):
                raise JobWideError(f"{var} is not set; launch with torchrun, srun (see slurm/) or set it")
        port = str(os.environ["MASTER_PORT"])
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:  # '²' isdigit, int() refuses
            raise JobWideError(
                f"MASTER_PORT={port!r} is not a port number (valid: 1..65535; the Slurm scripts pick one per job)"
            )
        try:  # an unknown host: torch would retry the rendezvous until its timeout
            import socket

            socket.getaddrinfo(os.environ["MASTER_ADDR"], int(port))
        except (OSError, UnicodeError) as e:
            raise JobWideError(
                f"MASTER_ADDR={os.environ['MASTER_ADDR'][:80]!r} cannot be resolved ({e}); set it to "
                f"the host name or address of rank 0's node"
            ) from None
        from . import rendezvous

        store = rendezvous.connect(rank, os.environ["MASTER_ADDR"], int(port), dcfg.rendezvous_timeout_s, stop)
        # before any collective: the ranks agree on the world, the config and the code, or stop with one line
        rendezvous.agree(store, cfg, rank, world, env["local_world_size"], dcfg.rendezvous_timeout_s, stop)
        # the same world, config and LOCAL_WORLD_SIZE on every rank now: the same topology verdict
        # (before the rendezvous, a rank with another WORLD_SIZE would have left without naming it)
        topo = topology()
        store.set_timeout(datetime.timedelta(seconds=dcfg.collective_timeout_s))
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=dcfg.collective_timeout_s),
            device_id=bound_device(backend, device),
        )
    if topo is None:
        topo = topology()
    heartbeat = Heartbeat.start(rank, world) if distributed else None
    return Runtime(rank, world, env["local_rank"], topo, device, distributed, heartbeat)


def bound_device(backend: str, device: torch.device) -> Optional[torch.device]:
    """The ``device_id`` that init_process_group binds: a GPU under NCCL/RCCL (its communicator is
    made at once and each new_group splits it). None under gloo, also with GPU tensors: a bound
    gloo group makes new_group call ProcessGroupGloo.perform_nocolor_split, which does not exist
    (AttributeError at the engine's first subgroup; seen on an H200 with torch 2.11, 2026-11-27)."""
    return device if device.type == "cuda" and backend == "nccl" else None


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
