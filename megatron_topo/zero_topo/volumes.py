"""What one rank sends in a collective: the ring algorithm of record (docs/design.md §4.8).

An all-gather, reduce-scatter or all-to-all over d ranks of a buffer of S bytes (the whole
buffer: an all-gather's output, a reduce-scatter's or all-to-all's input) sends ``S·(d−1)/d`` per
rank, an all-reduce ``2·S·(d−1)/d``; a ring takes d − 1 steps (2(d − 1) for an all-reduce). The
counters (``comm.Comm``, tools/fsdp_baseline.py) and the analysis side's formulas and performance
model all use these two functions.
"""

from __future__ import annotations

from typing import Union

RING_FACTOR = {"all_gather": 1, "reduce_scatter": 1, "all_to_all": 1, "all_reduce": 2}

Number = Union[int, float]


def ring_bytes(op: str, size: Number, d: int) -> Number:
    """Bytes one rank sends in ``op`` over ``d`` ranks of a ``size``-byte buffer. An int ``size``
    gives the floor in integer arithmetic (the counters), a float the quotient (the formulas)."""
    if d <= 1:
        return size * 0
    sent = RING_FACTOR[op] * size * (d - 1)
    return sent // d if isinstance(sent, int) else sent / d


def ring_steps(op: str, d: int) -> int:
    """Sequential steps of ``op`` over ``d`` ranks (pairwise exchanges for an all-to-all)."""
    return RING_FACTOR[op] * (d - 1)
