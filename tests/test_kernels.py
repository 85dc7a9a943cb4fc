"""Block INT8/INT4 quantization: properties of the reference (the format definition) and the API."""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from megatron_topo.zero_topo import kernels
from megatron_topo.zero_topo.kernels import reference as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BLOCKS = [64, 128, 512, 2048, 8192]
QMAX = {8: 127, 4: 7}
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def assert_bitwise_equal(a, b):
    """Equal bit patterns (so -0.0 != +0.0); NaNs only need to be NaN in the same places."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if not a.dtype.is_floating_point:
        assert torch.equal(a, b), f"{(a != b).sum()} of {a.numel()} differ"
        return
    na, nb = a.isnan(), b.isnan()
    assert torch.equal(na, nb), "NaN positions differ"
    ai, bi = a.view(INT_VIEW[a.dtype])[~na], b.view(INT_VIEW[b.dtype])[~nb]
    assert torch.equal(ai, bi), f"{(ai != bi).sum()} of {ai.numel()} differ"


def make_input(n, dtype, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    # mixed magnitudes per block so both tiny and large scales occur
    mags = torch.logspace(-4, 2, 7)[torch.randint(0, 7, (n,), generator=g)]
    return (torch.randn(n, generator=g) * mags * scale).to(dtype)


SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -3e38, 3e38]


def special_input(n, dtype, block_size, seed):
    """Random data plus: an all-zero and an all -0.0 block, NaN/inf blocks, exact .5 ties
    (a block with absmax 127 so that x/scale is exactly k + 0.5), subnormals, huge values."""
    x = make_input(n, dtype, seed).float()
    nb = -(-n // block_size)
    g = torch.Generator().manual_seed(seed)
    for blk in range(nb):
        lo, hi = blk * block_size, min(n, (blk + 1) * block_size)
        kind = blk % 6
        if kind == 1:
            x[lo:hi] = 0.0 if blk % 12 == 1 else -0.0
        elif kind == 2:
            x[lo + int(torch.randint(0, hi - lo, (1,), generator=g))] = SPECIALS[blk % 3]
        elif kind == 3:
            x[lo] = 127.0  # scale 1: every other value is an exact tie k + 0.5
            x[lo + 1:hi] = torch.arange(hi - lo - 1, dtype=torch.float32) % 254 - 126.5
        elif kind == 4:
            x[lo:hi] = x[lo:hi] * 1e-39  # subnormal fp32 (zero-ish in bf16/fp16)
        elif kind == 5 and dtype != torch.float16:
            x[lo] = SPECIALS[6 + blk % 2]
    return x.to(dtype)


def padded_fp32(x, block_size):
    flat = x.reshape(-1).float()
    nb = R.num_blocks(flat.numel(), block_size)
    out = torch.zeros(nb * block_size)
    out[:flat.numel()] = flat
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
    bound = s.double()[:, None] * (0.5 + 2.0 ** -15)
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
@given(n=st.integers(0, 40000), bits=st.sampled_from([8, 4]), dtype=st.sampled_from(DTYPES),
       log_b=st.integers(6, 13), seed=st.integers(0, 2 ** 31))
def test_roundtrip_hypothesis(n, bits, dtype, log_b, seed):
    check_roundtrip(make_input(n, dtype, seed), bits, 2 ** log_b)


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
        assert (d[blk * 64:(blk + 1) * 64].view(torch.int32) == 0).all()  # exact +0.0
    assert (s[[0, 2, 3, 5]] > 0).all()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_propagates_as_nan_blocks(bits, dtype, bad):
    B = 64
    x = make_input(B * 5 + 7, dtype, 11)
    clean = x.clone()
    x[B + 3] = bad
    x[4 * B + 1:4 * B + 9] = bad
    x[5 * B + 2] = bad  # ragged block
    q, s = R.quantize(x, bits, B)
    assert s[[1, 4, 5]].isnan().all() and not s[[0, 2, 3]].isnan().any()
    width = B if bits == 8 else B // 2
    qr = q.view(-1, width)
    assert (qr[[1, 4, 5]] == 0).all()
    d = R.dequantize(q, s, bits, B, x.numel()).view(-1)
    assert d[B:2 * B].isnan().all() and d[4 * B:].isnan().all()
    qc, sc = R.quantize(clean, bits, B)  # untouched blocks are unaffected
    for blk in (0, 2, 3):
        assert torch.equal(qr[blk], qc.view(-1, width)[blk]) and s[blk] == sc[blk]
    # NaN survives the fused reduction and the requantization
    qs, ss = torch.stack([q, qc]), torch.stack([s, sc])
    tot = R.dequantize_sum(qs, ss, bits, B, x.numel())
    assert tot[B:2 * B].isnan().all() and not tot[:B].isnan().any()
    q2, s2 = R.dequantize_sum_requantize(qs, ss, bits, B)
    assert s2[[1, 4, 5]].isnan().all() and not s2[[0, 2, 3]].isnan().any()


def _stack(n, bits, B, k, dtype, seed):
    qs, ss = zip(*(R.quantize(make_input(n, dtype, seed + i), bits, B) for i in range(k)))
    return torch.stack(qs), torch.stack(ss)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("B,n,k", [(64, 1000, 1), (64, 4099, 3), (512, 3 * 512, 8),
                                   (8192, 9000, 2), (2048, 2 ** 20 + 5, 4)])
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


def test_empty_tensor():
    for bits in (8, 4):
        q, s = kernels.quantize(torch.zeros(0), bits, 64)
        assert q.numel() == 0 and s.numel() == 0
        assert kernels.dequantize(q, s, bits, 64, 0).numel() == 0


def test_sizes():
    assert kernels.num_blocks(1000, 64) == 16 and kernels.num_blocks(0, 64) == 0
    assert kernels.payload_nbytes(1000, 8, 64) == 1024
    assert kernels.payload_nbytes(1000, 4, 64) == 512


def test_argument_validation():
    x = torch.randn(1000)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        kernels.quantize(x, 3, 64)
    for bad in (32, 100, 16384, 64.0):
        with pytest.raises(ValueError, match="power of two in"):
            kernels.quantize(x, 8, bad)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        kernels.quantize(x.double(), 8, 64)
    q, s = kernels.quantize(x, 8, 64)
    with pytest.raises(ValueError, match="payload has 1024 elements, expected 2048"):
        kernels.dequantize(q, s, 8, 64, 2000)
    with pytest.raises(ValueError, match="int8"):
        kernels.dequantize(q.view(torch.uint8), s, 8, 64, 1000)
    with pytest.raises(ValueError, match="dtype must be"):
        kernels.dequantize(q, s, 8, 64, 1000, dtype=torch.float64)
    qs, ss = torch.stack([q, q]), torch.stack([s, s])
    with pytest.raises(ValueError, match="mismatched stacks"):
        kernels.dequantize_sum(qs, ss[:1], 8, 64, 1000)
    with pytest.raises(ValueError, match="mismatched stacks"):
        kernels.dequantize_sum(qs[:, :512], ss, 8, 64, 1000)
    with pytest.raises(ValueError, match="2-D"):
        kernels.dequantize_sum(q, s, 8, 64, 1000)
    with pytest.raises(ValueError, match="accumulate=True needs an out"):
        kernels.dequantize_sum(qs, ss, 8, 64, 1000, accumulate=True)
    with pytest.raises(ValueError, match="contiguous float32 tensor of 1000"):
        kernels.dequantize_sum(qs, ss, 8, 64, 1000, out=torch.zeros(1000, dtype=torch.float16))
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        kernels.dequantize_sum_requantize(qs, ss, 8, 64, out_bits=2)


def test_backend_resolution(monkeypatch):
    x = torch.zeros(4)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    auto_cpu = "cpu_fast" if kernels.cpu_fast_available() else "reference"
    assert kernels.resolve_backend(None, x) == auto_cpu  # auto on CPU
    monkeypatch.setattr(kernels, "cpu_fast_available", lambda: False)
    assert kernels.resolve_backend(None, x) == "reference"  # the fallback
    monkeypatch.undo()
    monkeypatch.setenv(kernels.ENV_VAR, "cpu_fast")
    assert kernels.resolve_backend(None, x) == "cpu_fast"
    monkeypatch.setenv(kernels.ENV_VAR, "triton")
    assert kernels.resolve_backend(None, x) == "triton"  # env read at call time
    assert kernels.resolve_backend("reference", x) == "reference"  # argument wins
    monkeypatch.setenv(kernels.ENV_VAR, "Reference")
    assert kernels.resolve_backend(None, x) == "reference"
    monkeypatch.setenv(kernels.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="MEGATRON_TOPO_KERNELS must be one of"):
        kernels.quantize(x, 8, 64)
    with pytest.raises(ValueError, match="backend argument must be one of"):
        kernels.quantize(x, 8, 64, backend="fast")
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    q, s = kernels.quantize(make_input(300, torch.float32, 1), 4, 64)
    assert_bitwise_equal(kernels.dequantize_sum_requantize(q[None], s[None], 4, 64)[1],
                         R.dequantize_sum_requantize(q[None], s[None], 4, 64)[1])


def test_imports_and_falls_back_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "from megatron_topo.zero_topo.kernels import triton_kernels as T\n"
        "assert not T.available() and not kernels.triton_available()\n"
        "x = torch.randn(500)\n"
        "q, s = kernels.quantize(x, 8, 64)\n"
        "assert (kernels.dequantize(q, s, 8, 64, 500) - x).abs().max() <= s.max()\n"
        "try:\n"
        "    kernels.quantize(x, 8, 64, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'failed to import' in str(e)\n"
        "else:\n"
        "    raise SystemExit('forced triton without triton did not raise')\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_lazy_triton_import_and_cpu_without_interpreter():
    pytest.importorskip("triton")
    code = (
        "import sys, torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels must not import triton'\n"
        "kernels.quantize(torch.randn(100), 8, 64)\n"
        "assert 'triton' not in sys.modules, 'the CPU auto path must not import triton'\n"
        "try:\n"
        "    kernels.quantize(torch.randn(100), 8, 64, backend='triton')\n"
        "except ValueError as e:\n"
        "    assert 'TRITON_INTERPRET=1' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('triton on CPU without the interpreter did not raise')\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", kernels.ENV_VAR)}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ------------------------------------------------------------------ cpu_fast == reference, bit for bit
from megatron_topo.zero_topo.kernels import cpu_fast as CF  # noqa: E402

needs_fast = pytest.mark.skipif(not CF.available(), reason=f"cpu_fast unavailable: {CF.unavailable_reason()}")
RAW_INT = {torch.float32: (torch.int32, 2 ** 31), torch.bfloat16: (torch.int16, 2 ** 15),
           torch.float16: (torch.int16, 2 ** 15)}


def raw_bits(n, dtype, seed):
    """Uniformly random bit patterns: every exponent, NaN payloads, infinities, subnormals, -0.0."""
    it, lim = RAW_INT[dtype]
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-lim, lim, (n,), generator=g, dtype=torch.int64).to(it).view(dtype)


def assert_same_ops(x, bits, B, k=2, seed=0):
    """Every op of cpu_fast equals the reference on x (and k-1 more inputs) bit for bit."""
    n = x.numel()
    qr, sr = R.quantize(x, bits, B)
    qf, sf = CF.quantize(x, bits, B)
    assert_bitwise_equal(qf, qr)
    assert_bitwise_equal(sf, sr)
    for dt in DTYPES:
        assert_bitwise_equal(CF.dequantize(qr, sr, bits, B, n, dt), R.dequantize(qr, sr, bits, B, n, dt))
    more = [R.quantize(special_input(n, x.dtype, B, seed + i), bits, B) for i in range(1, k)]
    qs = torch.stack([qr] + [m[0] for m in more])
    ss = torch.stack([sr] + [m[1] for m in more])
    assert_bitwise_equal(CF.dequantize_sum(qs, ss, bits, B, n), R.dequantize_sum(qs, ss, bits, B, n))
    base = special_input(n, torch.float32, 64, seed + 99)  # NaN/inf/-0.0 already in out
    o_r, o_f = base.clone(), base.clone()
    R.dequantize_sum(qs, ss, bits, B, n, out=o_r, accumulate=True)
    assert CF.dequantize_sum(qs, ss, bits, B, n, out=o_f, accumulate=True) is o_f
    assert_bitwise_equal(o_f, o_r)
    o_r, o_f = torch.full((n,), 5.0), torch.full((n,), -7.0)
    R.dequantize_sum(qs, ss, bits, B, n, out=o_r)
    assert CF.dequantize_sum(qs, ss, bits, B, n, out=o_f) is o_f
    assert_bitwise_equal(o_f, o_r)
    for ob in (8, 4):
        a, b = (CF.dequantize_sum_requantize(qs, ss, bits, B, out_bits=ob),
                R.dequantize_sum_requantize(qs, ss, bits, B, out_bits=ob))
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])


@needs_fast
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [64, 128, 1024, 8192])
def test_cpu_fast_bit_exact_special_values(bits, dtype, block_size):
    for i, n in enumerate([1, 63, block_size - 1, block_size, block_size + 1, 3017, 3 * block_size + 5]):
        assert_same_ops(special_input(n, dtype, block_size, seed=block_size + i), bits, block_size,
                        k=1 + i % 3, seed=i)


@needs_fast
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 20000), bits=st.sampled_from([8, 4]), dtype=st.sampled_from(DTYPES),
       log_b=st.integers(6, 13), k=st.integers(1, 5), seed=st.integers(0, 2 ** 31),
       kind=st.sampled_from(["special", "raw", "random"]))
def test_cpu_fast_hypothesis(n, bits, dtype, log_b, k, seed, kind):
    x = {"special": special_input, "raw": lambda n, d, b, s: raw_bits(n, d, s),
         "random": lambda n, d, b, s: make_input(n, d, s)}[kind](n, dtype, 2 ** log_b, seed)
    assert_same_ops(x, bits, 2 ** log_b, k=k, seed=seed)


@needs_fast
@settings(max_examples=40, deadline=None)
@given(nb=st.integers(1, 40), bits=st.sampled_from([8, 4]), log_b=st.integers(6, 9),
       k=st.integers(1, 4), seed=st.integers(0, 2 ** 31))
def test_cpu_fast_arbitrary_payloads_and_scales(nb, bits, log_b, k, seed):
    """Dequantization paths on payloads/scales no quantizer would produce: any byte, any fp32 scale
    (negative, NaN, inf, subnormal, huge: products and sums overflow)."""
    B = 2 ** log_b
    g = torch.Generator().manual_seed(seed)
    width = B if bits == 8 else B // 2
    q = torch.randint(0, 256, (k, nb * width), generator=g, dtype=torch.int32).to(torch.uint8)
    q = q.view(torch.int8) if bits == 8 else q
    s = raw_bits(k * nb, torch.float32, seed).view(k, nb)
    n = nb * B - int(torch.randint(0, B, (1,), generator=g))
    for dt in DTYPES:
        assert_bitwise_equal(CF.dequantize(q[0], s[0], bits, B, n, dt), R.dequantize(q[0], s[0], bits, B, n, dt))
    assert_bitwise_equal(CF.dequantize_sum(q, s, bits, B, n), R.dequantize_sum(q, s, bits, B, n))
    base = raw_bits(n, torch.float32, seed + 1)
    o_r, o_f = base.clone(), base.clone()
    R.dequantize_sum(q, s, bits, B, n, out=o_r, accumulate=True)
    CF.dequantize_sum(q, s, bits, B, n, out=o_f, accumulate=True)
    assert_bitwise_equal(o_f, o_r)
    for ob in (8, 4):
        a, b = CF.dequantize_sum_requantize(q, s, bits, B, out_bits=ob), R.dequantize_sum_requantize(
            q, s, bits, B, out_bits=ob)
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])


@needs_fast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_fast_every_16bit_pattern(dtype):
    """All 65536 input bit patterns quantized; every fp32 product rounded to the 16-bit dtype."""
    x = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    for bits in (8, 4):
        for B in (64, 2048):
            qr, sr = R.quantize(x, bits, B)
            qf, sf = CF.quantize(x, bits, B)
            assert_bitwise_equal(qf, qr)
            assert_bitwise_equal(sf, sr)
    # dequantize to the 16-bit dtype: q in [-127, 127] times scales from every fp32 exponent,
    # including products that land on exact ties, in the subnormal range and overflow
    q = torch.arange(-127, 128, dtype=torch.int8).repeat(4)[:1024]
    scales = raw_bits(4096, torch.float32, 5).abs()
    scales[:8] = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 2 ** -24, 2 ** -25, 3 * 2 ** -26,
                               65520.0 / 127, 65504.0 / 127, 1e-45])
    for i in range(0, 4096, 64):
        s = scales[i:i + 64]
        qq = q.repeat(64)[:64 * 64]
        assert_bitwise_equal(CF.dequantize(qq, s, 8, 64, 64 * 64, dtype),
                             R.dequantize(qq, s, 8, 64, 64 * 64, dtype))


@needs_fast
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("perm", [[0], [1, 0], [2, 0, 3, 1], [0, 4, 1, 5, 2, 6, 3, 7]])
def test_cpu_fast_quantize_reordered(bits, dtype, perm):
    x = special_input(len(perm) * 128 * 3, dtype, 128, seed=len(perm))
    a, b = CF.quantize_reordered(x, bits, 128, perm), R.quantize_reordered(x, bits, 128, perm)
    assert_bitwise_equal(a[0], b[0])
    assert_bitwise_equal(a[1], b[1])
    with pytest.raises(ValueError, match="not divisible by block_size"):
        CF.quantize_reordered(x[:len(perm) * 96], bits, 128, perm)


@needs_fast
def test_cpu_fast_strided_inputs_and_threads(monkeypatch):
    x = make_input(64 * 300, torch.float32, 5).view(300, 64).t()  # non-contiguous
    for bits in (8, 4):
        a, b = CF.quantize(x, bits, 128), R.quantize(x, bits, 128)
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])
        qs, ss = zip(*(R.quantize(make_input(4000, torch.bfloat16, i), bits, 64) for i in range(3)))
        q_nc, s_nc = torch.stack(qs, 1).t(), torch.stack(ss, 1).t()  # [k, ...], not contiguous
        assert not q_nc.is_contiguous()
        assert_bitwise_equal(CF.dequantize_sum(q_nc, s_nc, bits, 64, 4000),
                             R.dequantize_sum(q_nc, s_nc, bits, 64, 4000))
    # splitting the blocks between threads changes nothing
    monkeypatch.setattr(CF, "MIN_ELEMS_PER_THREAD", 64)
    prev = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for dtype in DTYPES:
            assert_same_ops(special_input(64 * 37 + 5, dtype, 64, 3), 4, 64, k=3, seed=3)
            x = special_input(8 * 64 * 5, dtype, 64, 4)
            a, b = CF.quantize_reordered(x, 8, 64, [3, 1, 0, 2]), R.quantize_reordered(x, 8, 64, [3, 1, 0, 2])
            assert_bitwise_equal(a[0], b[0])
            assert_bitwise_equal(a[1], b[1])
    finally:
        torch.set_num_threads(prev)


@needs_fast
def test_cpu_fast_is_the_cpu_default_and_errors_match(monkeypatch):
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    calls = []
    orig = CF.quantize
    monkeypatch.setattr(CF, "quantize", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    x = make_input(700, torch.float32, 3)
    q, s = kernels.quantize(x, 8, 64)
    assert calls == [1]
    kernels.quantize(x, 8, 64, backend="reference")
    monkeypatch.setenv(kernels.ENV_VAR, "reference")
    kernels.quantize(x, 8, 64)
    assert calls == [1]
    monkeypatch.undo()
    for fn, args in (("quantize", (x.double(), 8, 64)), ("quantize", (x, 3, 64)),
                     ("dequantize", (q, s, 8, 64, 2000)),
                     ("dequantize_sum", (torch.stack([q, q]), s[None], 8, 64, 700))):
        with pytest.raises(ValueError) as fast_err:
            getattr(CF, fn)(*args)
        with pytest.raises(ValueError) as ref_err:
            getattr(R, fn)(*args)
        assert str(fast_err.value) == str(ref_err.value)
    q0, s0 = CF.quantize(torch.zeros(0), 4, 64)
    assert q0.numel() == 0 and s0.numel() == 0 and CF.dequantize(q0, s0, 4, 64, 0).numel() == 0


def test_cpu_fast_builds_where_a_compiler_exists():
    import shutil
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    assert CF.available(), CF.unavailable_reason()
    assert kernels.cpu_fast_available()


def _run_py(code, extra_env, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT, **extra_env)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout, r.stderr)
    return r.stdout


def test_cpu_fast_falls_back_without_a_compiler(tmp_path):
    code = (
        "import torch\n"
        "from megatron_topo.zero_topo import kernels\n"
        "from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
        "assert not kernels.cpu_fast_available()\n"
        "assert 'no C compiler' in CF.unavailable_reason(), CF.unavailable_reason()\n"
        "x = torch.randn(500)\n"
        "assert kernels.resolve_backend(None, x) == 'reference'\n"
        "q, s = kernels.quantize(x, 8, 64)\n"
        "try:\n"
        "    kernels.quantize(x, 8, 64, backend='cpu_fast')\n"
        "except RuntimeError as e:\n"
        "    assert 'cpu_fast kernels unavailable' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('forced cpu_fast without a compiler did not raise')\n"
        "print('ok')\n")
    env = {"PATH": str(tmp_path / "nothing"), CF.CACHE_ENV: str(tmp_path / "cache"), "CC": ""}
    _run_py(code, env)


@needs_fast
@pytest.mark.parametrize("cflags", ["-DMT_NO_F16C", "-DMT_NO_F16C -DMT_NO_FLOAT16"])
def test_cpu_fast_portable_builds(cflags, tmp_path):
    """The fp16 conversions without F16C instructions (_Float16, then plain integer code) are what
    other CPUs/compilers get: same bits, checked on every fp16 pattern and the special values."""
    code = (
        "import torch\n"
        "from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
        "from tests.test_kernels import special_input, assert_same_ops\n"
        f"assert CF.available(), CF.unavailable_reason()\n"
        f"assert CF._lib().mt_f16_impl() == {1 if cflags == '-DMT_NO_F16C' else 0}\n"
        "import tests.test_kernels as T\n"
        "T.test_cpu_fast_every_16bit_pattern.__wrapped__(torch.float16) if hasattr("
        "T.test_cpu_fast_every_16bit_pattern, '__wrapped__') else T.test_cpu_fast_every_16bit_pattern(torch.float16)\n"
        "for B in (64, 1024):\n"
        "    for bits in (8, 4):\n"
        "        for n in (1, 3017, 3 * B + 5):\n"
        "            assert_same_ops(special_input(n, torch.float16, B, n), bits, B, k=3, seed=n)\n"
        "print('ok')\n")
    _run_py(code, {CF.CFLAGS_ENV: cflags, CF.CACHE_ENV: str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})


def test_kernel_timer(tmp_path, monkeypatch):
    t = kernels.timer
    was = t.enabled
    t.reset()
    t.enable()
    try:
        x = make_input(5000, torch.float32, 1)
        q, s = kernels.quantize(x, 8, 64)
        kernels.dequantize(q, s, 8, 64, 5000, backend="reference")
        kernels.quantize(x.to("meta"), 8, 64)  # shapes only: not timed
        snap = t.snapshot()
        assert snap["calls"] == 2 and snap["seconds"] > 0
        fast = "cpu_fast" if kernels.cpu_fast_available() else "reference"
        assert set(snap["per_op"]) == {f"quantize/{fast}", "dequantize/reference"}
        assert abs(sum(v["seconds"] for v in snap["per_op"].values()) - snap["seconds"]) < 1e-9
    finally:
        t.enable(was)
        t.reset()
    t.add("x", "y", 1.0)
    t.reset()
    before = t.calls
    kernels.quantize(torch.zeros(64), 8, 64)
    assert t.calls == before  # disabled: nothing counted
    out = tmp_path / "times"
    code = ("import torch\n"
            "from megatron_topo.zero_topo import kernels\n"
            "q, s = kernels.quantize(torch.randn(1000), 4, 64)\n"
            "kernels.dequantize_sum(q[None], s[None], 4, 64, 1000)\n"
            "print('ok')\n")
    _run_py(code, {kernels.TIMES_ENV: str(out), "RANK": "3"})
    import json
    files = list(out.glob("kernel_times.3.*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["rank"] == 3 and rec["calls"] == 2 and rec["seconds"] > 0
    assert {k.split("/")[0] for k in rec["per_op"]} == {"quantize", "dequantize_sum"}


def test_bench_sharding_reads_kernel_times(tmp_path):
    """bench_sharding's quant s column: each rank's kernels.timer file, per step, mean over ranks."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import bench_sharding as BS
    finally:
        sys.path.pop(0)
    assert BS.KERNEL_TIMES_ENV == kernels.TIMES_ENV
    assert BS.read_kernel_times(str(tmp_path / "absent"), 8) == {"quant_s": 0.0, "quant_s_max": 0.0,
                                                                  "quant_ranks": 0}
    t = kernels.KernelTimer()
    for rank, secs in (("0", 0.8), ("1", 1.6)):
        t.reset()
        t.add("quantize", "cpu_fast", secs)
        os.environ["RANK"], prev = rank, os.environ.get("RANK")
        try:
            t.write(str(tmp_path))
        finally:
            os.environ.pop("RANK") if prev is None else os.environ.__setitem__("RANK", prev)
    got = BS.read_kernel_times(str(tmp_path), 8)
    assert got["quant_ranks"] == 2 and abs(got["quant_s"] - 0.15) < 1e-12 and abs(got["quant_s_max"] - 0.2) < 1e-12


def test_cpu_fast_cache_falls_back_to_the_temp_dir(tmp_path):
    if not any(__import__("shutil").which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the user cache cannot be created under a file
    code = ("from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
            "assert CF.available(), CF.unavailable_reason()\n"
            f"assert CF.library_path().startswith({str(tmp_path / 'tmp')!r}), CF.library_path()\n"
            "print('ok')\n")
    (tmp_path / "tmp").mkdir()
    _run_py(code, {"XDG_CACHE_HOME": str(blocker), "TMPDIR": str(tmp_path / "tmp"), CF.CACHE_ENV: "",
                   "OMP_NUM_THREADS": "1"})


def test_bench_kernels_smoke(tmp_path):
    """tools/bench_kernels.py runs both CPU backends side by side and writes its JSON."""
    out = tmp_path / "k.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_kernels.py"), "--device", "cpu",
                        "--sizes-mib", "0.25", "--repeats", "1", "--warmup", "0", "--rounds", "2",
                        "--threads", "1", "--block-size", "256", "--dtype", "bfloat16", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(out.read_text())
    want = ["reference"] + (["cpu_fast"] if kernels.cpu_fast_available() else [])
    assert rep["backends"] == want and rep["rounds"] == 2 and rep["input_dtype"] == "bfloat16"
    assert {row["backend"] for row in rep["results"]} == set(want)
    assert all(len(row["rounds_ms"]) == 2 and row["gbps"] > 0 for row in rep["results"])
    if len(want) > 1:
        assert "x cpu_fast" in r.stdout
