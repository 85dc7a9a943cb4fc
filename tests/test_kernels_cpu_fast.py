"""The cpu_fast backend (one C pass per block) equals the reference bit for bit; it builds, caches
and falls back as documented."""

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_topo.zero_topo import kernels
from megatron_topo.zero_topo.kernels import cpu_fast as CF
from megatron_topo.zero_topo.kernels import reference as R

from .kernel_cases import DTYPES, assert_bitwise_equal, assert_same_ops, make_input, raw_bits, run_py, special_input

needs_fast = pytest.mark.skipif(not CF.available(), reason=f"cpu_fast unavailable: {CF.unavailable_reason()}")


@needs_fast
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [64, 128, 1024, 8192])
def test_cpu_fast_bit_exact_special_values(bits, dtype, block_size):
    for i, n in enumerate([1, 63, block_size - 1, block_size, block_size + 1, 3017, 3 * block_size + 5]):
        assert_same_ops(special_input(n, dtype, block_size, seed=block_size + i), bits, block_size, k=1 + i % 3, seed=i)


@needs_fast
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 20000),
    bits=st.sampled_from([8, 4]),
    dtype=st.sampled_from(DTYPES),
    log_b=st.integers(6, 13),
    k=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    kind=st.sampled_from(["special", "raw", "random"]),
)
def test_cpu_fast_hypothesis(n, bits, dtype, log_b, k, seed, kind):
    x = {
        "special": special_input,
        "raw": lambda n, d, b, s: raw_bits(n, d, s),
        "random": lambda n, d, b, s: make_input(n, d, s),
    }[kind](n, dtype, 2**log_b, seed)
    assert_same_ops(x, bits, 2**log_b, k=k, seed=seed)


@needs_fast
@settings(max_examples=40, deadline=None)
@given(
    nb=st.integers(1, 40),
    bits=st.sampled_from([8, 4]),
    log_b=st.integers(6, 9),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_cpu_fast_arbitrary_payloads_and_scales(nb, bits, log_b, k, seed):
    """Dequantization paths on payloads/scales no quantizer would produce: any byte, any fp32 scale
    (negative, NaN, inf, subnormal, huge: products and sums overflow)."""
    B = 2**log_b
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
        a, b = (
            CF.dequantize_sum_requantize(q, s, bits, B, out_bits=ob),
            R.dequantize_sum_requantize(q, s, bits, B, out_bits=ob),
        )
        assert_bitwise_equal(a[0], b[0])
        assert_bitwise_equal(a[1], b[1])


@needs_fast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_fast_every_16bit_pattern(dtype):
    """All 65536 input bit patterns quantized; every fp32 product rounded to the 16-bit dtype."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
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
    scales[:8] = torch.tensor(
        [1.0 + 2**-8, 1.0 + 3 * 2**-8, 2**-24, 2**-25, 3 * 2**-26, 65520.0 / 127, 65504.0 / 127, 1e-45]
    )
    for i in range(0, 4096, 64):
        s = scales[i : i + 64]
        qq = q.repeat(64)[: 64 * 64]
        assert_bitwise_equal(CF.dequantize(qq, s, 8, 64, 64 * 64, dtype), R.dequantize(qq, s, 8, 64, 64 * 64, dtype))


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
        CF.quantize_reordered(x[: len(perm) * 96], bits, 128, perm)


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
        assert_bitwise_equal(
            CF.dequantize_sum(q_nc, s_nc, bits, 64, 4000), R.dequantize_sum(q_nc, s_nc, bits, 64, 4000)
        )
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
    for fn, args in (
        ("quantize", (x.double(), 8, 64)),
        ("quantize", (x, 3, 64)),
        ("dequantize", (q, s, 8, 64, 2000)),
        ("dequantize_sum", (torch.stack([q, q]), s[None], 8, 64, 700)),
    ):
        with pytest.raises(ValueError) as fast_err:
            getattr(CF, fn)(*args)
        with pytest.raises(ValueError) as ref_err:
            getattr(R, fn)(*args)
        assert str(fast_err.value) == str(ref_err.value)
    q0, s0 = CF.quantize(torch.zeros(0), 4, 64)
    assert q0.numel() == 0 and s0.numel() == 0 and CF.dequantize(q0, s0, 4, 64, 0).numel() == 0


def test_cpu_fast_builds_where_a_compiler_exists():
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    assert CF.available(), CF.unavailable_reason()
    assert kernels.cpu_fast_available()


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
        "print('ok')\n"
    )
    env = {"PATH": str(tmp_path / "nothing"), CF.CACHE_ENV: str(tmp_path / "cache"), "CC": ""}
    run_py(code, env)


@needs_fast
@pytest.mark.parametrize("cflags", ["-DMT_NO_F16C", "-DMT_NO_F16C -DMT_NO_FLOAT16"])
def test_cpu_fast_portable_builds(cflags, tmp_path):
    """The fp16 conversions without F16C instructions (_Float16, then plain integer code) are what
    other CPUs/compilers get: same bits, checked on every fp16 pattern and the special values."""
    code = (
        "import torch\n"
        "from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
        "from tests.kernel_cases import special_input, assert_same_ops\n"
        f"assert CF.available(), CF.unavailable_reason()\n"
        f"assert CF._lib().mt_f16_impl() == {1 if cflags == '-DMT_NO_F16C' else 0}\n"
        "import tests.test_kernels_cpu_fast as T\n"
        "T.test_cpu_fast_every_16bit_pattern.__wrapped__(torch.float16) if hasattr("
        "T.test_cpu_fast_every_16bit_pattern, '__wrapped__') else T.test_cpu_fast_every_16bit_pattern(torch.float16)\n"
        "for B in (64, 1024):\n"
        "    for bits in (8, 4):\n"
        "        for n in (1, 3017, 3 * B + 5):\n"
        "            assert_same_ops(special_input(n, torch.float16, B, n), bits, B, k=3, seed=n)\n"
        "print('ok')\n"
    )
    run_py(code, {CF.CFLAGS_ENV: cflags, CF.CACHE_ENV: str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})


def test_cpu_fast_cache_falls_back_to_the_temp_dir(tmp_path):
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on this machine")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the user cache cannot be created under a file
    code = (
        "from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
        "assert CF.available(), CF.unavailable_reason()\n"
        f"assert CF.library_path().startswith({str(tmp_path / 'tmp')!r}), CF.library_path()\n"
        "print('ok')\n"
    )
    (tmp_path / "tmp").mkdir()
    run_py(
        code,
        {"XDG_CACHE_HOME": str(blocker), "TMPDIR": str(tmp_path / "tmp"), CF.CACHE_ENV: "", "OMP_NUM_THREADS": "1"},
    )
