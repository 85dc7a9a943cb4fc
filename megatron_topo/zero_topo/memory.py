"""Per-rank memory of a plan, exactly as the engine allocates it (pure functions).

``state_bytes`` reproduces, byte for byte, what ``ZeroTopoEngine.model_state_bytes()`` measures
from tensor storage: every unit's flat buffer is padded to whole quantization blocks on every
shard, weights are kept in the compute dtype, the secondary copy at its bits plus one fp32 scale
per block, gradient shards in fp32 and the optimizer shard as fp32 master + two fp32 moments.
``peak_estimate`` adds what a step needs on top (activations, gathered units) for the preflight
check every run makes before it allocates anything.
"""
from __future__ import annotations

from typing import Optional, Sequence

from . import layout as L
from .sharding import Plan

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SCALE_BYTES = 4  # one fp32 scale per quantization block
ADAM_STATE_BYTES = 12  # fp32 master + exp_avg + exp_avg_sq, per parameter of the optimizer shard
GIB = 1024 ** 3


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
                P // g * 4 if plan.combine_bits < 16 and r > 1 else 0)
        out["weights"] += P // w * e
        if s and w > 1:
            n = P // s
            out["secondary"] += n * e if plan.secondary_bits == 16 else _quantized_bytes(
                n, plan.secondary_bits, plan.quant_block_size)
        out["gradients"] += P // g * 4
        out["optimizer"] += P // o * ADAM_STATE_BYTES
    out["total"] = sum(out.values())
    return out


def gather_buffer_bytes(unit_numels: Sequence[int], plan: Plan, world_size: int, precision: str) -> int:
    """The gathered full units alive at once: the one computing and the prefetched next one
    (plus the quantized receive buffers of a low-bit gather), and one unit's flat gradient."""
    if not unit_numels:
        return 0
    e = DTYPE_BYTES[precision]
    big = max(padded_units(unit_numels, plan, world_size))
    full = 0 if plan.weight_factor == 1 else (2 if plan.prefetch else 1) * big * e
    if plan.weight_factor > 1 and plan.weight_bits < 16:
        full += (2 if plan.prefetch else 1) * _quantized_bytes(big, plan.weight_bits, plan.quant_block_size)
    grad = big * e if plan.grad_factor > 1 else 0
    return full + grad


def activation_bytes(hidden: int, heads: int, layers: int, seq: int, vocab: int, micro_batch: int,
                     precision: str, recompute: bool) -> int:
    """Activations of one micro-batch (Korthikanti et al. 2022, per layer ``s*b*h*(34 + 5*a*s/h)``
    bytes at 16 bits, no sequence parallelism): with recompute only each layer's input is kept
    plus one layer's working set; the head keeps the logits, their fp32 copy and gradient."""
    e = DTYPE_BYTES[precision]
    sbh = seq * micro_batch * hidden
    per_layer = int(sbh * (34 + 5 * heads * seq / hidden) * e / 2)
    body = layers * sbh * e + per_layer if recompute else layers * per_layer
    head = micro_batch * seq * vocab * (e + 4 + 4)
    return body + head


def peak_estimate(unit_numels: Sequence[int], plan: Plan, world_size: int, precision: str, *,
                  hidden: int, heads: int, layers: int, seq: int, vocab: int, micro_batch: int,
                  recompute: bool, activations: Optional[int] = None) -> dict:
    """``activations``: the model spec's activation bytes when given (else GPT-NeoX's formula
    from the shape keywords)."""
    st = state_bytes(unit_numels, plan, world_size, precision)
    act = activations if activations is not None else activation_bytes(hidden, heads, layers, seq, vocab,
                                                                       micro_batch, precision, recompute)
    buf = gather_buffer_bytes(unit_numels, plan, world_size, precision)
    return {"model_states": st["total"], "states": st, "activations": act, "buffers": buf,
            "total": st["total"] + act + buf}


def publish_buffer_bytes(unit_numels: Sequence[int], plan: Plan, world_size: int, precision: str,
                         in_flight: int = 2) -> int:
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
