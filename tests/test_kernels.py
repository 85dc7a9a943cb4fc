"""Block INT8/INT4 quantization: properties of the reference (the format definition)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_topo.zero_topo.kernels import reference as R

from .kernel_cases import DTYPES, QMAX, assert_bitwise_equal, make_input

BLOCKS = [64, 128, 512, 2048, 8192]


def padded_fp32(x, block_size):
    flat = x.reshape(-1).float()
    nb = R.num_blocks(flat.numel(), block_size)
    out = torch.zeros(nb * block_size)
    out[: flat.numel()] = flat
    return out.view(nb, block_size)


def check_roundtrip(x, bits, block_size):
    n = x.numel()
    q, s = R.quantize(x, bits, block_size)
    nb = R.num_blocks(n, block_size)
    assert s.shape == (nb,) and s.dtype == torch.float32
    assert q.shape == (R.payload_nbytes(n, bits, block_size),)
    assert q.dtype == (torch.int8 if bits == 8 else torch.uint8)
    xp = padded_fp32(x, block_size)
    assert_bitwise_equal(s, xp.abs().amax(1) / QMAX[bits] if nb else s)
    vals = (q if bits == 8 else R.unpack_int4(q)).view(nb, block_size)
    assert vals.abs().max() <= QMAX[bits] if nb else True
    d = R.dequantize(q, s, bits, block_size, n)
    assert d.shape == (n,) and d.dtype == torch.float32
    # |x - deq| <= scale/2, up to the fp32 rounding of x/scale and of q*scale (~2**-17 relative)
    err = (xp.double() - padded_fp32(d, block_size).double()).abs()
    bound = s.double()[:, None] * (0.5 + 2.0**-15)
    normal = s >= torch.finfo(torch.float32).tiny
    assert bool((err[normal] <= bound[normal]).all()), float((err - bound)[normal].max())
    for dt in (torch.bfloat16, torch.float16):
        assert_bitwise_equal(R.dequantize(q, s, bits, block_size, n, dt), d.to(dt))
    return q, s, d


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", BLOCKS)
def test_roundtrip_sweep(bits, dtype, block_size):
    for i, n in enumerate([1, block_size - 1, block_size, block_size + 1, 3 * block_size + 37]):
        check_roundtrip(make_input(n, dtype, seed=1000 * block_size + i), bits, block_size)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40000),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(DTYPES),
    log_b=st.integers(6, 13),
    seed=st.integers(0, 2**31),
)
def test_roundtrip_hypothesis(n, bits, dtype, log_b, seed):
    check_roundtrip(make_input(n, dtype, seed), bits, 2**log_b)


def test_any_shape_and_strides_flatten():
    x = make_input(64 * 30, torch.float32, 5).view(30, 64).t()  # non-contiguous
    for bits in (8, 4):
        a, b = R.quantize(x, bits, 128), R.quantize(x.reshape(-1).clone(), bits, 128)
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])


def test_round_half_to_even_and_int8_layout():
    x = torch.zeros(128)
    x[0] = 127.0  # scale = 1 in block 0
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49, -3.51])
    x[1:11] = halves
    q, s = R.quantize(x, 8, 64)
    assert s[0].item() == 1.0 and s[1].item() == 0.0
    assert q[:11].tolist() == [127, 0, 2, 2, 0, -2, -2, 126, -126, 3, -4]
    assert q[11:].abs().sum() == 0


def test_int4_pack_layout_hand_example():
    x = torch.zeros(64)
    x[:8] = torch.tensor([7.0, -7.0, 1.0, -1.0, 0.0, 3.0, -6.0, 2.0])  # scale = 1
    q, s = R.quantize(x, 4, 64)
    assert s.tolist() == [1.0]
    # byte i = (q[2i] & 0xF) | (q[2i+1] & 0xF) << 4, 4-bit two's complement
    assert q[:4].tolist() == [0x97, 0xF1, 0x30, 0x2A]
    assert q[4:].sum() == 0
    assert R.unpack_int4(q)[:8].tolist() == [7, -7, 1, -1, 0, 3, -6, 2]
    assert R.pack_int4(torch.tensor([-8, 7, -1, 0], dtype=torch.int8)).tolist() == [0x78, 0x0F]


def test_int4_pack_fast_and_strided_paths_agree():
    g = torch.Generator().manual_seed(3)
    big = torch.randint(-8, 8, (10, 130), dtype=torch.int8, generator=g)
    nc = big[:, 1:129]  # not contiguous: takes the strided path
    assert not nc.is_contiguous()
    packed = R.pack_int4(nc.contiguous())
    assert torch.equal(R.pack_int4(nc), packed)
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)  # all 256 byte values
    fast = R.unpack_int4(every)
    wide = torch.empty(3 * 512, dtype=torch.int8)
    strided = R.unpack_int4(every, out=wide[1:513])  # odd offset: no int16 view, strided path
    assert torch.equal(fast, strided) and torch.equal(R.pack_int4(fast), every)
    ref = [((b & 15) ^ 8) - 8 for b in range(256)], [((b >> 4) ^ 8) - 8 for b in range(256)]
    assert fast[0::2].tolist() == ref[0] and fast[1::2].tolist() == ref[1]
    assert torch.equal(R.unpack_int4(packed), nc)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_blocks_exact(bits, dtype):
    x = make_input(64 * 6 + 10, dtype, 7)
    x[64:128] = 0.0
    x[256:320] = -0.0
    x[384:] = 0.0  # ragged last block, all zero
    q, s, d = check_roundtrip(x, bits, 64)
    for blk in (1, 4, 6):
        assert s[blk].item() == 0.0 and not torch.signbit(s[blk])
        assert (d[blk * 64 : (blk + 1) * 64].view(torch.int32) == 0).all()  # exact +0.0
    assert (s[[0, 2, 3, 5]] > 0).all()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_propagates_as_nan_blocks(bits, dtype, bad):
    B = 64
    x = make_input(B * 5 + 7, dtype, 11)
    clean = x.clone()
    x[B + 3] = bad
    x[4 * B + 1 : 4 * B + 9] = bad
    x[5 * B + 2] = bad  # ragged block
    q, s = R.quantize(x, bits, B)
    assert s[[1, 4, 5]].isnan().all() and not s[[0, 2, 3]].isnan().any()
    width = B if bits == 8 else B // 2
    qr = q.view(-1, width)
    assert (qr[[1, 4, 5]] == 0).all()
    d = R.dequantize(q, s, bits, B, x.numel()).view(-1)
    assert d[B : 2 * B].isnan().all() and d[4 * B :].isnan().all()
    qc, sc = R.quantize(clean, bits, B)  # untouched blocks are unaffected
    for blk in (0, 2, 3):
        assert torch.equal(qr[blk], qc.view(-1, width)[blk]) and s[blk] == sc[blk]
    # NaN survives the fused reduction and the requantization
    qs, ss = torch.stack([q, qc]), torch.stack([s, sc])
    tot = R.dequantize_sum(qs, ss, bits, B, x.numel())
    assert tot[B : 2 * B].isnan().all() and not tot[:B].isnan().any()
    q2, s2 = R.dequantize_sum_requantize(qs, ss, bits, B)
    assert s2[[1, 4, 5]].isnan().all() and not s2[[0, 2, 3]].isnan().any()


def _stack(n, bits, B, k, dtype, seed):
    qs, ss = zip(*(R.quantize(make_input(n, dtype, seed + i), bits, B) for i in range(k)))
    return torch.stack(qs), torch.stack(ss)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "B,n,k", [(64, 1000, 1), (64, 4099, 3), (512, 3 * 512, 8), (8192, 9000, 2), (2048, 2**20 + 5, 4)]
)
def test_dequantize_sum_equals_separate_ops(bits, B, n, k):
    q_stack, s_stack = _stack(n, bits, B, k, torch.bfloat16, seed=n + k)
    ref = R.dequantize(q_stack[0], s_stack[0], bits, B, n)
    for i in range(1, k):
        ref = ref + R.dequantize(q_stack[i], s_stack[i], bits, B, n)
    assert_bitwise_equal(R.dequantize_sum(q_stack, s_stack, bits, B, n), ref)
    out = torch.randn(n)
    expect = out + ref
    got = R.dequantize_sum(q_stack, s_stack, bits, B, n, out=out, accumulate=True)
    assert got is out
    assert_bitwise_equal(out, expect)
    out2 = torch.full((n,), 5.0)
    assert R.dequantize_sum(q_stack, s_stack, bits, B, n, out=out2) is out2
    assert_bitwise_equal(out2, ref)
    # the fused requantization equals the separate ops over the padded length
    nb = R.num_blocks(n, B)
    for out_bits in (bits, 12 - bits):
        qf, sf = R.dequantize_sum_requantize(q_stack, s_stack, bits, B, out_bits=out_bits)
        qe, se = R.quantize(R.dequantize_sum(q_stack, s_stack, bits, B, nb * B), out_bits, B)
        assert_bitwise_equal(qf, qe)
        assert_bitwise_equal(sf, se)


def _slice_perm(t, perm):
    sl = t.view(len(perm), -1)
    return torch.cat([sl[p] for p in perm])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("perm", [[0], [1, 0], [2, 0, 3, 1], [0, 4, 1, 5, 2, 6, 3, 7]])
def test_quantize_reordered(bits, dtype, perm):
    B = 128
    x = make_input(len(perm) * B * 3, dtype, len(perm))
    q, s = R.quantize_reordered(x, bits, B, perm)
    qe, se = R.quantize(_slice_perm(x, perm), bits, B)
    assert_bitwise_equal(q, qe)
    assert_bitwise_equal(s, se)
    inv = R.inverse_permutation(perm)
    assert [perm[i] for i in inv] == list(range(len(perm)))
    back = _slice_perm(R.dequantize(q, s, bits, B, x.numel()), inv)
    q0, s0 = R.quantize(x, bits, B)
    assert_bitwise_equal(back, R.dequantize(q0, s0, bits, B, x.numel()))
    q1, s1 = R.quantize_reordered(x, bits, B, torch.tensor(perm))
    assert torch.equal(q1, q)


def test_quantize_reordered_size_errors():
    with pytest.raises(ValueError, match=r"numel\(\)=1000.*len\(perm\)=3"):
        R.quantize_reordered(torch.zeros(1000), 8, 64, [0, 2, 1])
    with pytest.raises(ValueError, match=r"slice length 96.*block_size=64"):
        R.quantize_reordered(torch.zeros(192), 8, 64, [0, 1])
    with pytest.raises(ValueError, match="permutation"):
        R.quantize_reordered(torch.zeros(256), 8, 64, [0, 0])
    with pytest.raises(ValueError, match="permutation"):
        R.inverse_permutation([1, 2])
