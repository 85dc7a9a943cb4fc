"""Collectives over explicit groups, with bytes sent counted per link level.

Every collective a rank issues goes through :class:`Comm`, which knows the topology and charges
the bytes this rank sends (``volumes.ring_bytes``, docs/design.md §4.8) to the widest level its group
spans: ``intra_gpu``, ``intra_node`` or ``inter_node``. Scalar control traffic (overflow flags,
norms) is charged to ``control`` so the volume counters match the formulas exactly. With a
``trace_dir`` every collective is also written, as it is issued, to the rank's collective trace
(:mod:`.trace`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from ..topology import LEVELS, Topology
from .trace import CollectiveTrace
from .volumes import ring_bytes

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
    """An in-flight collective plus work to finish after it (dequantize, accumulate).

    Nothing here asks whether a collective has completed: when a collective is launched must
    never depend on another's progress, which differs between ranks, or ranks would issue
    collectives on different communicators in different orders (docs/design.md §4.7)."""

    def __init__(self, works: list[Optional[dist.Work]], then: Optional[Callable[[], Any]] = None) -> None:
        self._works = works
        self._then = then
        self.done = False
        self.result: Any = None

    def advance(self) -> bool:
        """Launch the next stage (waiting for this one first); True when a stage was launched. A
        one-stage handle has none."""
        return False

    def wait(self) -> Any:
        """Wait for the collectives, run the finishing work once and return its result."""
        if not self.done:
            for w in self._works:
                if w is not None:
                    w.wait()
            self.result = self._then() if self._then else None
            self.done = True
            # drop the finishing work and the works: a two-stage handle's ``then`` is its own bound
            # method, a reference cycle that would keep every buffer it holds (send and receive
            # buffers of both stages) alive until Python's cyclic collector happens to run
            self._then, self._works = None, []
        return self.result


class TwoStageHandle(Handle):
    """Two dependent collectives (ZeRO++'s 2-hop reduction, the quantized combine): the second
    stage, ``launch_second``, goes out when the owner calls ``advance`` (at a point fixed by program
    position, the same on every rank), after waiting for the first stage; ``then`` finishes."""

    def __init__(
        self,
        first: list[Optional[dist.Work]],
        launch_second: Callable[[], list[Optional[dist.Work]]],
        then: Callable[[], Any],
    ) -> None:
        super().__init__([], then)
        self._first = first
        self._launch_second = launch_second
        self.second_launched = False

    def advance(self) -> bool:
        if self.second_launched:
            return False
        for w in self._first:
            if w is not None:
                w.wait()
        self._works = self._launch_second()
        self.second_launched = True
        self._launch_second, self._first = None, []  # no cycle through a bound method (see wait)
        return True

    def wait(self) -> Any:
        self.advance()
        return super().wait()


class Comm:
    """``device`` is where every tensor handed to a collective must live (the runtime device:
    NCCL/RCCL refuse host tensors). With ``strict`` each collective checks it, so a host tensor
    fails on CPU exactly where it would fail on a GPU. ``timeout``: every process group it creates
    gets it (``distributed.collective_timeout_s``; without it a subgroup gets PyTorch's default, not
    the run's). ``trace_dir``: write the collective trace there (``distributed.trace_collectives``)."""

    def __init__(
        self,
        topo: Topology,
        rank: int,
        distributed: bool = True,
        device: torch.device | str = "cpu",
        strict: bool = False,
        timeout: Optional[datetime.timedelta] = None,
        trace_dir: Optional[str] = None,
    ) -> None:
        self.topo = topo
        self.rank = rank
        self.distributed = distributed and dist.is_available() and dist.is_initialized()
        self.device = torch.device(device)
        self.strict = strict
        self.timeout = timeout
        self.trace = CollectiveTrace(trace_dir, rank) if trace_dir else None
        self.bytes = {lvl: 0 for lvl in (*LEVELS, "control")}
        self._cache: dict[tuple, Group] = {}
        self._created: list[tuple] = []  # partition keys, in creation order

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
                    handle = dist.new_group(list(g), timeout=self.timeout)
            if self.rank in g:
                mine = Group(g, handle, self.topo.level(g))
        if mine is None:
            raise ValueError(f"rank {self.rank} is in no group of the partition")
        self._cache[key] = mine
        self._created.append(key)
        return mine

    def group_mark(self) -> int:
        """A mark for :meth:`destroy_groups_since` (how many partitions exist now)."""
        return len(self._created)

    def destroy_groups_since(self, mark: int) -> None:
        """Destroy the process groups of every partition created since ``mark``, in creation order
        (every rank calls this at the same point: destroying a communicator may be collective),
        and forget them; the world group stays. Nothing may still be in flight on them: a barrier
        first, so no peer is still receiving on a communicator this rank tears down."""
        if any(self._cache[k].handle not in (None, dist.group.WORLD) for k in self._created[mark:]):
            self.barrier()
        for key in self._created[mark:]:
            grp = self._cache.pop(key)
            if self.distributed and grp.handle is not None and grp.handle is not dist.group.WORLD:
                dist.destroy_process_group(grp.handle)
        del self._created[mark:]

    def _issue(self, op: str, group: Group, buffer_bytes: int, dtype: torch.dtype) -> None:
        """Record a collective in the trace as it is issued (before it can block)."""
        if self.trace is not None:
            self.trace.record(op, group.ranks, buffer_bytes, dtype)

    def _charge(self, group: Group, nbytes: int, control: bool = False, *tensors: torch.Tensor) -> None:
        if self.strict:
            for t in tensors:
                if t.device != self.device:
                    raise RuntimeError(
                        f"collective on a {t.device} tensor; this process group's device is {self.device}"
                    )
        if group.size > 1:
            self.bytes["control" if control else group.level] += int(nbytes)

    @property
    def world(self) -> Group:
        return self.partition([list(range(self.topo.world_size))])

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """Copy a (small) device tensor to the host; a meta tensor (dry run) reads as zeros."""
        if t.device.type == "meta":
            return torch.zeros(t.shape, dtype=t.dtype)
        return t.detach().cpu()

    def barrier(self) -> None:
        """Every rank waits for every other: a one-element all-reduce on the runtime device,
        read back on the host (works on gloo, NCCL/RCCL and the fake process group alike)."""
        if self.distributed and self.topo.world_size > 1:
            t = torch.zeros(1, device=self.device)
            self.all_reduce(t, self.world, account=False)
            self.to_host(t)

    def all_reduce_host(
        self,
        values: Iterable[float],
        group: Optional[Group] = None,
        op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
        dtype: torch.dtype = torch.float64,
    ) -> list[float]:
        """All-reduce a few Python numbers through a device tensor (not counted: bookkeeping
        such as logged losses and counters); returns Python floats."""
        t = torch.tensor(list(values), dtype=dtype, device=self.device)
        if self.distributed:
            self.all_reduce(t, group or self.world, op=op, account=False)
        return self.to_host(t).tolist()

    def reset_counters(self) -> dict[str, int]:
        out = dict(self.bytes)
        for k in self.bytes:
            self.bytes[k] = 0
        return out

    # -------------------------------------------------------------------------- collectives
    def all_gather(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op: bool = False, account: bool = True
    ) -> Optional[dist.Work]:
        """``out`` = concat over group order of every member's ``inp``."""
        d = group.size
        if d == 1:
            out.copy_(inp.view_as(out))
            return None
        S = inp.numel() * inp.element_size() * d
        self._charge(group, ring_bytes("all_gather", S, d) if account else 0, False, out, inp)
        self._issue("all_gather", group, S, inp.dtype)
        return _all_gather(out, inp, group=group.handle, async_op=async_op)

    def reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op: bool = False
    ) -> Optional[dist.Work]:
        d = group.size
        if d == 1:
            out.copy_(inp.view_as(out))
            return None
        self._charge(group, ring_bytes("reduce_scatter", inp.numel() * inp.element_size(), d), False, out, inp)
        self._issue("reduce_scatter", group, inp.numel() * inp.element_size(), inp.dtype)
        return _reduce_scatter(out, inp, group=group.handle, async_op=async_op)

    def all_to_all(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, async_op: bool = False
    ) -> Optional[dist.Work]:
        d = group.size
        if d == 1:
            out.copy_(inp)
            return None
        self._charge(group, ring_bytes("all_to_all", inp.numel() * inp.element_size(), d), False, out, inp)
        self._issue("all_to_all", group, inp.numel() * inp.element_size(), inp.dtype)
        return dist.all_to_all_single(out, inp, group=group.handle, async_op=async_op)

    def all_reduce(
        self,
        t: torch.Tensor,
        group: Group,
        op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
        async_op: bool = False,
        control: bool = False,
        account: bool = True,
    ) -> Optional[dist.Work]:
        d = group.size
        if d == 1:
            return None
        self._charge(group, ring_bytes("all_reduce", t.numel() * t.element_size(), d) if account else 0, control, t)
        self._issue("all_reduce", group, t.numel() * t.element_size(), t.dtype)
        return dist.all_reduce(t, op=op, group=group.handle, async_op=async_op)
