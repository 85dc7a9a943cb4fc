"""One wrapped unit: its nested flat buffer, weight gathers and secondary shard; the gradient
reduction, cross-replica combine and post-step publish it runs are chosen from ``transports``.

Memory a unit keeps between steps (per rank): the primary shard (compute dtype, L/w), the
secondary copy (INT8 + scales or 16-bit, L/s) while valid, the fp32 gradient shard (L/g) and, in
the optimizer, the fp32 master shard and two Adam moments (L/os each). The full buffer (L) only
exists between a gather and the matching free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

from . import kernels, packed, transports
from . import layout as L
from .comm import Comm, Group, Handle, TwoStageHandle
from .sharding import Plan

# the secondary copy: (INT payload, fp32 scales) or a 16-bit tensor
Secondary = Union[tuple[torch.Tensor, torch.Tensor], torch.Tensor]


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
    grad: Optional[Group]  # g consecutive ranks (None: the reduce transport does not use it)
    node: Optional[Group]  # ranks of this node (first hop of the 2-hop reduction; None without it)
    two_hop_peers: Optional[Group]
    replicas: Group  # ranks holding the same gradient shard (cross-replica combine)
    optim: Group  # os consecutive ranks (norm)
    post_gather: Group  # ranks whose optimizer shards tile this rank's primary shard
    world: Group


class ShardedUnit:
    def __init__(
        self,
        index: int,
        module: nn.Module,
        params: list[tuple[str, nn.Parameter]],
        plan: Plan,
        comm: Comm,
        groups: UnitGroups,
        dtype: torch.dtype,
        align: int,
        grad_comm_dtype: torch.dtype,
        kernel_backend: Optional[str],
        device: Optional[torch.device] = None,
        init: Optional[Callable[[nn.Module], None]] = None,
    ) -> None:
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
        self.master_init = full[self.optim_range[0] : self.optim_range[1]].clone()  # fp32
        self.grad_acc = torch.zeros(lay.grad_numel, dtype=torch.float32, device=device)
        self.full: Optional[torch.Tensor] = None
        self.secondary: Optional[Secondary] = None
        self.gather_handle: Optional[Handle] = None
        self.reduce_handles: list[Handle] = []
        self.combine_handle: Optional[Handle] = None
        self.combined: Optional[torch.Tensor] = None  # a combine finished before the step: its result
        self.publish_handle: Optional[Handle] = None
        self.grads_ready = 0
        self.reduced_this_backward = False
        self.borrows: list["ShardedUnit"] = []  # units owning tied weights this unit also computes with
        # error feedback (plan.error_feedback): fp32 residuals of the last in-node gradient
        # quantization (padded unit, original order) and of the last quantized combine (grad shard)
        self.ef_reduce: Optional[torch.Tensor] = None
        self.ef_combine: Optional[torch.Tensor] = None
        self.ef_perm = transports.reduce_perm_index(plan, comm.topo.ranks_per_node, device)
        # the transports this plan runs (transports.py), chosen once
        self.reduce_transport = transports.select_reduce(plan, comm.topo.ranks_per_node)
        self.combine_transport = transports.select_combine(plan, comm.topo.world_size)
        self.publish_transport = transports.select_publish(plan)
        # the combine allocates buffers held until it is waited for (all but the one-replica
        # combine and the in-place fp32 all-reduce): the engine bounds how many are in flight
        self.combine_holds_buffers = transports.combine_holds_buffers(self.combine_transport, grad_comm_dtype)
        # the gathered unit (w > 1) lives in one flat buffer kept for the unit's lifetime whose
        # storage is allocated by each gather and released (resized to 0 bytes) by each free, as
        # FSDP does: the module's parameters, and whatever autograd saved from them in forward,
        # view that storage, so the backward gather refills it in place and the forward's full
        # weights are not kept alive by autograd until backward (docs/design.md §4.6)
        self._flat: Optional[torch.Tensor] = None
        if plan.weight_factor == 1:  # replicated weights: the module always views the primary
            self.full = self.primary
            self._set_views(self.primary)
        else:
            self._flat = torch.empty(lay.padded, dtype=dtype, device=device)
            _release(self._flat)
            self._set_empty()

    # -------------------------------------------------------------------------- params
    def _flatten_params(self, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(self.layout.padded, dtype=dtype, device=self.device)
        for s in self.specs:
            out[s.offset : s.offset + s.numel].copy_(s.param.detach().reshape(-1))
        return out

    def _rebind_params(self, full: torch.Tensor) -> None:
        """Replace the (meta) parameters by parameters viewing ``full``: a meta parameter's data
        cannot be set to a real tensor, so the module gets new Parameter objects."""
        for s in self.specs:
            owner, _, leaf = s.name.rpartition(".")
            mod = self.module.get_submodule(owner) if owner else self.module
            new = nn.Parameter(full[s.offset : s.offset + s.numel].view(s.shape), requires_grad=s.param.requires_grad)
            mod._parameters[leaf] = new
            s.param = new

    def _set_views(self, full: torch.Tensor) -> None:
        for s in self.specs:
            s.param.data = full[s.offset : s.offset + s.numel].view(s.shape)

    def _set_empty(self) -> None:
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
            full = self._allocate_flat()
            work = self.comm.all_gather(full, shard, grp, async_op=True)

            def finish() -> torch.Tensor:
                if keep_secondary:
                    self._make_secondary(full, None)
                return full
        else:
            if src is not None:
                q, sc = src
            else:
                q, sc = kernels.quantize(self.primary, bits, blk, backend=self.backend)
            # payload and scales in one collective (packed.py)
            send, recv = packed.pack(q, sc), packed.empty_like_packed(q, sc, grp.size)
            work = self.comm.all_gather(recv, send, grp, async_op=True)
            qn, qdtype = q.numel() * q.element_size(), q.dtype
            del q, sc

            def finish(_keep: torch.Tensor = send) -> torch.Tensor:
                qall, sall = packed.unpack(recv, grp.size, qn, qdtype)
                full = self._allocate_flat()
                kernels.dequantize(qall, sall, bits, blk, Ltot, dtype=self.dtype, backend=self.backend, out=full)
                if src is None:
                    a, b = self.primary_range
                    full[a:b].copy_(self.primary)  # the local shard stays exact
                if keep_secondary:
                    self._make_secondary(full, (qall, sall) if plan.secondary_bits == bits else None)
                return full

        works = work if isinstance(work, list) else [work]
        self.gather_handle = Handle(works, finish)

    def _make_secondary(self, full: torch.Tensor, quantized: Optional[tuple[torch.Tensor, torch.Tensor]]) -> None:
        a, b = self._secondary_range()
        plan = self.plan
        if plan.secondary_bits == 16:
            self.secondary = full[a:b].clone()
            return
        blk = plan.quant_block_size
        if quantized is not None:  # reuse the gathered INT8 blocks: no requantization
            qall, sall = quantized
            per_byte = 1 if plan.weight_bits == 8 else 2
            self.secondary = (qall[a // per_byte : b // per_byte].clone(), sall[a // blk : b // blk].clone())
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

    def _allocate_flat(self) -> torch.Tensor:
        """Give the flat buffer its storage back; returns an alias to write the gathered unit
        into (its own version counter: refilling the buffer is not an in-place change of the
        weights autograd saved, which get the same values back)."""
        flat = self._flat
        st = flat.untyped_storage()
        nbytes = flat.numel() * flat.element_size()
        if st.nbytes() != nbytes:
            st.resize_(nbytes)
        return flat.data

    def free_full(self) -> None:
        if self.plan.weight_factor == 1:
            return
        if self.full is not None:
            self.full = None
            self._set_empty()
        if self.gather_handle is None:  # an in-flight gather still writes into the storage
            _release(self._flat)

    def flat_storage_bytes(self) -> int:
        """Bytes the gathered-unit buffer holds now (0 when freed or with replicated weights)."""
        return 0 if self._flat is None else self._flat.untyped_storage().nbytes()

    def invalidate_secondary(self) -> None:
        self.secondary = None

    # -------------------------------------------------------------------------- gradients
    def flat_grad(self, scale: float) -> torch.Tensor:
        """The unit's gradient as one flat buffer (wire dtype), pre-divided by the DP size."""
        g = torch.empty(self.layout.padded, dtype=self.grad_comm_dtype, device=self.device)
        for s in self.specs:  # the specs tile [0, numel) back to back
            if s.param.grad is not None:
                g[s.offset : s.offset + s.numel].copy_(s.param.grad.reshape(-1))
                s.param.grad = None
            else:
                g[s.offset : s.offset + s.numel].zero_()
        g[self.numel :].zero_()  # alignment padding
        if scale != 1.0:
            g.mul_(scale)
        return g

    def start_reduce(self, scale: float) -> None:
        """Reduce this micro-batch's gradient into the fp32 gradient shard (async unless the
        transport is ``accumulate_local``)."""
        h = self.reduce_transport(self, scale)
        if h is not None:
            self.reduce_handles.append(h)

    def reset_residuals(self) -> None:
        """Drop the error-feedback residuals (a skipped step's gradients were not finite)."""
        self.ef_reduce = self.ef_combine = None

    def advance_reduce(self) -> bool:
        """Launch a 2-hop reduction's second hop (waiting for its first hop); True when a hop was
        launched now. The engine calls it at fixed points of its schedule."""
        return any([h.advance() for h in self.reduce_handles])

    def wait_reduce(self) -> None:
        for h in self.reduce_handles:
            h.wait()
        self.reduce_handles.clear()

    # -------------------------------------------------------------------------- step
    def start_combine(self) -> None:
        """Launch the once-per-step sum of gradient shards across replicas (async). The engine
        calls it when it finishes the last micro-batch's reduction of this unit, during the rest of
        backward, so the cross-node traffic overlaps it; ``combine_replicas`` waits for it."""
        if self.combine_started():
            return
        o_lo = self.optim_range[0] - self.grad_range[0]
        self.combine_handle = self.combine_transport(self, o_lo, o_hi=o_lo + self.layout.optim_numel)

    def advance_combine(self) -> bool:
        """Launch the second stage of a two-stage combine (the quantized combine's all-gather),
        waiting for its first stage: the engine calls it for every unit, in unit order on every
        rank, before it waits for any unit's result. True if it went out now."""
        h = self.combine_handle
        return isinstance(h, TwoStageHandle) and h.advance()

    def combine_started(self) -> bool:
        """This step's combine is in flight or finished (its result not yet taken by the step)."""
        return self.combine_handle is not None or self.combined is not None

    def finish_combine(self) -> None:
        """Wait for the combine in flight (issuing its second stage first if it has one) and keep
        its result, the fp32 optimizer-shard gradient; its transfer buffers are dropped."""
        if self.combine_handle is not None:
            h, self.combine_handle = self.combine_handle, None
            self.combined = h.wait()

    def combine_replicas(self) -> torch.Tensor:
        """Once per step: sum gradient shards across replicas; return this rank's fp32
        optimizer-shard gradient (a view when possible)."""
        self.start_combine()
        self.finish_combine()
        out, self.combined = self.combined, None
        return out

    # -------------------------------------------------------------------------- publish
    def start_publish(self, master: torch.Tensor) -> None:
        """After the update: rebuild the primary shard from the optimizer shards. The post-step
        all-gather runs in the background; the unit's next gather (or forward) waits for it."""
        self.wait_publish()
        new = master.detach().to(self.dtype)
        self.invalidate_secondary()
        self.grad_acc.zero_()
        self.publish_handle = self.publish_transport(self, master, new)

    def publish_receives(self) -> bool:
        """A publish is in flight whose receive buffer is more than the primary shard itself
        (the INT8 publish: payload and scales, dequantized into the shard when it is waited for)."""
        return self.publish_handle is not None and self.publish_transport is transports.publish_quantized

    def wait_publish(self) -> None:
        if self.publish_handle is not None:
            h, self.publish_handle = self.publish_handle, None
            h.wait()

    def publish(self, master: torch.Tensor) -> None:
        """Synchronous publish (checkpoint load)."""
        self.start_publish(master)
        self.wait_publish()

    def refresh_views(self) -> None:
        """After a publish: with replicated weights the module views the primary shard again."""
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


def _release(t: torch.Tensor) -> None:
    """Free ``t``'s storage, keeping the tensor (and every view of it) valid to refill."""
    st = t.untyped_storage()
    if st.nbytes():
        st.resize_(0)
