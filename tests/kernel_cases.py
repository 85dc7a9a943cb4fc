"""Inputs and bit-level comparisons shared by the kernel tests (reference, cpu_fast, Triton, API)."""

import os
import subprocess
import sys

import torch

from megatron_topo.zero_topo.kernels import cpu_fast as CF
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
            x[lo + 1 : hi] = torch.arange(hi - lo - 1, dtype=torch.float32) % 254 - 126.5
        elif kind == 4:
            x[lo:hi] = x[lo:hi] * 1e-39  # subnormal fp32 (zero-ish in bf16/fp16)
        elif kind == 5 and dtype != torch.float16:
            x[lo] = SPECIALS[6 + blk % 2]
    return x.to(dtype)


RAW_INT = {
    torch.float32: (torch.int32, 2**31),
    torch.bfloat16: (torch.int16, 2**15),
    torch.float16: (torch.int16, 2**15),
}


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
        a, b = (
            CF.dequantize_sum_requantize(qs, ss, bits, B, out_bits=ob),
            R.dequantize_sum_requantize(qs, ss, bits, B, out_bits=ob),
        )
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])


def run_py(code, extra_env, timeout=300):
    """Run ``code`` in a fresh interpreter from the repository root; it must print 'ok' last."""
    env = dict(os.environ, **extra_env)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout, r.stderr)
    return r.stdout
