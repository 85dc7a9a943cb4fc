"""ZeroTopoEngine: wraps a plain model from outside and runs one sharding plan.

Usage (what training/trainer.py does)::

    engine = ZeroTopoEngine(model, model.shard_units(), plan, comm, precision="bf16", ...)
    for micro_batch in step:
        loss = loss_fn(engine.module(x), y) / accumulation
        engine.backward(loss)
    stats = engine.step(lr)          # combine, clip, AdamW on shards, publish, invalidate

Forward: a pre-hook gathers a unit (prefetching the next one), a post-hook frees it and arms a
hook on its output that gathers it again -- from the secondary copy -- when backward reaches it.
Backward: once every parameter of a unit has its gradient, the unit's gradient is reduced
asynchronously into the fp32 gradient shard; a unit's reduction is finished when the reduction
``max_in_flight`` units later has been launched, the rest at the end of ``backward``. On the last
micro-batch of a step (``backward(loss, last_micro_batch=True)``) each unit's cross-replica combine
is launched when its reduction is finished, overlapping the rest of backward; a combine that
allocates buffers (INT8, or a 16-bit wire copy) is finished, oldest first, when
``max_combines_in_flight`` later ones hold theirs and one more would start. Every launch point is
fixed by program position, never by whether a collective has completed, so every rank issues the
same collectives in the same order (docs/design.md §4.7). Step: the post-update all-gather that
rebuilds primary shards runs in the background and each unit waits for its own at its next gather,
so it overlaps the next forward.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from . import engine_state, memory, traffic
from . import layout as L
from .comm import Comm
from .optimizer import ShardedAdamW
from .scaler import LossScaler
from .sharding import Plan
from .unit import ShardedUnit, UnitGroups
from .unit_params import assign_parameters, tie_borrowed
from .unit_params import tensors as output_tensors

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_COMBINES_IN_FLIGHT = 4  # zero_topo.max_combines_in_flight's default (0: unbounded)


class ZeroTopoEngine:
    def __init__(
        self,
        model: nn.Module,
        units: Sequence[nn.Module],
        plan: Plan,
        comm: Comm,
        *,
        precision: str = "fp32",
        lr: float = 1e-3,
        betas: Sequence[float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grad_clip: float = 0.0,
        fp16_cfg: Any = None,
        grad_comm_dtype: Optional[str] = None,
        kernel_backend: Optional[str] = None,
        max_in_flight: int = 2,
        max_combines_in_flight: int = MAX_COMBINES_IN_FLIGHT,
        device: Optional[torch.device] = None,
        init: Optional[Callable[[nn.Module], None]] = None,
    ) -> None:
        """``model`` may be built on the meta device (``build_model(cfg, device="meta")``): each
        unit is then materialised on ``device`` alone, initialised in place by ``init(unit)``,
        reduced to this rank's shards and freed before the next one (sharded initialisation)."""
        self.module = model
        self.plan = plan
        self.comm = comm
        self.topo = comm.topo
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.grad_clip = grad_clip
        self.max_in_flight = max_in_flight
        if max_combines_in_flight < 0:
            raise ValueError(f"max_combines_in_flight must be >= 0 (0: unbounded), got {max_combines_in_flight}")
        self.max_combines_in_flight = max_combines_in_flight
        self._combining: list[ShardedUnit] = []  # units whose combine holds buffers, oldest first
        self.in_backward = False
        self._last_micro = False
        self._grad_scale = 1.0
        self._in_flight: list[ShardedUnit] = []  # units with a reduction in flight, oldest first
        # when a list: (event, unit index) of launches and waits against backward progress
        self.trace: Optional[list[tuple[str, Optional[int]]]] = None
        self.state_bytes_before_step: dict[str, int] = {}
        wire = DTYPES[grad_comm_dtype] if grad_comm_dtype else self.dtype
        kernel_backend = None if kernel_backend in (None, "auto") else kernel_backend
        groups = self._make_groups()
        align = L.alignment(self.topo.world_size, memory.block_sizes(plan))
        unit_params, tied = assign_parameters(model, units)
        first = next((p for ps in unit_params for _, p in ps), None)
        self.device = (
            torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
        )
        self.units: list[ShardedUnit] = []
        by_pos: dict[int, ShardedUnit] = {}
        for i, (mod, params) in enumerate(zip(units, unit_params)):
            if not params:
                continue
            meta = params[0][1].device.type == "meta"
            if meta and self.device.type != "meta" and init is None:
                raise ValueError("the model is on the meta device: pass init= to materialise it unit by unit")
            by_pos[i] = ShardedUnit(
                i,
                mod,
                params,
                plan,
                comm,
                groups,
                self.dtype,
                align,
                wire,
                kernel_backend,
                self.device,
                init if meta else None,
            )
            self.units.append(by_pos[i])
        tie_borrowed(units, by_pos, tied)
        self.groups = groups
        self.optimizer = ShardedAdamW(
            [u.master_init for u in self.units],
            [u.decay_ranges() for u in self.units],
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
        )
        for u in self.units:
            del u.master_init
        self.scaler = LossScaler(fp16_cfg) if precision == "fp16" else None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._install_hooks()

    # ---------------------------------------------------------------------------- setup
    def _make_groups(self) -> UnitGroups:
        W, P = self.topo.world_size, self.topo.ranks_per_node
        w, g, o = self.plan.factors
        c = self.comm
        s = self.plan.secondary_degree
        used = traffic.reduce_groups(self.plan, P)
        # every rank creates the same groups in the same order, only those the plan sends over (a
        # partition of one-rank groups creates none: weight with w = 1, replicas with g = W, ...)
        weight = c.partition(L.blocks(W, w))
        secondary = c.partition(L.blocks(W, s)) if s and w > 1 else None
        grad = c.partition(L.blocks(W, g)) if "grad" in used else None
        node = c.partition(L.blocks(W, P)) if "node" in used else None
        peers = c.partition(L.two_hop_peer_groups(W, g, P)) if "two_hop_peers" in used else None
        replicas = c.partition(L.strided(W, g))
        optim = c.partition(L.blocks(W, o))
        post = c.partition(L.post_gather_groups(W, w, o))
        world = c.partition([list(range(W))])
        return UnitGroups(weight, secondary, grad, node, peers, replicas, optim, post, world)

    def _install_hooks(self) -> None:
        order = self.units
        for pos, u in enumerate(order):
            nxt = order[pos + 1] if pos + 1 < len(order) else None
            prev = order[pos - 1] if pos > 0 else None
            self._hooks.append(u.module.register_forward_pre_hook(self._pre_forward(u, nxt)))
            self._hooks.append(u.module.register_forward_hook(self._post_forward(u, prev, pos == len(order) - 1)))
            for s in u.specs:
                self._hooks.append(s.param.register_post_accumulate_grad_hook(self._grad_ready(u)))

    def _pre_forward(self, u: ShardedUnit, nxt: Optional[ShardedUnit]) -> Callable[[nn.Module, tuple], None]:
        def hook(module: nn.Module, args: tuple) -> None:
            if self.in_backward:  # activation recompute: weights are already there
                for v in (*u.borrows, u):
                    if not v.gathered:
                        v.start_gather(backward=True)
                        v.finish_gather()
                return
            for v in u.borrows:  # tied weights owned by an earlier unit
                v.start_gather(backward=False)
                v.finish_gather()
            u.start_gather(backward=False)
            u.finish_gather()
            if nxt is not None and self.plan.prefetch:
                nxt.start_gather(backward=False)

        return hook

    def _post_forward(
        self, u: ShardedUnit, prev: Optional[ShardedUnit], last: bool
    ) -> Callable[[nn.Module, tuple, Any], Any]:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            if self.in_backward:
                return output
            training = torch.is_grad_enabled()
            if not (training and last):  # keep the last unit: backward starts with it
                u.free_full()
                for v in u.borrows:
                    v.free_full()
            if training:
                self._arm_backward(u, prev, output)
            return output

        return hook

    def _arm_backward(self, u: ShardedUnit, prev: Optional[ShardedUnit], output: Any) -> None:
        tensors = [t for t in output_tensors(output) if t.requires_grad]
        fired = {"done": False}

        def pre_backward(grad: torch.Tensor) -> torch.Tensor:
            if not fired["done"]:
                fired["done"] = True
                self._event("backward", u)
                for v in (*u.borrows, u):
                    if not v.gathered:
                        v.start_gather(backward=True)
                        v.finish_gather()
                if prev is not None and self.plan.prefetch:
                    prev.start_gather(backward=True)
            return grad

        for t in tensors:
            t.register_hook(pre_backward)

    def _grad_ready(self, u: ShardedUnit) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            u.grads_ready += 1
            if u.grads_ready == len(u.specs):
                self._reduce_unit(u)

        return hook

    def _reduce_unit(self, u: ShardedUnit) -> None:
        if u.reduced_this_backward:
            return
        u.reduced_this_backward = True
        # an earlier unit's 2-hop reduction has had this unit's backward to land its first hop:
        # its second hop goes out now, before this unit's first hop queues behind it
        for v in self._in_flight:
            if v.advance_reduce():
                self._event("hop2", v)
        self._event("launch_reduce", u)
        u.start_reduce(self._grad_scale)
        u.free_full()
        for v in u.borrows:  # its backward is done: the owner is gathered again for its own
            v.free_full()
        if not u.reduce_handles:  # reduced synchronously: done already
            self._finish_reduce(u)
        else:
            self._in_flight.append(u)
        self._retire(limit=self.max_in_flight)

    def _retire(self, limit: int) -> None:
        """Finish in-flight reductions oldest first while more than ``limit`` are in flight: a
        unit's reduction is finished (and on the last micro-batch its combine launched) when the
        reduction ``limit`` units later has been launched, and every one at the end of backward.
        Fixed by program position, never by whether a reduction has landed (which differs between
        ranks): every rank issues the same collectives in the same order."""
        while len(self._in_flight) > limit:
            self._finish_reduce(self._in_flight.pop(0))

    def _finish_reduce(self, u: ShardedUnit) -> None:
        if u.advance_reduce():
            self._event("hop2", u)
        self._event("wait_reduce", u)
        u.wait_reduce()
        if self._last_micro:
            self._start_combine(u, "combine")

    def _start_combine(self, u: ShardedUnit, event: Optional[str] = None) -> None:
        """Launch ``u``'s combine. One that holds buffers until it is waited for (INT8 send and
        receive buffers, a 16-bit wire copy) first finishes the oldest such combine while
        ``max_combines_in_flight`` hold theirs (waited for, its second stage issued and waited
        for, reduced into its fp32 gradient, buffers dropped): at most that many units' combine
        buffers are alive at once (memory.buffer_bytes). Launch order, fixed by program
        position, never by whether a transfer landed: every rank issues the same collectives in
        the same order."""
        if u.combine_started():
            return
        if u.combine_holds_buffers:
            limit = self.max_combines_in_flight
            while limit and len(self._combining) >= limit:
                v = self._combining.pop(0)
                self._event("finish_combine", v)
                v.finish_combine()
            self._combining.append(u)
        if event:
            self._event(event, u)
        u.start_combine()

    def _event(self, what: str, u: Optional[ShardedUnit] = None) -> None:
        if self.trace is not None:
            self.trace.append((what, None if u is None else u.index))

    # ---------------------------------------------------------------------------- training API
    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self.module(*args, **kw)

    def train(self, mode: bool = True) -> ZeroTopoEngine:
        self.module.train(mode)
        return self

    def eval(self) -> ZeroTopoEngine:
        return self.train(False)

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = False) -> None:
        """Backward of one micro-batch; gradients end up reduced in the fp32 shards.

        ``last_micro_batch=True`` (the last backward before ``step``) also starts each unit's
        cross-replica combine when its reduction is finished; ``step`` is correct either way.
        """
        if any(u.combine_started() for u in self.units):
            raise RuntimeError(
                "backward() called after backward(..., last_micro_batch=True) without step() "
                "in between: the gradients of this step are already being combined"
            )
        self._grad_scale = 1.0 / self.topo.world_size
        self._last_micro = last_micro_batch
        for u in self.units:
            u.grads_ready = 0
            u.reduced_this_backward = False
        self.in_backward = True
        try:
            (loss * self.loss_scale if self.scaler else loss).backward()
            self._event("autograd_done")
            for u in reversed(self.units):  # units whose parameters got no gradient at all
                if not u.reduced_this_backward:
                    self._reduce_unit(u)
            self._retire(limit=0)
        finally:
            self.in_backward = False
            self._last_micro = False
            self._in_flight.clear()
            for u in self.units:
                if u.gather_handle is not None:  # a prefetch nobody consumed
                    u.finish_gather()
                u.free_full()

    @torch.no_grad()
    def step(self, lr: Optional[float] = None) -> dict[str, Any]:
        """Combine gradients across replicas, clip, update the optimizer shards, publish."""
        self.state_bytes_before_step = self.model_state_bytes()  # secondaries are alive here
        # every second stage of the combines in flight goes out before any is waited for (same
        # order on all ranks); a combine finished early (the bound above) already has its result
        for u in self.units:
            self._start_combine(u)
            if u.advance_combine():
                self._event("combine_stage2", u)
        grads = [u.combine_replicas() for u in self.units]
        self._combining.clear()
        self._event("combines_done")
        optim_grp = self.groups.optim
        world = self.groups.world
        norms = torch.stack(torch._foreach_norm(grads, 2)).double()
        local_sq = norms.pow(2).sum().reshape(1)
        finite = torch.isfinite(local_sq).to(torch.float64)
        # one scalar all-reduce carries both the squared norm and the overflow flag; every tensor
        # here lives on the runtime device (NCCL/RCCL refuse host tensors)
        packed = torch.cat([local_sq.nan_to_num(0.0, 0.0, 0.0), 1.0 - finite])
        self.comm.all_reduce(packed, optim_grp, control=True)
        bad = packed[1:].clone()
        self.comm.all_reduce(bad, world, op=torch.distributed.ReduceOp.MAX, control=True)
        sq_sum, bad_host = self.comm.to_host(torch.cat([packed[:1], bad])).tolist()
        overflow = bad_host > 0
        scale = self.loss_scale
        stats = {"loss_scale": scale, "skipped": False, "grad_norm": float("nan")}
        if overflow:
            # which units: a flag per unit, max over every rank (all ranks agreed on overflow)
            bad_units = (~torch.isfinite(norms)).double()
            self.comm.all_reduce(bad_units, world, op=torch.distributed.ReduceOp.MAX, control=True)
            for u in self.units:
                u.grad_acc.zero_()
                u.reset_residuals()
            stats["skipped"] = True
            stats["nonfinite"] = True
            stats["nonfinite_units"] = [i for i, b in enumerate(self.comm.to_host(bad_units).tolist()) if b > 0]
            if self.scaler:
                self.scaler.update(overflow=True)
                stats["loss_scale"] = self.scaler.scale
            return stats
        norm = math.sqrt(sq_sum) / scale
        stats["grad_norm"] = norm
        coef = 1.0 / scale
        if self.grad_clip and norm > self.grad_clip:
            coef *= self.grad_clip / (norm + 1e-6)
        if coef != 1.0:
            for g in grads:
                g.mul_(coef)
        self.optimizer.step(grads, lr=lr)
        publishing: list[ShardedUnit] = []
        for u, master in zip(self.units, self.optimizer.params):
            u.start_publish(master)
            self._bound_publishes(publishing, u)
        if self.scaler:
            self.scaler.update(overflow=False)
        return stats

    def _bound_publishes(self, publishing: list[ShardedUnit], u: ShardedUnit) -> None:
        """An INT8 publish holds its receive buffer until the unit's next gather: keep at most
        ``max_in_flight`` of them, finishing the oldest (unit order, the same on every rank; no
        collective is issued) when one more goes out (memory.publish_buffer_bytes)."""
        if not u.publish_receives():
            return
        publishing.append(u)
        while len(publishing) > max(1, self.max_in_flight):
            publishing.pop(0).wait_publish()

    @torch.no_grad()
    def republish(self) -> None:
        """Rebuild every primary shard from the optimizer's masters (after a checkpoint load);
        secondaries are invalidated so backward can never see stale weights."""
        for u, master in zip(self.units, self.optimizer.params):
            u.publish(master)

    # ---------------------------------------------------------------------------- state (engine_state)
    def state_dict(self, optimizer: bool = True) -> dict[str, Any]:
        """This rank's training state on the host: optimizer shards, loss scaler, error-feedback
        residuals (:func:`.engine_state.state_dict`; what a checkpoint saves)."""
        return engine_state.state_dict(self, optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Fill this rank's state from ``state`` and republish (:func:`.engine_state.load_state_dict`)."""
        engine_state.load_state_dict(self, state)

    def unit_table(self) -> list[dict]:
        """Per unit: padded and real element counts, parameters' [name, offset, numel, shape]."""
        return engine_state.unit_table(self)

    def shard_ranges(self) -> list[tuple[int, int]]:
        """Per unit: the [lo, hi) of its flat buffer whose optimizer state this rank holds."""
        return engine_state.shard_ranges(self)

    def full_state(self) -> list[dict]:
        """Collective: every unit's full optimizer state, gathered (:func:`.engine_state.full_state`)."""
        return engine_state.full_state(self)

    def model_state_bytes(self) -> dict[str, int]:
        """Bytes of model states this rank holds, measured from tensor storage."""
        return engine_state.model_state_bytes(self)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Gather the current fp32 master weights of every parameter (collective; tests, export)."""
        return engine_state.full_parameters(self)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
