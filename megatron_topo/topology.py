"""Cluster topology: levels gcd ⊂ gpu ⊂ node ⊂ world, rank <-> coordinates, link levels.

Ranks are node-major: ``rank = ((node * gpus_per_node) + gpu) * gcds_per_gpu + gcd``. The topology
is read from the config and the launcher's variables, never from ``torch.cuda.device_count()``
(under ``srun --gpus-per-task=1`` every task sees a single device).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .config.options import ConfigError
from .config.schema import TopologyConfig
from .safe_files import excerpt

LEVELS = ("intra_gpu", "intra_node", "inter_node")


@dataclass(frozen=True)
class Topology:
    world_size: int
    gcds_per_gpu: int
    gpus_per_node: int

    def __post_init__(self):
        for name in ("world_size", "gcds_per_gpu", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ConfigError(f"topology.{name} must be >= 1, got {getattr(self, name)}")
        if self.world_size % self.ranks_per_node:
            raise ConfigError(
                f"world size {self.world_size} is not a multiple of ranks per node "
                f"{self.ranks_per_node} (topology.gpus_per_node={self.gpus_per_node} x "
                f"topology.gcds_per_gpu={self.gcds_per_gpu}); valid gpus_per_node here: "
                f"{_divisors_str(self.world_size, self.gcds_per_gpu)}"
            )

    @property
    def ranks_per_node(self) -> int:
        return self.gcds_per_gpu * self.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(node, gpu within node, gcd within gpu) of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        gcd = rank % self.gcds_per_gpu
        gpu = (rank // self.gcds_per_gpu) % self.gpus_per_node
        node = rank // self.ranks_per_node
        return node, gpu, gcd

    def rank_of(self, node: int, gpu: int, gcd: int) -> int:
        return (node * self.gpus_per_node + gpu) * self.gcds_per_gpu + gcd

    def level(self, ranks: Sequence[int]) -> str:
        """The widest link level a group spans: intra_gpu, intra_node or inter_node."""
        nodes = {r // self.ranks_per_node for r in ranks}
        if len(nodes) > 1:
            return "inter_node"
        gpus = {r // self.gcds_per_gpu for r in ranks}
        return "intra_gpu" if len(gpus) == 1 else "intra_node"

    def describe(self) -> str:
        return (
            f"{self.num_nodes} node(s) x {self.gpus_per_node} GPU(s) x {self.gcds_per_gpu} GCD(s) "
            f"= {self.world_size} ranks"
        )


def _divisors_str(world: int, gcds: int) -> str:
    ds = [g for g in range(1, world // gcds + 1) if world % (g * gcds) == 0]
    return ", ".join(map(str, ds)) if ds else "none (gcds_per_gpu does not divide the world size)"


class JobWideError(ConfigError):
    """A launcher variable that every rank of the job is given with the same value (WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, SLURM_NTASKS, SLURM_NNODES ...) is wrong: every rank would print the
    same line, so only rank 0 of a job prints it (``job_wide``: cli.fail, train.report_once, via
    cli.other_rank_of_job). A variable of one rank or node (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE) is
    a plain ConfigError, printed by the rank that has it."""

    job_wide = True


_JOB_WIDE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES")


@contextmanager
def every_rank_finds():
    """Mark a ConfigError raised inside as job-wide (``job_wide``): an error found from what every
    rank of the job reads alike (the argv, the config files and ``--set`` options, the job's
    launcher variables: a bad key, a bad value, a topology that does not fit the world), before any
    rank meets another. Every rank reaches the same verdict at the same point, so rank 0 prints the
    line and the other ranks exit with the same status silently (cli.fail, train.report_once via
    cli.other_rank_of_job); none enters the rendezvous, so none waits for a rank that left."""
    try:
        yield
    except ConfigError as e:
        e.job_wide = True
        raise


def launcher_env(env: Optional[Mapping[str, str]] = None) -> dict:
    """Rank, world size, local rank and local world size from torchrun or Slurm variables; a
    variable that is not a whole number is one ConfigError naming it (JobWideError for the job's)."""
    env = os.environ if env is None else env

    def first(*names, default=None):
        for n in names:
            if env.get(n) not in (None, ""):
                text = str(env[n]).split("(")[0].split(",")[0]  # SLURM_NTASKS_PER_NODE: "2(x3),1"
                # ASCII digits only, as config values and tool flags (isdecimal also takes '٣')
                if not (text.strip().lstrip("+-").isdecimal() and text.isascii() and len(text) <= 24):
                    err = JobWideError if n in _JOB_WIDE_VARS else ConfigError
                    raise err(
                        f"launcher environment: {n}={excerpt(env[n], 24)} is not an integer of at most 24 digits "
                        f"(WORLD_SIZE, RANK, LOCAL_RANK must be integers)"
                    )
                return int(text)
        return default

    world = first("WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", default=1)
    rank = first("RANK", "SLURM_PROCID", default=0)
    local_rank = first("LOCAL_RANK", "SLURM_LOCALID", default=0)
    local_world = first("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=None)
    if local_world is None and env.get("SLURM_NNODES"):
        nodes = first("SLURM_NNODES")
        if not 1 <= nodes <= world:  # -1 was taken as 1; more nodes than tasks gave 0 ranks per node
            raise JobWideError(
                f"launcher environment: SLURM_NNODES={show_int(nodes)} is not a node count of this job; "
                f"valid: 1..{show_int(world)} (at most one node per task)"
            )
        local_world = world // nodes
    _check_launcher_env(env, world, local_rank, local_world)
    return {"world_size": world, "rank": rank, "local_rank": local_rank, "local_world_size": local_world}


def show_int(n: int) -> str:
    """An integer for an error line: in full up to 24 digits, else a short excerpt."""
    s = str(n)
    return s if len(s) <= 24 else excerpt(s, 24)


MAX_WORLD_SIZE = 1 << 20  # more ranks than any machine has (predict_perf's --gcds stops at 1,000,000)


def _check_launcher_env(env: Mapping[str, str], world: int, local_rank: int, local_world: Optional[int]) -> None:
    """What the launcher variables must say together (ConfigError, one line): a world of several
    ranks names this process's rank (else every process would be rank 0 and wait for the others
    forever), and the local rank lies within the ranks of this node."""
    has = lambda *names: any(env.get(n) not in (None, "") for n in names)  # noqa: E731
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise JobWideError(
            f"launcher environment: WORLD_SIZE={show_int(world)} must lie in 1..{MAX_WORLD_SIZE:,} (2**20)"
        )
    if local_world is not None and local_world > world:
        raise ConfigError(
            f"launcher environment: LOCAL_WORLD_SIZE={show_int(local_world)} is more than "
            f"WORLD_SIZE={world}; valid: 1..{world} (the ranks on this node)"
        )
    if world > 1 and not has("RANK", "SLURM_PROCID"):
        raise ConfigError(
            f"launcher environment: WORLD_SIZE={world} but RANK is not set; each of the {world} "
            f"processes needs its RANK (torchrun and srun set both)"
        )
    if local_world is not None and local_world < 1:
        raise ConfigError(
            f"launcher environment: LOCAL_WORLD_SIZE={local_world}; it must be >= 1 (the ranks on this node)"
        )
    if local_rank < 0 or (local_world is not None and local_rank >= local_world):
        valid = f"0..{local_world - 1}" if local_world else ">= 0"
        raise ConfigError(f"launcher environment: LOCAL_RANK={local_rank} is not a rank on this node; valid: {valid}")


def topology_from_config(cfg: TopologyConfig, world_size: int, local_world_size: Optional[int] = None) -> Topology:
    """Build the topology; ``gpus_per_node`` defaults to the launcher's ranks per node."""
    gcds = cfg.gcds_per_gpu
    if world_size % gcds:
        raise ConfigError(
            f"topology.gcds_per_gpu={gcds} does not divide the world size {world_size}; "
            f"valid: a divisor of {world_size}"
        )
    gpus = cfg.gpus_per_node
    if gpus is None:
        per_node = local_world_size or world_size
        if per_node % gcds:
            raise ConfigError(
                f"topology.gcds_per_gpu={gcds} does not divide the {per_node} ranks per node; "
                f"set topology.gpus_per_node explicitly"
            )
        gpus = per_node // gcds
    return Topology(world_size=world_size, gcds_per_gpu=gcds, gpus_per_node=gpus)
