"""A unit's gradient and weight transports, each a named function chosen once from the plan.

Three moments of a step move a unit's state between ranks:

- ``reduce`` (every micro-batch): the flat gradient into this rank's fp32 gradient shard;
- ``combine`` (once per step): the gradient shards summed across replicas, giving this rank's
  optimizer-shard gradient;
- ``publish`` (after the update): the updated optimizer shards gathered into the primary shard.

``select_reduce``, ``select_combine`` and ``select_publish`` map a plan onto one function each
when the unit is built -- the function traffic.py's decision names, whose collectives it declares
for the volume formulas and the models -- and the unit calls it and keeps the returned :class:`Handle`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from . import kernels, packed, traffic
from . import layout as L
from .comm import Group, Handle, TwoStageHandle
from .sharding import Plan

if TYPE_CHECKING:
    from .unit import ShardedUnit

ReduceFn = Callable[["ShardedUnit", float], Optional[Handle]]
CombineFn = Callable[["ShardedUnit", int, int], Handle]
PublishFn = Callable[["ShardedUnit", torch.Tensor, torch.Tensor], Optional[Handle]]


# ------------------------------------------------------------------------------ reduce
def accumulate_local(u: ShardedUnit, scale: float) -> None:
    """No gradient sharding: add each parameter's gradient straight into its slice of the fp32
    shard (same arithmetic as flattening first: cast to the wire dtype, scale, add)."""
    acc, wire = u.grad_acc, u.grad_comm_dtype
    for s in u.specs:
        if s.param.grad is None:
            continue
        g = s.param.grad.reshape(-1)
        if g.dtype != wire:
            g = g.to(wire)
        if scale != 1.0:
            g = g * scale
        acc[s.offset : s.offset + s.numel].add_(g)
        s.param.grad = None
    return None


def reduce_scatter_16bit(u: ShardedUnit, scale: float) -> Handle:
    """A reduce-scatter of the wire-dtype gradient over the gradient group."""
    plan, gsz = u.plan, u.plan.grad_factor
    G = u.flat_grad(scale)
    perm = L.reduce_perm(plan.weight_factor, gsz)
    send = G.view(gsz, -1)[perm].reshape(-1)
    out = torch.empty(u.layout.grad_numel, dtype=G.dtype, device=u.device)
    w = u.comm.reduce_scatter(out, send, u.g.grad, async_op=True)
    acc = u.grad_acc
    return Handle([w], lambda: acc.add_(out))


def quantized_all_to_all_reduce(u: ShardedUnit, scale: float) -> Handle:
    """ZeRO-topo: one all-to-all of block-quantized slices inside the node, summed in fp32."""
    plan, gsz = u.plan, u.plan.grad_factor
    bits, blk = plan.grad_bits, plan.grad_quant_block_size
    G = u.flat_grad(scale)
    perm = L.reduce_perm(plan.weight_factor, gsz)
    q, sc = quantize_gradient(u, G, bits, blk, perm)
    send = packed.pack(q, sc, gsz)  # payload and scales in one collective
    recv = torch.empty_like(send)
    work = u.comm.all_to_all(recv, send, u.g.grad, async_op=True)
    acc, n, qn, qdtype = u.grad_acc, u.layout.grad_numel, q.numel() // gsz, q.dtype
    del q, sc

    def finish(_keep: torch.Tensor = send) -> None:
        rq, rs = packed.unpack(recv, gsz, qn, qdtype)
        kernels.dequantize_sum(
            rq.view(gsz, -1), rs.view(gsz, -1), bits, blk, n, out=acc, accumulate=True, backend=u.backend
        )

    return Handle([work], finish)


class TwoHopReduce(TwoStageHandle):
    """ZeRO++'s qgZ: a quantized all-to-all inside the node, then (second hop) the partial sums
    requantized and exchanged with the same local rank of every node of the gradient block."""

    def __init__(self, u: ShardedUnit, G: torch.Tensor) -> None:
        plan, P = u.plan, u.comm.topo.ranks_per_node
        self.unit = u
        self.bits, self.blk = plan.grad_bits, plan.grad_quant_block_size
        self.P, self.k = P, plan.grad_factor // P
        perm = L.two_hop_perm(plan.weight_factor, plan.grad_factor, P)
        q, sc = quantize_gradient(u, G, self.bits, self.blk, perm)
        self.qdtype = q.dtype
        # payload and scales in one collective per hop (packed.py); the send buffer lives until
        # the collective is done
        self.send: Optional[torch.Tensor] = packed.pack(q, sc, self.P)
        self.qn = q.numel() // self.P
        self.recv: Optional[torch.Tensor] = torch.empty_like(self.send)
        self.recv2: Optional[torch.Tensor] = None
        first = [u.comm.all_to_all(self.recv, self.send, u.g.node, async_op=True)]
        super().__init__(first, self._second_hop, self._finish)

    def _second_hop(self) -> list[Optional[dist.Work]]:
        u, P = self.unit, self.P
        rq, rs = packed.unpack(self.recv, P, self.qn, self.qdtype)
        self.send = self.recv = None  # the first hop is done
        q2, s2 = kernels.dequantize_sum_requantize(
            rq.view(P, -1), rs.view(P, -1), self.bits, self.blk, backend=u.backend
        )
        self.qn2 = q2.numel() // self.k
        self.send = packed.pack(q2, s2, self.k)
        self.recv2 = torch.empty_like(self.send)
        return [u.comm.all_to_all(self.recv2, self.send, u.g.two_hop_peers, async_op=True)]

    def _finish(self) -> None:
        u, k = self.unit, self.k
        rq2, rs2 = packed.unpack(self.recv2, k, self.qn2, self.qdtype)
        self.send = self.recv2 = None
        kernels.dequantize_sum(
            rq2.view(k, -1),
            rs2.view(k, -1),
            self.bits,
            self.blk,
            u.layout.grad_numel,
            out=u.grad_acc,
            accumulate=True,
            backend=u.backend,
        )


def two_hop_reduce(u: ShardedUnit, scale: float) -> TwoHopReduce:
    """Gradient group wider than a node: ZeRO++'s 2-hop quantized all-to-all (qgZ)."""
    return TwoHopReduce(u, u.flat_grad(scale))


def quantize_gradient(
    u: ShardedUnit, G: torch.Tensor, bits: int, blk: int, perm: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a micro-batch's flat gradient in reordered slices; with error feedback the
    residual of the previous quantization is added first and the new residual kept (fp32,
    the unit's padded size, original order)."""
    if not u.plan.error_feedback:
        return kernels.quantize_reordered(G, bits, blk, perm, backend=u.backend)
    x = G.float()
    if u.ef_reduce is not None:
        x.add_(u.ef_reduce)
    q, sc = kernels.quantize_reordered(x, bits, blk, perm, backend=u.backend)
    deq = kernels.dequantize(q, sc, bits, blk, x.numel(), backend=u.backend)  # slot i = slice perm[i]
    # the permutation as a device index, built when the unit was (no host-to-device copy, so no
    # host synchronisation, inside backward)
    idx = u.ef_perm
    x.view(len(perm), -1).index_add_(0, idx, deq.view(len(perm), -1), alpha=-1.0)
    u.ef_reduce = x
    return q, sc


def reduce_perm_index(plan: Plan, ranks_per_node: int, device: torch.device) -> Optional[torch.Tensor]:
    """The slice order of a quantized reduction as a device tensor, for error feedback's
    residual (None when the plan keeps no in-node residual). Built once, outside backward."""
    kind = traffic.reduce_transport(plan, ranks_per_node)
    if not plan.error_feedback or kind not in ("quantized_all_to_all_reduce", "two_hop_reduce"):
        return None
    if kind == "quantized_all_to_all_reduce":
        perm = L.reduce_perm(plan.weight_factor, plan.grad_factor)
    else:
        perm = L.two_hop_perm(plan.weight_factor, plan.grad_factor, ranks_per_node)
    return torch.as_tensor(list(perm), dtype=torch.long, device=device)


REDUCE: dict[str, ReduceFn] = {
    fn.__name__: fn for fn in (accumulate_local, reduce_scatter_16bit, quantized_all_to_all_reduce, two_hop_reduce)
}


def select_reduce(plan: Plan, ranks_per_node: int) -> ReduceFn:
    return REDUCE[traffic.reduce_transport(plan, ranks_per_node)]


# ------------------------------------------------------------------------------ combine
# (u, o_lo, o_hi): [o_lo, o_hi) is this rank's optimizer shard inside its gradient shard


def combine_local(u: ShardedUnit, o_lo: int, o_hi: int) -> Handle:
    """One replica: the gradient shard already is the sum."""
    acc = u.grad_acc
    return Handle([], lambda: acc[o_lo:o_hi])


def combine_ordered_all_gather(u: ShardedUnit, o_lo: int, o_hi: int) -> Handle:
    """``deterministic``: every rank gathers the replicas and sums them in rank order, so the
    result is bitwise reproducible."""
    rep, acc = u.g.replicas, u.grad_acc
    tmp = torch.empty(rep.size * acc.numel(), dtype=u.grad_comm_dtype, device=u.device)
    send = acc.to(u.grad_comm_dtype)
    work = u.comm.all_gather(tmp, send, rep, async_op=True)

    def ordered_sum(_keep: torch.Tensor = send) -> torch.Tensor:  # the send buffer lives until the collective is done
        parts = tmp.view(rep.size, -1)
        acc.copy_(parts[0])
        for i in range(1, rep.size):
            acc.add_(parts[i])
        return acc[o_lo:o_hi]

    return Handle([work], ordered_sum)


def combine_reduce_scatter(u: ShardedUnit, o_lo: int, o_hi: int) -> Handle:
    """``inter_node_reduce: reduce_scatter`` with optimizer shards over the world: each rank
    receives only its optimizer shard's sum (a 16-bit one is widened into the fp32 gradient shard,
    which the send copy has already been taken from: no fp32 buffer is allocated)."""
    acc, wire = u.grad_acc, u.grad_comm_dtype
    send = acc.to(wire)
    out = torch.empty(u.layout.optim_numel, dtype=wire, device=u.device)
    work = u.comm.reduce_scatter(out, send, u.g.replicas, async_op=True)

    def scattered(_keep: torch.Tensor = send) -> torch.Tensor:  # the send buffer lives until the collective is done
        if wire == torch.float32:
            return out
        return acc[o_lo:o_hi].copy_(out)

    return Handle([work], scattered)


def combine_all_reduce(u: ShardedUnit, o_lo: int, o_hi: int) -> Handle:
    """An all-reduce of the gradient shard across replicas (in place when the wire is fp32; else
    of a wire copy whose optimizer shard is widened back into the fp32 gradient shard)."""
    acc, rep, wire = u.grad_acc, u.g.replicas, u.grad_comm_dtype
    if wire == torch.float32:
        work = u.comm.all_reduce(acc, rep, async_op=True)
        return Handle([work], lambda: acc[o_lo:o_hi])
    buf = acc.to(wire)
    work = u.comm.all_reduce(buf, rep, async_op=True)
    return Handle([work], lambda: acc[o_lo:o_hi].copy_(buf[o_lo:o_hi]))


class QuantizedCombine(TwoStageHandle):
    """INT8 reduce-scatter across replicas (one all-to-all of block-quantized slices, sums in
    fp32), then, when this rank's optimizer shard is wider than its slice, an INT8 all-gather
    of the summed slices (every replica then dequantizes the same bytes: identical updates)."""

    def __init__(self, u: ShardedUnit, o_lo: int, o_hi: int) -> None:
        rep, acc, plan = u.g.replicas, u.grad_acc, u.plan
        self.unit, self.o_lo, self.o_hi = u, o_lo, o_hi
        self.bits, self.blk, self.r = plan.combine_bits, plan.grad_quant_block_size, rep.size
        self.m = acc.numel() // self.r
        i = rep.index(u.comm.rank)
        src = acc
        if plan.error_feedback:  # add the last step's quantization residual, keep the new one
            src = acc if u.ef_combine is None else acc + u.ef_combine
        q, sc = kernels.quantize(src, self.bits, self.blk, backend=u.backend)
        if plan.error_feedback:
            u.ef_combine = src - kernels.dequantize(q, sc, self.bits, self.blk, src.numel(), backend=u.backend)
        # payload and scales in one collective per stage (packed.py); the send buffer lives
        # until the collective is done
        self.qdtype, self.qn = q.dtype, q.numel() // self.r
        self.send: Optional[torch.Tensor] = packed.pack(q, sc, self.r)
        self.recv: Optional[torch.Tensor] = torch.empty_like(self.send)
        first = [u.comm.all_to_all(self.recv, self.send, rep, async_op=True)]
        self.mine = torch.empty(self.m, dtype=torch.float32, device=u.device)
        self.gather = (o_lo, o_hi) != (i * self.m, (i + 1) * self.m)
        self.gathered: Optional[torch.Tensor] = None
        super().__init__(first, self._second, self._finish)

    def _second(self) -> list[Optional[dist.Work]]:
        u, r, bits, blk = self.unit, self.r, self.bits, self.blk
        rq, rs = packed.unpack(self.recv, r, self.qn, self.qdtype)
        self.send = self.recv = None  # the first stage is done: its buffers go now
        kernels.dequantize_sum(rq.view(r, -1), rs.view(r, -1), bits, blk, self.m, out=self.mine, backend=u.backend)
        del rq, rs
        if not self.gather:
            return []
        q2, s2 = kernels.quantize(self.mine, bits, blk, backend=u.backend)
        self.qn = q2.numel()
        self.send = packed.pack(q2, s2)
        self.gathered = packed.empty_like_packed(q2, s2, r)
        return [u.comm.all_gather(self.gathered, self.send, u.g.replicas, async_op=True)]

    def _finish(self) -> torch.Tensor:
        if not self.gather:
            return self.mine
        # every replica holding this optimizer shard must apply the same gradient, so the
        # slice this rank summed is taken from the gathered INT8 copy too, like everyone's
        u, acc = self.unit, self.unit.grad_acc
        qall, sall = packed.unpack(self.gathered, self.r, self.qn, self.qdtype)
        self.send = self.gathered = None
        kernels.dequantize(qall, sall, self.bits, self.blk, acc.numel(), backend=u.backend, out=acc)
        return acc[self.o_lo : self.o_hi]


def combine_quantized(u: ShardedUnit, o_lo: int, o_hi: int) -> QuantizedCombine:
    """``combine_bits`` < 16: quantized reduce-scatter (+ all-gather) across replicas."""
    return QuantizedCombine(u, o_lo, o_hi)


COMBINE: dict[str, CombineFn] = {
    fn.__name__: fn
    for fn in (combine_local, combine_quantized, combine_ordered_all_gather, combine_reduce_scatter, combine_all_reduce)
}


def select_combine(plan: Plan, world_size: int) -> CombineFn:
    return COMBINE[traffic.combine_transport(plan, world_size)]


def combine_holds_buffers(fn: CombineFn, wire: torch.dtype) -> bool:
    """``fn`` allocates buffers held until the combine is waited for (memory.unit_buffers'
    ``combine`` > 0): all but the one-replica combine and the in-place fp32 all-reduce."""
    return fn is not combine_local and not (fn is combine_all_reduce and wire == torch.float32)


# ------------------------------------------------------------------------------ publish
# (u, master, new): ``new`` is the updated fp32 master shard in the compute dtype


def publish_local(u: ShardedUnit, master: torch.Tensor, new: torch.Tensor) -> None:
    """The optimizer shard covers the primary shard's piece: copy it in place."""
    a = u.optim_range[0] - u.primary_range[0]
    u.primary[a : a + new.numel()].copy_(new)
    u.refresh_views()
    return None


def publish_all_gather(u: ShardedUnit, master: torch.Tensor, new: torch.Tensor) -> Handle:
    """Gather straight into the primary shard (group order), then move the pieces to their
    shard slots in place, one piece of scratch: no primary-sized staging buffer per unit."""
    grp = u.g.post_gather
    if new.data_ptr() == master.data_ptr():  # fp32: do not send the live master
        new = new.clone()
    slots = L.post_gather_slots(grp.ranks, *u.plan.factors)
    work = u.comm.all_gather(u.primary, new, grp, async_op=True)

    def place(_keep: torch.Tensor = new) -> None:
        L.permute_chunks_(u.primary.view(grp.size, -1), slots)
        u.refresh_views()

    return Handle([work], place)


def publish_quantized(u: ShardedUnit, master: torch.Tensor, new: torch.Tensor) -> Handle:
    """INT8 all-gather of the updated shards; every piece is dequantized into its slot of the
    primary shard except this rank's own, copied exactly. The master is fp32 and every rank
    requantizes its fresh shard each step, so the error never accumulates."""
    grp: Group = u.g.post_gather
    if new.data_ptr() == master.data_ptr():  # fp32: do not send the live master
        new = new.clone()
    slots = L.post_gather_slots(grp.ranks, *u.plan.factors)
    bits, blk, n = u.plan.publish_bits, u.plan.quant_block_size, new.numel()
    q, sc = kernels.quantize(new, bits, blk, backend=u.backend)
    send, recv = packed.pack(q, sc), packed.empty_like_packed(q, sc, grp.size)  # one collective
    works = [u.comm.all_gather(recv, send, grp, async_op=True)]
    me, qn, qdtype = grp.index(u.comm.rank), q.numel() * q.element_size(), q.dtype
    del q, sc

    def place(_keep: torch.Tensor = send) -> None:
        qall, sall = packed.unpack(recv, grp.size, qn, qdtype)
        qv, sv = qall.view(grp.size, -1), sall.view(grp.size, -1)
        for j, slot in enumerate(slots):
            dst = u.primary[slot * n : (slot + 1) * n]
            if j == me:
                dst.copy_(new)
            else:
                dst.copy_(kernels.dequantize(qv[j], sv[j], bits, blk, n, dtype=u.dtype, backend=u.backend))
        u.refresh_views()

    return Handle(works, place)


PUBLISH: dict[str, PublishFn] = {fn.__name__: fn for fn in (publish_local, publish_quantized, publish_all_gather)}


def select_publish(plan: Plan) -> PublishFn:
    return PUBLISH[traffic.publish_transport(plan)]
