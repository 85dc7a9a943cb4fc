"""Nested layout math (docs/design.md §4.5): pure functions, no process groups.

A unit's flat buffer of L elements is split into ``w`` primary shards, each primary shard into
``g/w`` gradient shards and each gradient shard into ``os/g`` optimizer shards. Groups are blocks
of consecutive ranks. For a rank to own gradients and optimizer state only inside its own primary
shard, the shard a rank holds at a finer factor is a digit reversal of its local index:

    idx_w  = r % w
    idx_g  = idx_w * (g / w) + (r % g) // w
    idx_os = idx_g * (os / g) + (r % os) // g

which is ZeRO++'s slice reordering (Eq. 2) generalised to three levels. Collectives whose group
order (sorted ranks) differs from the shard order take a permutation computed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the layout math itself needs no torch
    import torch


def shard_index(rank: int, chain: Sequence[int]) -> int:
    """Index of the shard ``rank`` holds at the last factor of ``chain`` (ascending, nested)."""
    idx = rank % chain[0]
    for prev, cur in zip(chain, chain[1:]):
        if cur % prev:
            raise ValueError(f"factor {cur} is not a multiple of {prev}")
        idx = idx * (cur // prev) + (rank % cur) // prev
    return idx


@dataclass(frozen=True)
class UnitLayout:
    """Sizes of one unit's nested flat buffer."""

    numel: int  # real parameters
    padded: int  # L: multiple of ``align``
    weight_factor: int
    grad_factor: int
    optimizer_factor: int

    @property
    def primary_numel(self) -> int:
        return self.padded // self.weight_factor

    @property
    def grad_numel(self) -> int:
        return self.padded // self.grad_factor

    @property
    def optim_numel(self) -> int:
        return self.padded // self.optimizer_factor

    def chain(self) -> tuple[int, int, int]:
        return self.weight_factor, self.grad_factor, self.optimizer_factor

    def primary_range(self, rank: int) -> tuple[int, int]:
        i = rank % self.weight_factor
        return i * self.primary_numel, (i + 1) * self.primary_numel

    def grad_range(self, rank: int) -> tuple[int, int]:
        i = shard_index(rank, self.chain()[:2])
        return i * self.grad_numel, (i + 1) * self.grad_numel

    def optim_range(self, rank: int) -> tuple[int, int]:
        i = shard_index(rank, self.chain())
        return i * self.optim_numel, (i + 1) * self.optim_numel


def padded_size(numel: int, align: int) -> int:
    return max(align, -(-numel // align) * align)


def alignment(world_size: int, block_sizes: Sequence[int]) -> int:
    """Every shard, secondary piece and reordered slice must hold whole quantization blocks."""
    b = 1
    for s in block_sizes:
        b = b * s // math.gcd(b, s)
    return world_size * max(b, 1)


# ------------------------------------------------------------------------- rank partitions
def blocks(world: int, f: int) -> list[list[int]]:
    """Groups of ``f`` consecutive ranks."""
    return [list(range(b * f, (b + 1) * f)) for b in range(world // f)]


def strided(world: int, f: int) -> list[list[int]]:
    """Ranks with the same local index in every block of ``f`` (the replicas of a shard)."""
    return [list(range(j, world, f)) for j in range(f)]


def post_gather_groups(world: int, w: int, os: int) -> list[list[int]]:
    """Ranks of one optimizer block that hold pieces of the same primary shard."""
    out = []
    for blk in blocks(world, os):
        for q in range(w):
            out.append([r for r in blk if r % w == q])
    return out


def two_hop_peer_groups(world: int, g: int, per_node: int) -> list[list[int]]:
    """Second hop of the 2-hop reduction: same local index, every node of one gradient block."""
    out = []
    for blk in blocks(world, g):
        for p in range(per_node):
            out.append([r for r in blk if r % per_node == p])
    return out


# ------------------------------------------------------------------------- permutations
def reduce_perm(w: int, g: int) -> list[int]:
    """Send-buffer order for a reduce-scatter/all-to-all over a block of ``g`` ranks:
    slot j (group rank j) carries gradient shard ``idx_g(j)``."""
    return [shard_index(j, (w, g)) for j in range(g)]


def two_hop_perm(w: int, g: int, per_node: int) -> list[int]:
    """Slot order for ZeRO++'s 2-hop reduction over a gradient block spanning g/per_node nodes:
    hop 1 sends slots [p*k, (p+1)*k) to local rank p; slot p*k+n carries the shard of rank (n, p)."""
    k = g // per_node
    return [shard_index(n * per_node + p, (w, g)) for p in range(per_node) for n in range(k)]


def post_gather_slots(group: Sequence[int], w: int, g: int, os: int) -> list[int]:
    """For each member (sorted group order) the position of its optimizer shard inside the
    primary shard, in units of optimizer shards."""
    return [shard_index(r, (w, g, os)) % (os // w) for r in group]


def permute_chunks_(rows: torch.Tensor, slots: Sequence[int]) -> None:
    """In place: row ``i`` of ``rows`` moves to row ``slots[i]`` (a permutation), following
    its cycles with one row of scratch."""
    if rows.is_meta:  # no data to move (the dry run): the same scratch row, not one copy per row
        if any(i != j for i, j in enumerate(slots)):
            rows[0].clone()
        return
    inv = [0] * len(slots)
    for i, j in enumerate(slots):
        inv[j] = i
    seen = [False] * len(slots)
    scratch = None
    for start in range(len(slots)):
        if seen[start] or inv[start] == start:
            seen[start] = True
            continue
        if scratch is None:
            scratch = rows[0].clone()
        scratch.copy_(rows[start])
        p = start
        while True:
            seen[p] = True
            q = inv[p]  # the row that belongs at p
            if q == start:
                rows[p].copy_(scratch)
                break
            rows[p].copy_(rows[q])
            p = q
