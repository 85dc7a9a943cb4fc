"""Collectives over explicit groups, with bytes sent counted per link level.

Every collective a rank issues goes through :class:`Comm`, which knows the topology and charges
the bytes this rank sends (ring algorithm of record, DESIGN §4) to the widest level its group
spans: ``intra_gpu``, ``intra_node`` or ``inter_node``. Scalar control traffic (overflow flags,
norms) is charged to ``control`` so the volume counters match the formulas exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from ..topology import LEVELS, Topology

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Group:
    """One process group this rank belongs to: its ranks (sorted), handle and link level."""

    ranks: tuple[int, ...]
    handle: Optional[object]
    level: str

    @property
    def size(self) -> int:
        return len(self.ranks)

    def index(self, rank: int) -> int:
        return self.ranks.index(rank)


class Handle:
    """An in-flight collective plus work to finish after it (dequantize, accumulate)."""

    def __init__(self, works: list, then: Optional[Callable[[], object]] = None):
        self._works = works
        self._then = then
        self.done = False
        self.result = None

    def wait(self):
        if not self.done:
            for w in self._works:
                if w is not None:
                    w.wait()
            self.result = self._then() if self._then else None
            self.done = True
        return self.result


class Comm:
    def __init__(self, topo: Topology, rank: int, distributed: bool = True):
        self.topo = topo
        self.rank = rank
        self.distributed = distributed and dist.is_available() and dist.is_initialized()
        self.bytes = {lvl: 0 for lvl in (*LEVELS, "control")}
        self._cache: dict[tuple, Group] = {}

    # -------------------------------------------------------------------------- groups
    def partition(self, groups: Sequence[Sequence[int]]) -> Group:
        """Create every group of a partition of the world (all ranks must call this in the
        same order) and return the one containing this rank."""
        key = tuple(tuple(sorted(g)) for g in groups)
        if key in self._cache:
            return self._cache[key]
        mine = None
        for g in key:
            handle = None
            if self.distributed and len(g) > 1:
                if len(g) == self.topo.world_size:
                    handle = dist.group.WORLD
                else:
                    handle = dist.new_group(list(g))
            if self.rank in g:
                mine = Group(g, handle, self.topo.level(g))
        if mine is None:
            raise ValueError(f"rank {self.rank} is in no group of the partition")
        self._cache[key] = mine
        return mine

    def _charge(self, group: Group, nbytes: int, control: bool = False):
        if group.size > 1:
            self.bytes["control" if control else group.level] += int(nbytes)

    def reset_counters(self) -> dict:
        out = dict(self.bytes)
        for k in self.bytes:
            self.bytes[k] = 0
        return out

    # -------------------------------------------------------------------------- collectives
    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False):
        """``out`` = concat over group order of every member's ``inp``."""
        d = group.size
        if d == 1:
            out.copy_(inp.view_as(out))
            return None
        self._charge(group, inp.numel() * inp.element_size() * (d - 1))
        return _all_gather(out, inp, group=group.handle, async_op=async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False):
        d = group.size
        if d == 1:
            out.copy_(inp.view_as(out))
            return None
        self._charge(group, inp.numel() * inp.element_size() * (d - 1) // d)
        return _reduce_scatter(out, inp, group=group.handle, async_op=async_op)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op=False):
        d = group.size
        if d == 1:
            out.copy_(inp)
            return None
        self._charge(group, inp.numel() * inp.element_size() * (d - 1) // d)
        return dist.all_to_all_single(out, inp, group=group.handle, async_op=async_op)

    def all_reduce(self, t: torch.Tensor, group: Group, op=dist.ReduceOp.SUM, async_op=False,
                   control: bool = False):
        d = group.size
        if d == 1:
            return None
        self._charge(group, 2 * t.numel() * t.element_size() * (d - 1) // d, control)
        return dist.all_reduce(t, op=op, group=group.handle, async_op=async_op)
