"""Triton kernels == reference, bit for bit, run on CPU tensors under TRITON_INTERPRET=1.

TRITON_INTERPRET must be set before the @triton.jit decorators run, i.e. before
zero_topo.kernels.triton_kernels is first imported, and while the kernels run; this module sets it for its
import and its tests (restoring the previous value in between and afterwards) and skips, with
the reason, when that is impossible or triton does not import.
"""

import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

_prev = os.environ.get("TRITON_INTERPRET")
_already = "triton" in sys.modules
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401

    from megatron_topo.zero_topo.kernels import triton_kernels as T
except Exception as e:  # pragma: no cover - depends on the install
    print(f"SKIP test_kernels_triton: triton does not import: {e!r}", file=sys.stderr)
    pytest.skip(f"triton does not import: {e!r}", allow_module_level=True)
finally:
    if _prev is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _prev

if not T.available() or not T.interpreted():
    _why = (
        f"triton was imported before TRITON_INTERPRET=1 could be set (tests/conftest.py sets "
        f"it; triton already imported: {_already})"
        if T.available()
        else f"{T.IMPORT_ERROR!r}"
    )
    print(f"SKIP test_kernels_triton: {_why}", file=sys.stderr)
    pytest.skip(_why, allow_module_level=True)

from megatron_topo.zero_topo import kernels  # noqa: E402
from megatron_topo.zero_topo.kernels import reference as R  # noqa: E402

from .kernel_cases import DTYPES, assert_bitwise_equal, make_input, special_input  # noqa: E402

# inputs near the fp32 maximum legitimately overflow to inf (fp16 outputs, sums); numpy says so
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(autouse=True, scope="module")
def _interpret_env():
    """The interpreter consults TRITON_INTERPRET while running too (lazy imports assert on it)."""
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if _prev is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _prev


def both(fn, *args, **kw):
    return getattr(R, fn)(*args, **kw), getattr(T, fn)(*args, **kw)


def assert_pair_equal(a, b):
    if isinstance(a, tuple):
        for u, v in zip(a, b):
            assert_bitwise_equal(u, v)
    else:
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [64, 128, 1024, 8192])
def test_quantize_dequantize_bit_exact(bits, dtype, block_size):
    for i, n in enumerate([1, 63, 3017, 3 * block_size]):
        x = special_input(n, dtype, block_size, seed=block_size + i)
        (qr, sr), (qt, st_) = both("quantize", x, bits, block_size)
        assert_bitwise_equal(qt, qr)
        assert_bitwise_equal(st_, sr)
        for out_dtype in DTYPES:
            assert_pair_equal(*both("dequantize", qr, sr, bits, block_size, n, out_dtype))


def test_dequantize_bf16_ties_round_to_even():
    # q*scale exactly halfway between two bf16 values: 1 + 2**-8 -> 1.0, 1 + 3*2**-8 -> 1 + 2**-6
    s = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8] + [1.0] * 6)
    q = torch.zeros(8 * 64, dtype=torch.int8)
    q[0], q[64] = 1, 1
    q[128:256] = torch.arange(-64, 64, dtype=torch.int8)
    for dt in DTYPES:
        assert_pair_equal(*both("dequantize", q, s, 8, 64, 8 * 64, dt))
    got = T.dequantize(q, s, 8, 64, 8 * 64, torch.bfloat16)
    assert got[0].item() == 1.0 and got[64].item() == 1.0 + 2**-6


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block_size,n,k", [(64, 1000, 1), (64, 3017, 3), (256, 2048, 8), (8192, 9000, 2)])
def test_dequantize_sum_bit_exact(bits, block_size, n, k):
    xs = [special_input(n, torch.bfloat16, block_size, seed=50 + i) for i in range(k)]
    qs, ss = zip(*(R.quantize(x, bits, block_size) for x in xs))
    q_stack, s_stack = torch.stack(qs), torch.stack(ss)
    assert_pair_equal(*both("dequantize_sum", q_stack, s_stack, bits, block_size, n))
    base = torch.randn(n)
    o_r, o_t = base.clone(), base.clone()
    R.dequantize_sum(q_stack, s_stack, bits, block_size, n, out=o_r, accumulate=True)
    assert T.dequantize_sum(q_stack, s_stack, bits, block_size, n, out=o_t, accumulate=True) is o_t
    assert_bitwise_equal(o_t, o_r)
    for out_bits in (4, 8):
        assert_pair_equal(*both("dequantize_sum_requantize", q_stack, s_stack, bits, block_size, out_bits=out_bits))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("perm", [[0], [1, 0], [2, 0, 3, 1], [0, 4, 1, 5, 2, 6, 3, 7]])
def test_quantize_reordered_bit_exact(bits, dtype, perm):
    block_size = 64
    x = special_input(len(perm) * block_size * 2, dtype, block_size, seed=len(perm))
    assert_pair_equal(*both("quantize_reordered", x, bits, block_size, perm))
    q, s = T.quantize_reordered(x, bits, block_size, perm)
    sl = x.view(len(perm), -1)
    assert_pair_equal((q, s), R.quantize(torch.cat([sl[p] for p in perm]), bits, block_size))
    with pytest.raises(ValueError, match="not divisible by block_size"):
        T.quantize_reordered(x[: len(perm) * 96], bits, block_size, perm)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5000),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(DTYPES),
    log_b=st.integers(6, 13),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_all_ops_hypothesis(n, bits, dtype, log_b, k, seed):
    B = 2**log_b
    x = special_input(n, dtype, B, seed)
    (qr, sr), (qt, st_) = both("quantize", x, bits, B)
    assert_pair_equal((qt, st_), (qr, sr))
    assert_pair_equal(*both("dequantize", qr, sr, bits, B, n, dtype))
    qs = torch.stack([qr] + [R.quantize(make_input(n, dtype, seed + i), bits, B)[0] for i in range(1, k)])
    ss = torch.stack([sr] + [R.quantize(make_input(n, dtype, seed + i), bits, B)[1] for i in range(1, k)])
    assert_pair_equal(*both("dequantize_sum", qs, ss, bits, B, n))
    assert_pair_equal(*both("dequantize_sum_requantize", qs, ss, bits, B, out_bits=12 - bits))


def test_dispatch_forced_triton(monkeypatch):
    calls = []
    orig = T.quantize
    monkeypatch.setattr(T, "quantize", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    x = make_input(700, torch.float32, 3)
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    kernels.quantize(x, 8, 64)
    assert calls == []  # auto on CPU -> cpu_fast or the reference, never triton
    kernels.quantize(x, 8, 64, backend="triton")
    assert calls == [1]
    monkeypatch.setenv(kernels.ENV_VAR, "triton")
    q, s = kernels.quantize(x, 8, 64)
    assert calls == [1, 1]
    kernels.quantize(x, 8, 64, backend="reference")  # argument beats the env var
    assert calls == [1, 1]
    assert_pair_equal((q, s), R.quantize(x, 8, 64))
    assert_bitwise_equal(kernels.dequantize(q, s, 8, 64, 700), R.dequantize(q, s, 8, 64, 700))
