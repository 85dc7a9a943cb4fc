"""Block scales travel in the same collective as their payload (docs/design.md §5): one launch per
quantized collective, the same bytes on the wire as payload + scales sent apart."""

import torch

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.zero_topo import kernels, packed
from megatron_topo.zero_topo.comm import Comm

from .dist_utils import run_distributed
from .engine_cases import make_engine, train_steps


def test_pack_unpack_round_trip_piece_by_piece():
    x = torch.randn(4 * 512)
    for bits in (8, 4):
        q, s = kernels.quantize(x, bits, 64)
        buf = packed.pack(q, s, parts=4)
        assert buf.dtype == torch.uint8 and buf.numel() == q.numel() + 4 * s.numel()
        # piece i: payload slice i then scales slice i (what an all-to-all hands to rank i)
        qb, sb = q.numel() // 4, s.numel() // 4
        piece = buf.view(4, -1)[2]
        assert torch.equal(piece[:qb], q.view(torch.uint8)[2 * qb : 3 * qb])
        assert torch.equal(piece[qb:].view(torch.float32), s[2 * sb : 3 * sb])
        q2, s2 = packed.unpack(buf, 4, qb, q.dtype)
        assert q2.dtype == q.dtype and torch.equal(q2, q) and torch.equal(s2, s)


def _collectives(rank, world, preset, extra):
    seen = []
    for op in ("all_gather", "all_to_all", "reduce_scatter"):
        real = getattr(Comm, op)

        def record(self, out, inp, group, async_op=False, _real=real, _op=op):
            if group.size > 1:
                seen.append((_op, str(inp.dtype)))
            return _real(self, out, inp, group, async_op=async_op)

        setattr(Comm, op, record)
    eng = make_engine(
        rank,
        world,
        ZeroTopoConfig(preset=preset, quant_block_size=64, grad_quant_block_size=64, **extra),
        precision="bf16",
    )
    train_steps(eng, rank, steps=1, accum=2)
    return seen


def test_quantized_collectives_carry_their_scales():
    """Every gather, reduction, combine and publish of these plans is quantized: each is one
    uint8 collective (payload + scales), none moves fp32 scales on its own."""
    cases = {"topo": ("topo", dict(combine_bits=8, publish_bits=8)), "zeropp": ("zeropp", {})}
    for name, (preset, extra) in cases.items():
        per_rank = run_distributed(_collectives, 8, preset, extra)
        for rank, seen in enumerate(per_rank):
            assert seen, name
            assert {d for _, d in seen} == {"torch.uint8"}, (name, rank, sorted(set(seen)))
        if name == "zeropp":  # 2 hops of the quantized reduction, both packed
            assert sum(op == "all_to_all" for op, _ in per_rank[0]) == 2 * 2 * 4  # micro x hops x units
