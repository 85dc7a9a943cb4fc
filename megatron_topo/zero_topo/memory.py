"""Per-rank memory of a plan, exactly as the engine allocates it (pure functions).

``state_bytes`` reproduces, byte for byte, what ``ZeroTopoEngine.model_state_bytes()`` measures
from tensor storage: every unit's flat buffer is padded to whole quantization blocks on every
shard, weights are kept in the compute dtype, the secondary copy at its bits plus one fp32 scale
per block, gradient shards in fp32 and the optimizer shard as fp32 master + two fp32 moments.
``peak_estimate`` adds what a step needs on top (activations, gathered units) for the preflight
check every run makes before it allocates anything.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from . import layout as L
from . import traffic
from .sharding import Plan

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SCALE_BYTES = 4  # one fp32 scale per quantization block
ADAM_STATE_BYTES = 12  # fp32 master + exp_avg + exp_avg_sq, per parameter of the optimizer shard
GIB = 1024**3
STEP_SCALARS = 64 * 1024  # the step's per-unit norms and overflow flags (a few KiB), rounded up


def block_sizes(plan: Plan) -> list[int]:
    """Quantization blocks every shard must hold whole (16: plain alignment)."""
    out = []
    if plan.weight_bits < 16 or (plan.secondary_degree and plan.secondary_bits < 16) or plan.publish_bits < 16:
        out.append(plan.quant_block_size)
    if plan.grad_bits < 16 or plan.combine_bits < 16:
        out.append(plan.grad_quant_block_size)
    return out or [16]


def padded_units(unit_numels: Sequence[int], plan: Plan, world_size: int) -> list[int]:
    align = L.alignment(world_size, block_sizes(plan))
    return [L.padded_size(n, align) for n in unit_numels]


def _quantized_bytes(n: int, bits: int, block: int) -> int:
    return n * bits // 8 + (n // block) * SCALE_BYTES


def state_bytes(unit_numels: Sequence[int], plan: Plan, world_size: int, precision: str) -> dict:
    """Model-state bytes one rank holds between steps (secondary copies alive, as in backward)."""
    e = DTYPE_BYTES[precision]
    w, g, o = plan.factors
    s = plan.secondary_degree
    out = {"weights": 0, "secondary": 0, "gradients": 0, "optimizer": 0, "residuals": 0}
    r = world_size // g  # replicas of a gradient shard
    for P in padded_units(unit_numels, plan, world_size):
        if plan.error_feedback:  # fp32 residuals of the quantized in-node reduction and combine
            out["residuals"] += (P * 4 if plan.grad_bits < 16 and g > 1 else 0) + (
                P // g * 4 if plan.combine_bits < 16 and r > 1 else 0
            )
        out["weights"] += P // w * e
        if s and w > 1:
            n = P // s
            out["secondary"] += (
                n * e if plan.secondary_bits == 16 else _quantized_bytes(n, plan.secondary_bits, plan.quant_block_size)
            )
        out["gradients"] += P // g * 4
        out["optimizer"] += P // o * ADAM_STATE_BYTES
    out["total"] = sum(out.values())
    return out


def _q(n: int, bits: int, block: int) -> int:
    """Bytes of a quantized buffer of ``n`` elements as the kernels allocate it: payload of whole
    blocks plus one fp32 scale per block (16 bits: not quantized, 0 here)."""
    nb = -(-n // block)
    return nb * block * bits // 8 + nb * SCALE_BYTES


def unit_buffers(P: int, plan: Plan, world_size: int, precision: str, ranks_per_node: int) -> dict:
    """Transient bytes one unit of padded size ``P`` holds at each moment of a step, as the
    engine's transports allocate them (unit.py, transports.py): the gathered unit and its
    receive/send buffers, one reduction in flight, the cross-replica combine from its launch in
    the last backward until it is finished: ``combine`` (first stage in flight),
    ``combine_advanced`` (its second stage issued), ``combine_advance_peak`` and
    ``combine_finish_peak`` (while the second stage is issued, while it is finished) and
    ``combine_kept`` (once finished: the step's fp32 gradient, until the step returns), the fp32
    and the post-step gather's buffers, alive until the unit's next gather. (Every combine leaves its
    result in the fp32 gradient shard, or in its fp32 slice: no other fp32 gradient is allocated.)"""
    e = DTYPE_BYTES[precision]
    wb = e  # the gradient wire dtype is the compute dtype (ZeroTopoEngine's grad_comm_dtype default)
    w, g, o = plan.factors
    r = world_size // g
    blk, gblk = plan.quant_block_size, plan.grad_quant_block_size
    out = dict.fromkeys(
        (
            "full",
            "gather_fwd",
            "gather_bwd",
            "reduce",
            "flat_grad",
            "combine",
            "combine_stage2",
            "combine_advanced",
            "combine_advance_peak",
            "combine_finish_peak",
            "combine_kept",
            "unpack",
            "publish",
            "publish_tmp",
        ),
        0,
    )
    if w > 1:
        out["full"] = P * e
        if plan.weight_bits < 16:  # the quantized primary shard sent + the gathered payload
            out["gather_fwd"] = _q(P // w, plan.weight_bits, blk) + _q(P, plan.weight_bits, blk)
        out["gather_bwd"] = out["gather_fwd"]
        if plan.secondary_degree and plan.secondary_bits < 16:  # from the secondary (already held)
            out["gather_bwd"] = _q(P, plan.secondary_bits, blk)
        elif plan.secondary_degree:
            out["gather_bwd"] = 0
    # one micro-batch's gradient: the parameters' gradients and the flat buffer they are copied into
    out["flat_grad"] = P * e + P * wb
    reduce = traffic.reduce_transport(plan, ranks_per_node)
    if reduce == "reduce_scatter_16bit":  # the reordered send + the received shard
        out["reduce"] = P * wb + P // g * wb
    elif reduce == "quantized_all_to_all_reduce":  # send + receive
        out["reduce"] = 2 * _q(P, plan.grad_bits, gblk)
    elif reduce == "two_hop_reduce":  # both hops' send + receive
        out["reduce"] = 2 * _q(P, plan.grad_bits, gblk) + 2 * _q(P // ranks_per_node, plan.grad_bits, gblk)
    G, O = P // g, P // o
    combine = traffic.combine_transport(plan, world_size)
    if combine != "combine_local":
        if combine == "combine_quantized":  # QuantizedCombine: send + receive, this rank's fp32 slice
            out["combine"] = 2 * _q(G, plan.combine_bits, gblk) + G // r * 4
            # packed.pack's send copy beside the quantized shard, and packed.unpack's contiguous
            # copy of what was received: one unit at a time
            out["unpack"] = _q(G, plan.combine_bits, gblk)
            slice_ = G // r * 4
            if O != G // r:  # the all-gather of the summed slices
                out["combine_stage2"] = _q(G // r, plan.combine_bits, gblk) + _q(G, plan.combine_bits, gblk)
            # its second stage issued (QuantizedCombine._second): the received copy unpacked beside
            # the first stage's buffers, which then go; the slice quantized (payload + scales
            # beside the packed send) and the gather's receive buffer
            out["combine_advanced"] = slice_ + out["combine_stage2"]
            tmp = _q(G // r, plan.combine_bits, gblk) if out["combine_stage2"] else 0
            out["combine_advance_peak"] = max(out["combine"] + out["unpack"], out["combine_advanced"] + tmp)
            if out["combine_stage2"]:  # finished: the gathered copy unpacked, dequantized into the shard
                out["combine_finish_peak"] = out["combine_advanced"] + _q(G, plan.combine_bits, gblk)
            else:  # finished: the fp32 slice is the step's gradient, kept until the step returns
                out["combine_finish_peak"] = out["combine_kept"] = slice_
        elif combine == "combine_ordered_all_gather":  # the wire copy + every replica's
            out["combine"] = (r + 1) * G * wb
        elif combine == "combine_reduce_scatter":  # the wire copy + the received shard
            out["combine"] = G * wb + O * wb
        else:  # combine_all_reduce: in place in fp32, else a wire copy
            out["combine"] = 0 if wb == 4 else G * wb
        if combine != "combine_quantized":  # one stage, finished into the fp32 gradient shard
            out["combine_advanced"] = out["combine_advance_peak"] = out["combine_finish_peak"] = out["combine"]
    post = max(1, o // w)
    # the updated shard in the compute dtype (a copy of the master in fp32 only where it is sent)
    out["publish_tmp"] = O * e if (e != 4 or post > 1) else 0
    if post > 1:
        out["publish"] = O * e  # the updated shard in the compute dtype (fp32: a copy of the master)
        if plan.publish_bits < 16:
            out["publish"] += (1 + post) * _q(O, plan.publish_bits, blk)
            # packed.pack's copy: the quantized shard and its packed send buffer, one unit at a time
            out["publish_tmp"] += _q(O, plan.publish_bits, blk)
    return out


def buffer_bytes(
    unit_numels: Sequence[int],
    plan: Plan,
    world_size: int,
    precision: str,
    ranks_per_node: Optional[int] = None,
    max_in_flight: int = 2,
    sec: Optional[int] = None,
    max_combines: int = 0,
) -> dict:
    """Buffers beyond the model states at each phase of a step (bytes per rank), from
    :func:`unit_buffers`: ``forward`` (gathered units: the one computing and the prefetched next;
    the post-step gathers of the previous step still held by units not yet reached),
    ``backward`` (gathers, ``max_in_flight`` + 1 reductions in flight and one flat gradient),
    ``combines`` (the combine buffers' peak through the last backward: at most ``max_combines``
    units' in flight (0: every unit's; ZeroTopoEngine's ``max_combines_in_flight``) and the fp32
    slices the finished ones keep, :func:`_combine_phases`) and ``step`` (the step's peak: the
    combines still in flight with their second stage, then the fp32 slices and every unit's
    post-step gather with the secondaries dropped)."""
    if not unit_numels:
        return {"forward": 0, "publish": 0, "backward": 0, "combines": 0, "step": 0}
    rpn = ranks_per_node or world_size
    padded = padded_units(unit_numels, plan, world_size)
    counts = Counter(padded)  # most units share a size: each computed once
    by_size = {P: unit_buffers(P, plan, world_size, precision, rpn) for P in counts}
    kinds = [(by_size[P], c) for P, c in counts.items()]
    n = 2 if plan.prefetch else 1

    def top(key: str, k: int) -> int:  # the k largest units' bytes of ``key``
        out = 0
        for u, c in sorted(kinds, key=lambda uc: -uc[0][key]):
            take = min(c, k)
            out, k = out + take * u[key], k - take
            if k == 0:
                break
        return out

    total = lambda key: sum(u[key] * c for u, c in kinds)  # noqa: E731
    # forward: the unit computing and the prefetched next one, whose quantized payload is in flight
    fwd = top("full", n) + top("gather_fwd", 1)
    # backward: the unit computing (its parameters' gradients, the flat gradient), the previous
    # unit's gather from the secondary in flight, up to max_in_flight + 1 reductions in flight
    bwd = top("full", n) + top("gather_bwd", 1) + top("flat_grad", 1) + top("reduce", max_in_flight + 1)
    if sec is None:
        sec = state_bytes(unit_numels, plan, world_size, precision)["secondary"]
    combines, step = _combine_phases([by_size[P] for P in padded], max_combines)
    kept = total("combine_kept")  # every combine finished: the fp32 slices the step uses
    # step: the combines still in flight, then the fp32 gradients and every post-step gather, the
    # secondaries dropped as they go out
    step = max(step, kept + max(total("publish") - sec, 0) + top("publish_tmp", 1)) + STEP_SCALARS
    return {"forward": fwd, "publish": total("publish"), "backward": bwd, "combines": combines, "step": max(step, 0)}


def _combine_phases(units: list[dict], max_combines: int) -> tuple[int, int]:
    """The combine buffers' peak through the last backward and through the step (bytes per rank),
    as the engine schedules them (engine._start_combine): units (``unit_buffers``, unit order)
    launch their combine in reverse unit order as backward reaches them, each finished when the
    ``k``-th after it is launched (``k`` = ``max_combines``, all units when 0); a finished one
    keeps ``combine_kept`` (a one-stage INT8 combine's fp32 slice; the others finish into the fp32
    gradient shard). The step issues the second stages of the ``k`` still in flight (the
    first units), in unit order, then finishes them in unit order. (A ``step`` without a
    ``last_micro_batch`` backward launches them in unit order instead: not modelled.)"""
    n = len(units)
    k = n if max_combines <= 0 else min(max_combines, n)
    launch = units[::-1]
    kept = [u["combine_kept"] for u in launch]
    first = [u["combine"] for u in launch]
    done = inflight = 0  # kept bytes of the finished ones, first-stage bytes of those in flight
    peak = 0
    for j, u in enumerate(launch):
        if j >= k:  # the oldest is finished first: its second stage, then its gradient
            v = launch[j - k]
            inflight -= first[j - k]
            peak = max(peak, done + inflight + max(v["combine_advance_peak"], v["combine_finish_peak"]))
            done += kept[j - k]
        # launched: quantized beside its packed send buffer (one unpack's bytes)
        inflight += first[j]
        peak = max(peak, done + inflight + u["unpack"])
    backward = max(peak, done + inflight)
    # the step: launch[n - k:] in flight, i.e. units[:k] in unit order
    fl = units[:k]
    base = done
    adv = sum(u["combine"] for u in fl)  # advancing in unit order: the earlier ones advanced
    step = 0
    for u in fl:
        adv -= u["combine"]
        step = max(step, base + adv + u["combine_advance_peak"])
        base += u["combine_advanced"]
    left = sum(u["combine_advanced"] for u in fl)  # finishing in unit order
    base = done
    for u in fl:
        left -= u["combine_advanced"]
        step = max(step, base + left + u["combine_finish_peak"])
        base += u["combine_kept"]
    return backward, max(step, base)


def activation_bytes(
    hidden: int, heads: int, layers: int, seq: int, vocab: int, micro_batch: int, precision: str, recompute: bool
) -> int:
    """Activations of one micro-batch (Korthikanti et al. 2022, per layer ``s*b*h*(34 + 5*a*s/h)``
    bytes at 16 bits, no sequence parallelism): with recompute only each layer's input is kept
    plus one layer's working set; the head keeps the logits, their fp32 copy and gradient."""
    e = DTYPE_BYTES[precision]
    sbh = seq * micro_batch * hidden
    per_layer = int(sbh * (34 + 5 * heads * seq / hidden) * e / 2)
    body = layers * sbh * e + per_layer if recompute else layers * per_layer
    head = micro_batch * seq * vocab * (e + 4 + 4)
    return body + head


def peak_estimate(
    unit_numels: Sequence[int],
    plan: Plan,
    world_size: int,
    precision: str,
    *,
    hidden: int,
    heads: int,
    layers: int,
    seq: int,
    vocab: int,
    micro_batch: int,
    recompute: bool,
    ranks_per_node: Optional[int] = None,
    activations: Optional[int] = None,
    max_combines: int = 0,
) -> dict:
    """The peak of one rank over a step: model states plus the largest of the phases of
    :func:`buffer_bytes` with the activations alive at that moment. Activations are freed
    through backward as the combines of the last micro-batch accumulate (and built through
    forward as the post-step gathers are consumed), so each pair counts at its larger end.
    ``activations``: the model spec's activation bytes when given (else GPT-NeoX's formula from
    the shape keywords). ``max_combines``: the engine's ``max_combines_in_flight`` (0: unbounded)."""
    st = state_bytes(unit_numels, plan, world_size, precision)
    act = (
        activations
        if activations is not None
        else activation_bytes(hidden, heads, layers, seq, vocab, micro_batch, precision, recompute)
    )
    b = buffer_bytes(
        unit_numels, plan, world_size, precision, ranks_per_node, sec=st["secondary"], max_combines=max_combines
    )
    phases = {
        "forward": b["forward"] + max(act, b["publish"]),
        "backward": b["backward"] + max(act, b["combines"]),
        "step": b["step"],
    }
    buf = max(phases.values())
    return {
        "model_states": st["total"],
        "states": st,
        "activations": act,
        "buffers": buf - act,
        "buffer_phases": b,
        "phases": phases,
        "total": st["total"] + buf,
    }


def publish_buffer_bytes(
    unit_numels: Sequence[int], plan: Plan, world_size: int, precision: str, in_flight: int = 2
) -> int:
    """The INT8 post-step publish's buffers alive at once (``publish_bits: 8``; 0 otherwise):
    the engine keeps at most ``in_flight`` (its ``max_in_flight``) publishes in flight, each
    holding its packed receive buffer (the primary shard at 8 bits + scales, ``L/w + 4·L/(w·B)``),
    its packed send buffer (``L/o + 4·L/(o·B)``) and the compute-dtype shard it sends
    (``e·L/o``); finishing one unpacks a receive buffer once more, transiently."""
    w, o = plan.weight_factor, plan.optimizer_factor
    if plan.publish_bits >= 16 or o == w or not unit_numels:
        return 0
    e, B = DTYPE_BYTES[precision], plan.quant_block_size
    big = max(padded_units(unit_numels, plan, world_size))
    recv = _quantized_bytes(big // w, plan.publish_bits, B)
    send = _quantized_bytes(big // o, plan.publish_bits, B)
    return max(1, in_flight) * (recv + send + e * big // o) + recv
