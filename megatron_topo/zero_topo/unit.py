"""One wrapped unit: its nested flat buffer, weight gathers, secondary shard and gradient reduction.

Memory a unit keeps between steps (per rank): the primary shard (compute dtype, L/w), the
secondary copy (INT8 + scales or 16-bit, L/s) while valid, the fp32 gradient shard (L/g) and, in
the optimizer, the fp32 master shard and two Adam moments (L/os each). The full buffer (L) only
exists between a gather and the matching free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

import kernels

from . import layout as L
from .comm import Comm, Group, Handle, TwoStageHandle
from .plan import Plan


@dataclass
class ParamSpec:
    name: str
    param: nn.Parameter
    offset: int
    numel: int
    shape: torch.Size
    decay: bool


@dataclass
class UnitGroups:
    weight: Group  # w consecutive ranks (primary shards)
    secondary: Optional[Group]  # s consecutive ranks
    grad: Group  # g consecutive ranks
    node: Group  # ranks of this node (first hop of the 2-hop reduction)
    two_hop_peers: Optional[Group]
    replicas: Group  # ranks holding the same gradient shard (cross-replica combine)
    optim: Group  # os consecutive ranks (norm)
    post_gather: Group  # ranks whose optimizer shards tile this rank's primary shard
    world: Group


class ShardedUnit:
    def __init__(self, index: int, module: nn.Module, params: list[tuple[str, nn.Parameter]],
                 plan: Plan, comm: Comm, groups: UnitGroups, dtype: torch.dtype, align: int,
                 grad_comm_dtype: torch.dtype, kernel_backend: Optional[str],
                 device: Optional[torch.device] = None,
                 init: Optional[Callable[[nn.Module], None]] = None):
        self.index = index
        self.module = module
        self.plan = plan
        self.comm = comm
        self.g = groups
        self.dtype = dtype
        self.grad_comm_dtype = grad_comm_dtype
        self.backend = kernel_backend
        rank = comm.rank
        self.specs: list[ParamSpec] = []
        off = 0
        for name, p in params:
            decay = p.ndim >= 2 and "norm" not in name
            self.specs.append(ParamSpec(name, p, off, p.numel(), p.shape, decay))
            off += p.numel()
        self.numel = off
        self.layout = L.UnitLayout(off, L.padded_size(off, align), *plan.factors)
        lay = self.layout
        self.primary_range = lay.primary_range(rank)
        self.grad_range = lay.grad_range(rank)
        self.optim_range = lay.optim_range(rank)
        device = torch.device(device) if device is not None else params[0][1].device
        self.device = device
        if init is not None:
            # sharded initialisation: materialise this unit alone, as views of one fp32 buffer,
            # initialise it in place, keep this rank's shards and drop the rest (below)
            full = torch.zeros(lay.padded, dtype=torch.float32, device=device)
            self._rebind_params(full)
            init(module)
        else:  # an initialised model: flatten its weights (identical on every rank)
            full = self._flatten_params(dtype=torch.float32)
        a, b = self.primary_range
        self.primary = full[a:b].to(dtype).clone()
        self.master_init = full[self.optim_range[0]:self.optim_range[1]].clone()  # fp32
        self.grad_acc = torch.zeros(lay.grad_numel, dtype=torch.float32, device=device)
        self.full: Optional[torch.Tensor] = None
        self.secondary = None  # (payload, scales) or 16-bit tensor
        self.gather_handle: Optional[Handle] = None
        self.reduce_handles: list[Handle] = []
        self.combine_handle: Optional[Handle] = None
        self.publish_handle: Optional[Handle] = None
        self.grads_ready = 0
        self.reduced_this_backward = False
        self.borrows: list["ShardedUnit"] = []  # units owning tied weights this unit also computes with
        # error feedback (plan.error_feedback): fp32 residuals of the last in-node gradient
        # quantization (padded unit, original order) and of the last quantized combine (grad shard)
        self.ef_reduce: Optional[torch.Tensor] = None
        self.ef_combine: Optional[torch.Tensor] = None
        if plan.weight_factor == 1:  # replicated weights: the module always views the primary
            self.full = self.primary
            self._set_views(self.primary)
        else:
            self._set_empty()

    # -------------------------------------------------------------------------- params
    def _flatten_params(self, dtype) -> torch.Tensor:
        out = torch.zeros(self.layout.padded, dtype=dtype, device=self.device)
        for s in self.specs:
            out[s.offset:s.offset + s.numel].copy_(s.param.detach().reshape(-1))
        return out

    def _rebind_params(self, full: torch.Tensor):
        """Replace the (meta) parameters by parameters viewing ``full``: a meta parameter's data
        cannot be set to a real tensor, so the module gets new Parameter objects."""
        for s in self.specs:
            owner, _, leaf = s.name.rpartition(".")
            mod = self.module.get_submodule(owner) if owner else self.module
            new = nn.Parameter(full[s.offset:s.offset + s.numel].view(s.shape), requires_grad=s.param.requires_grad)
            mod._parameters[leaf] = new
            s.param = new

    def _set_views(self, full: torch.Tensor):
        for s in self.specs:
            s.param.data = full[s.offset:s.offset + s.numel].view(s.shape)

    def _set_empty(self):
        for s in self.specs:
            s.param.data = torch.empty(0, dtype=self.dtype, device=self.device)

    @property
    def gathered(self) -> bool:
        return self.full is not None

    # -------------------------------------------------------------------------- gathers
    @property
    def has_secondary(self) -> bool:
        p = self.plan
        return p.weight_factor > 1 and p.secondary_degree is not None

    def _secondary_range(self) -> tuple[int, int]:
        s = self.plan.secondary_degree
        n = self.layout.padded // s
        i = self.comm.rank % s
        return i * n, (i + 1) * n

    def start_gather(self, backward: bool) -> None:
        """Launch the all-gather that materialises the full unit (async)."""
        self.wait_publish()  # the primary shard (and, for w == 1, the module's weights) is current
        if self.gathered or self.gather_handle is not None:
            return
        plan, Ltot = self.plan, self.layout.padded
        if backward and self.has_secondary and self.secondary is not None:
            grp, bits, blk = self.g.secondary, plan.secondary_bits, plan.quant_block_size
            src = self.secondary
            keep_secondary = False
        else:
            grp, bits, blk = self.g.weight, plan.weight_bits, plan.quant_block_size
            src = None
            keep_secondary = self.has_secondary
        if bits == 16:
            shard = src if src is not None else self.primary
            full = torch.empty(Ltot, dtype=self.dtype, device=self.device)
            work = self.comm.all_gather(full, shard, grp, async_op=True)

            def finish():
                if src is None:  # forward: the local shard is exact by construction
                    pass
                if keep_secondary:
                    self._make_secondary(full, None)
                return full
        else:
            if src is not None:
                q, sc = src
            else:
                q, sc = kernels.quantize(self.primary, bits, blk, backend=self.backend)
            qall = torch.empty(q.numel() * grp.size, dtype=q.dtype, device=self.device)
            sall = torch.empty(sc.numel() * grp.size, dtype=sc.dtype, device=self.device)
            w1 = self.comm.all_gather(qall, q, grp, async_op=True)
            w2 = self.comm.all_gather(sall, sc, grp, async_op=True)
            work = [w1, w2]

            def finish():
                full = kernels.dequantize(qall, sall, bits, blk, Ltot, dtype=self.dtype, backend=self.backend)
                if src is None:
                    a, b = self.primary_range
                    full[a:b].copy_(self.primary)  # the local shard stays exact
                if keep_secondary:
                    self._make_secondary(full, (qall, sall) if plan.secondary_bits == bits else None)
                return full
        works = work if isinstance(work, list) else [work]
        self.gather_handle = Handle(works, finish)

    def _make_secondary(self, full: torch.Tensor, quantized):
        a, b = self._secondary_range()
        plan = self.plan
        if plan.secondary_bits == 16:
            self.secondary = full[a:b].clone()
            return
        blk = plan.quant_block_size
        if quantized is not None:  # reuse the gathered INT8 blocks: no requantization
            qall, sall = quantized
            per_byte = 1 if plan.weight_bits == 8 else 2
            self.secondary = (qall[a // per_byte:b // per_byte].clone(), sall[a // blk:b // blk].clone())
        else:
            self.secondary = kernels.quantize(full[a:b], plan.secondary_bits, blk, backend=self.backend)

    def finish_gather(self) -> None:
        if self.gathered:
            return
        if self.gather_handle is None:
            raise RuntimeError(f"unit {self.index}: weights requested but no gather was started")
        full = self.gather_handle.wait()
        self.gather_handle = None
        self.full = full
        self._set_views(full)

    def free_full(self) -> None:
        if self.plan.weight_factor == 1 or self.full is None:
            return
        self.full = None
        self._set_empty()

    def invalidate_secondary(self) -> None:
        self.secondary = None

    # -------------------------------------------------------------------------- gradients
    def flat_grad(self, scale: float) -> torch.Tensor:
        """The unit's gradient as one flat buffer (wire dtype), pre-divided by the DP size."""
        g = torch.empty(self.layout.padded, dtype=self.grad_comm_dtype, device=self.device)
        for s in self.specs:  # the specs tile [0, numel) back to back
            if s.param.grad is not None:
                g[s.offset:s.offset + s.numel].copy_(s.param.grad.reshape(-1))
                s.param.grad = None
            else:
                g[s.offset:s.offset + s.numel].zero_()
        g[self.numel:].zero_()  # alignment padding
        if scale != 1.0:
            g.mul_(scale)
        return g

    def _accumulate_local(self, scale: float) -> None:
        """No gradient sharding: add each parameter's gradient straight into its slice of the
        fp32 shard (same arithmetic as flattening first: cast to the wire dtype, scale, add)."""
        acc, wire = self.grad_acc, self.grad_comm_dtype
        for s in self.specs:
            if s.param.grad is None:
                continue
            g = s.param.grad.reshape(-1)
            if g.dtype != wire:
                g = g.to(wire)
            if scale != 1.0:
                g = g * scale
            acc[s.offset:s.offset + s.numel].add_(g)
            s.param.grad = None

    def start_reduce(self, scale: float) -> None:
        """Reduce this micro-batch's gradient into the fp32 gradient shard (async)."""
        plan, lay = self.plan, self.layout
        gsz = plan.grad_factor
        acc = self.grad_acc
        if gsz == 1:
            self._accumulate_local(scale)
            return
        G = self.flat_grad(scale)
        blk = plan.grad_quant_block_size
        if plan.grad_bits == 16:
            perm = L.reduce_perm(plan.weight_factor, gsz)
            send = G.view(gsz, -1)[perm].reshape(-1)
            out = torch.empty(lay.grad_numel, dtype=G.dtype, device=self.device)
            w = self.comm.reduce_scatter(out, send, self.g.grad, async_op=True)
            self.reduce_handles.append(Handle([w], lambda: acc.add_(out)))
            return
        bits, P = plan.grad_bits, self.comm.topo.ranks_per_node
        if gsz <= P:  # one quantized all-to-all inside the node (ZeRO-topo)
            perm = L.reduce_perm(plan.weight_factor, gsz)
            q, sc = self._quantize_gradient(G, bits, blk, perm)
            rq, rs = torch.empty_like(q), torch.empty_like(sc)
            w1 = self.comm.all_to_all(rq, q, self.g.grad, async_op=True)
            w2 = self.comm.all_to_all(rs, sc, self.g.grad, async_op=True)

            def finish():
                kernels.dequantize_sum(rq.view(gsz, -1), rs.view(gsz, -1), bits, blk, lay.grad_numel,
                                       out=acc, accumulate=True, backend=self.backend)

            self.reduce_handles.append(Handle([w1, w2], finish))
            return
        # ZeRO++ 2-hop: quantized all-to-all inside the node, then across nodes
        perm = L.two_hop_perm(plan.weight_factor, gsz, P)
        k = gsz // P
        q, sc = self._quantize_gradient(G, bits, blk, perm)
        rq, rs = torch.empty_like(q), torch.empty_like(sc)
        first = [self.comm.all_to_all(rq, q, self.g.node, async_op=True),
                 self.comm.all_to_all(rs, sc, self.g.node, async_op=True)]
        bufs = {}

        def second_hop() -> list:
            q2, s2 = kernels.dequantize_sum_requantize(rq.view(P, -1), rs.view(P, -1), bits, blk,
                                                       backend=self.backend)
            rq2, rs2 = torch.empty_like(q2), torch.empty_like(s2)
            bufs["q"], bufs["s"] = rq2, rs2
            return [self.comm.all_to_all(rq2, q2, self.g.two_hop_peers, async_op=True),
                    self.comm.all_to_all(rs2, s2, self.g.two_hop_peers, async_op=True)]

        def finish(_keep=(q, sc)):  # send buffers live until the collectives are done
            kernels.dequantize_sum(bufs["q"].view(k, -1), bufs["s"].view(k, -1), bits, blk, lay.grad_numel,
                                   out=acc, accumulate=True, backend=self.backend)

        self.reduce_handles.append(TwoStageHandle(first, second_hop, finish))

    def _quantize_gradient(self, G: torch.Tensor, bits: int, blk: int, perm) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize a micro-batch's flat gradient in reordered slices; with error feedback the
        residual of the previous quantization is added first and the new residual kept (fp32,
        the unit's padded size, original order)."""
        if not self.plan.error_feedback:
            return kernels.quantize_reordered(G, bits, blk, perm, backend=self.backend)
        x = G.float()
        if self.ef_reduce is not None:
            x.add_(self.ef_reduce)
        q, sc = kernels.quantize_reordered(x, bits, blk, perm, backend=self.backend)
        deq = kernels.dequantize(q, sc, bits, blk, x.numel(), backend=self.backend)  # slot i = slice perm[i]
        idx = torch.as_tensor(list(perm), device=self.device)
        x.view(len(perm), -1).index_add_(0, idx, deq.view(len(perm), -1), alpha=-1.0)
        self.ef_reduce = x
        return q, sc

    def reset_residuals(self) -> None:
        """Drop the error-feedback residuals (a skipped step's gradients were not finite)."""
        self.ef_reduce = self.ef_combine = None

    def reduce_landed(self) -> bool:
        """Non-blocking: every collective of this unit's reduction has completed."""
        return all(h.landed() for h in self.reduce_handles)

    def advance_reduce(self, force: bool = False) -> bool:
        """Launch a 2-hop reduction's second hop once its first hop has landed (``force``:
        wait for it); True when a hop was launched."""
        return any([h.advance(force) for h in self.reduce_handles])

    def wait_reduce(self) -> None:
        for h in self.reduce_handles:
            h.wait()
        self.reduce_handles.clear()

    # -------------------------------------------------------------------------- step
    def start_combine(self) -> None:
        """Launch the once-per-step sum of gradient shards across replicas (async). The engine
        calls it as soon as the last micro-batch's reduction of this unit has landed, so the
        cross-node traffic overlaps the rest of backward; ``combine_replicas`` waits for it."""
        if self.combine_handle is not None:
            return
        plan, lay = self.plan, self.layout
        rep = self.g.replicas
        acc = self.grad_acc
        o_lo = self.optim_range[0] - self.grad_range[0]
        o_hi = o_lo + lay.optim_numel
        if rep.size == 1:
            self.combine_handle = Handle([], lambda: acc[o_lo:o_hi])
            return
        if plan.combine_bits < 16:
            self.combine_handle = self._quantized_combine(o_lo, o_hi)
            return
        wire = self.grad_comm_dtype
        if plan.deterministic:  # every rank sums the replicas in rank order: bitwise reproducible
            tmp = torch.empty(rep.size * acc.numel(), dtype=wire, device=self.device)
            send = acc.to(wire)
            work = self.comm.all_gather(tmp, send, rep, async_op=True)

            def ordered_sum(_keep=send):  # the send buffer lives until the collective is done
                parts = tmp.view(rep.size, -1)
                acc.copy_(parts[0])
                for i in range(1, rep.size):
                    acc.add_(parts[i])
                return acc[o_lo:o_hi]

            self.combine_handle = Handle([work], ordered_sum)
            return
        if plan.inter_node_reduce == "reduce_scatter" and plan.optimizer_factor == self.comm.topo.world_size:
            send = acc.to(wire)
            out = torch.empty(lay.optim_numel, dtype=wire, device=self.device)
            work = self.comm.reduce_scatter(out, send, rep, async_op=True)

            def scattered(_keep=send):  # the send buffer lives until the collective is done
                return out.float() if wire != torch.float32 else out

            self.combine_handle = Handle([work], scattered)
            return
        if wire == torch.float32:
            work = self.comm.all_reduce(acc, rep, async_op=True)
            self.combine_handle = Handle([work], lambda: acc[o_lo:o_hi])
            return
        buf = acc.to(wire)
        work = self.comm.all_reduce(buf, rep, async_op=True)
        self.combine_handle = Handle([work], lambda: buf[o_lo:o_hi].float())

    def _quantized_combine(self, o_lo: int, o_hi: int) -> Handle:
        """INT8 reduce-scatter across replicas (one all-to-all of block-quantized slices, sums in
        fp32), then, when this rank's optimizer shard is wider than its slice, an INT8 all-gather
        of the summed slices (every replica then dequantizes the same bytes: identical updates)."""
        rep, acc, plan = self.g.replicas, self.grad_acc, self.plan
        bits, blk, r = plan.combine_bits, plan.grad_quant_block_size, rep.size
        m = acc.numel() // r
        i = rep.index(self.comm.rank)
        src = acc
        if plan.error_feedback:  # add the last step's quantization residual, keep the new one
            src = acc if self.ef_combine is None else acc + self.ef_combine
        q, sc = kernels.quantize(src, bits, blk, backend=self.backend)
        if plan.error_feedback:
            self.ef_combine = src - kernels.dequantize(q, sc, bits, blk, src.numel(), backend=self.backend)
        rq, rs = torch.empty_like(q), torch.empty_like(sc)
        first = [self.comm.all_to_all(rq, q, rep, async_op=True), self.comm.all_to_all(rs, sc, rep, async_op=True)]
        mine = torch.empty(m, dtype=torch.float32, device=self.device)
        gather = (o_lo, o_hi) != (i * m, (i + 1) * m)
        bufs = {}

        def second() -> list:
            kernels.dequantize_sum(rq.view(r, -1), rs.view(r, -1), bits, blk, m, out=mine, backend=self.backend)
            if not gather:
                return []
            q2, s2 = kernels.quantize(mine, bits, blk, backend=self.backend)
            bufs["q"] = torch.empty(q2.numel() * r, dtype=q2.dtype, device=self.device)
            bufs["s"] = torch.empty(s2.numel() * r, dtype=s2.dtype, device=self.device)
            bufs["send"] = (q2, s2)  # lives until the collectives are done
            return [self.comm.all_gather(bufs["q"], q2, rep, async_op=True),
                    self.comm.all_gather(bufs["s"], s2, rep, async_op=True)]

        def finish(_keep=(q, sc)):
            if not gather:
                return mine
            # every replica holding this optimizer shard must apply the same gradient, so the
            # slice this rank summed is taken from the gathered INT8 copy too, like everyone's
            acc.copy_(kernels.dequantize(bufs["q"], bufs["s"], bits, blk, acc.numel(), backend=self.backend))
            return acc[o_lo:o_hi]

        return TwoStageHandle(first, second, finish)

    def combine_replicas(self) -> torch.Tensor:
        """Once per step: sum gradient shards across replicas; return this rank's fp32
        optimizer-shard gradient (a view when possible)."""
        self.start_combine()
        h, self.combine_handle = self.combine_handle, None
        return h.wait()

    # -------------------------------------------------------------------------- publish
    def start_publish(self, master: torch.Tensor) -> None:
        """After the update: rebuild the primary shard from the optimizer shards. The post-step
        all-gather runs in the background; the unit's next gather (or forward) waits for it."""
        self.wait_publish()
        plan = self.plan
        grp = self.g.post_gather
        new = master.detach().to(self.dtype)
        self.invalidate_secondary()
        self.grad_acc.zero_()
        if grp.size == 1:
            a = self.optim_range[0] - self.primary_range[0]
            self.primary[a:a + new.numel()].copy_(new)
            self._published()
            return
        if new.data_ptr() == master.data_ptr():  # fp32: do not send the live master
            new = new.clone()
        slots = L.post_gather_slots(grp.ranks, *plan.factors)
        if plan.publish_bits < 16:
            self.publish_handle = self._quantized_publish(new, grp, slots)
            return
        # gather straight into the primary shard (group order), then move the pieces to their
        # shard slots in place, one piece of scratch: no primary-sized staging buffer per unit
        work = self.comm.all_gather(self.primary, new, grp, async_op=True)

        def place(_keep=new):
            L.permute_chunks_(self.primary.view(grp.size, -1), slots)
            self._published()

        self.publish_handle = Handle([work], place)

    def _quantized_publish(self, new: torch.Tensor, grp: Group, slots: list[int]) -> Handle:
        """INT8 all-gather of the updated shards; every piece is dequantized into its slot of the
        primary shard except this rank's own, copied exactly. The master is fp32 and every rank
        requantizes its fresh shard each step, so the error never accumulates."""
        bits, blk, n = self.plan.publish_bits, self.plan.quant_block_size, new.numel()
        q, sc = kernels.quantize(new, bits, blk, backend=self.backend)
        qall = torch.empty(q.numel() * grp.size, dtype=q.dtype, device=self.device)
        sall = torch.empty(sc.numel() * grp.size, dtype=sc.dtype, device=self.device)
        works = [self.comm.all_gather(qall, q, grp, async_op=True), self.comm.all_gather(sall, sc, grp, async_op=True)]
        me = grp.index(self.comm.rank)

        def place(_keep=(q, sc)):
            qv, sv = qall.view(grp.size, -1), sall.view(grp.size, -1)
            for j, slot in enumerate(slots):
                dst = self.primary[slot * n:(slot + 1) * n]
                if j == me:
                    dst.copy_(new)
                else:
                    dst.copy_(kernels.dequantize(qv[j], sv[j], bits, blk, n, dtype=self.dtype, backend=self.backend))
            self._published()

        return Handle(works, place)

    def wait_publish(self) -> None:
        if self.publish_handle is not None:
            h, self.publish_handle = self.publish_handle, None
            h.wait()

    def publish(self, master: torch.Tensor) -> None:
        """Synchronous publish (checkpoint load)."""
        self.start_publish(master)
        self.wait_publish()

    def _published(self) -> None:
        if self.plan.weight_factor == 1:
            self._set_views(self.primary)

    def decay_ranges(self) -> list[tuple[int, int]]:
        """Ranges (relative to the optimizer shard) of parameters that get weight decay."""
        lo, hi = self.optim_range
        out = []
        for s in self.specs:
            a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
            if s.decay and a < b:
                out.append((a - lo, b - lo))
        return out
