"""Fast CPU backend: one C pass per block, bit for bit equal to :mod:`zero_topo.kernels.reference`.

The reference does each step of the format as a separate PyTorch op over a chunk (upcast, two
reductions, divide, round, clamp, cast, pack: about ten passes over the data). ``_cpu_fast.c``
does the same IEEE fp32 operations in the same order but block by block, so a block is read from
memory once for its absmax and once (from cache) to quantize it, and nothing else is materialised.
See the C file for how each step keeps bit-exactness.

Build (:mod:`._cpu_build`): on first use the C file is compiled with the system C compiler (``$CC``, else ``cc`` /
``gcc`` / ``clang``) into a shared library cached under ``$MEGATRON_TOPO_KERNEL_CACHE`` (default
``~/.cache/megatron_topo/kernels``), keyed by the source, the compiler, the flags and the CPU, and
loaded with ctypes (no Python headers, no torch headers: it compiles in about a second); an
unwritable user cache falls back to the temp dir. A cache folder is used only when it is this
user's own with mode 0700, and a cached library is loaded only when its SHA-256 matches the one
recorded at its build (:mod:`._cache`); otherwise it is rebuilt, or the reference kernels are used,
with one ``warning:`` line.
``-march=native`` is tried first, then portable flags (``$MEGATRON_TOPO_KERNEL_CFLAGS`` adds
flags). The library is then checked against the
reference on a small input full of special cases; any failure (no compiler, a compile error, a
mismatch) makes :func:`available` False with the reason in :func:`unavailable_reason`, and the
``auto`` dispatch in :mod:`zero_topo.kernels` falls back to the reference.

Threads: calls release the GIL, and a call with enough blocks is split between
``torch.get_num_threads()`` Python threads (each a contiguous range of blocks), so
``OMP_NUM_THREADS=1`` gives one thread as with the reference.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from . import _cpu_build
from ._common import (
    check_dequantize_args,
    check_dequantize_sum_args,
    check_quantize_args,
    check_requantize_args,
    num_blocks,
    payload_dtype,
    payload_nbytes,
)
from ._cpu_build import CACHE_ENV, CFLAGS_ENV  # noqa: F401  (re-exported: tests and docs name cpu_fast.CACHE_ENV)

__all__ = [
    "quantize",
    "dequantize",
    "dequantize_sum",
    "dequantize_sum_requantize",
    "quantize_reordered",
    "available",
    "unavailable_reason",
    "library_path",
]

_DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
MIN_ELEMS_PER_THREAD = 1 << 18  # below ~1 MiB of fp32 per thread the pool costs more than it saves

_lock = threading.RLock()  # re-entered by the self-check during the build
_state: dict = {}  # "lib", "path", "error"
_pool = None


def _forget_pool():  # a forked child has the pool object but not its threads
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


# ------------------------------------------------------------------------------------ build (_cpu_build)
def _build() -> tuple[ctypes.CDLL, str]:
    errors: list[str] = []
    for path in _cpu_build.compiled_libraries(errors):
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
            if lib.mt_abi_version() != 1:
                raise RuntimeError("ABI version mismatch")
            _state["lib"] = lib  # provisional, for the self-check
            why = _self_check()
            if why:
                raise RuntimeError(f"self-check against the reference failed: {why}")
            return lib, path
        except Exception as e:
            _state.pop("lib", None)
            errors.append(f"{path}: {e}")
    if not errors:
        errors.append("no C compiler found (set CC, or install cc/gcc/clang)")
    raise RuntimeError("; ".join(errors))


def _declare(lib):
    P, L, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.mt_quantize.argtypes = [P, I, L, L, I, L, L, P, P]
    lib.mt_dequantize.argtypes = [P, P, I, L, L, L, L, P, I]
    lib.mt_dequant_sum.argtypes = [P, L, P, L, L, I, L, L, L, L, P, I]
    lib.mt_dequant_sum_requant.argtypes = [P, L, P, L, L, I, L, I, L, L, P, P]
    for fn in (lib.mt_quantize, lib.mt_dequantize, lib.mt_dequant_sum, lib.mt_dequant_sum_requant):
        fn.restype = None
    lib.mt_abi_version.restype = I
    lib.mt_f16_impl.restype = I


def _lib():
    lib = _state.get("lib")
    if lib is not None and "path" in _state:
        return lib
    with _lock:
        if "lib" in _state:  # built, or this thread is building it (self-check)
            return _state["lib"]
        if "error" in _state:
            raise RuntimeError(f"cpu_fast kernels unavailable: {_state['error']}")
        try:
            lib, path = _build()
        except Exception as e:
            _state["error"] = str(e)
            raise RuntimeError(f"cpu_fast kernels unavailable: {e}") from None
        _state["lib"], _state["path"] = lib, path
        return lib


def available() -> bool:
    """True when the C library builds (or is cached), loads and passes its self-check."""
    try:
        _lib()
        return True
    except RuntimeError:
        return False


def unavailable_reason() -> str | None:
    available()
    return _state.get("error")


def library_path() -> str | None:
    return _state.get("path") if available() else None


def _self_check() -> str | None:
    """Compare with the reference on blocks of special values; None if equal bit for bit."""
    from . import reference as R

    g = torch.Generator().manual_seed(1234)
    B = 64
    x = torch.randn(B * 9 + 13, generator=g) * torch.logspace(-3, 3, B * 9 + 13)
    x[B : 2 * B] = -0.0
    x[2 * B + 5] = float("nan")
    x[3 * B + 7] = float("inf")
    x[4 * B] = 127.0
    x[4 * B + 1 : 5 * B] = torch.arange(B - 1, dtype=torch.float32) - 31.5  # .5 ties
    x[5 * B : 6 * B] *= 1e-40  # subnormal
    x[6 * B : 7 * B] = 0.0
    x[7 * B] = 3e38
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xd = x.to(dtype)
        for bits in (8, 4):
            q, s = quantize(xd, bits, B)
            qr, sr = R.quantize(xd, bits, B)
            if not torch.equal(q, qr) or not _same(s, sr):
                return f"quantize {dtype} int{bits}"
            for odt in (torch.float32, torch.bfloat16, torch.float16):
                if not _same(
                    dequantize(q, s, bits, B, xd.numel(), odt), R.dequantize(qr, sr, bits, B, xd.numel(), odt)
                ):
                    return f"dequantize {dtype} int{bits} -> {odt}"
            qs, ss = torch.stack([q, q.flip(0)]), torch.stack([s, s.flip(0)])
            if not _same(dequantize_sum(qs, ss, bits, B, xd.numel()), R.dequantize_sum(qs, ss, bits, B, xd.numel())):
                return f"dequantize_sum int{bits}"
            a, b = dequantize_sum_requantize(qs, ss, bits, B), R.dequantize_sum_requantize(qs, ss, bits, B)
            if not torch.equal(a[0], b[0]) or not _same(a[1], b[1]):
                return f"dequantize_sum_requantize int{bits}"
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns except that NaNs only need to be NaN in the same places."""
    na, nb = a.isnan(), b.isnan()
    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(na, nb):
        return False
    iv = torch.int32 if a.dtype == torch.float32 else torch.int16
    return torch.equal(a.view(iv)[~na], b.view(iv)[~nb])


# ------------------------------------------------------------------------------ threading
def _run(fn, nb: int, elems_per_block: int, args_fn) -> None:
    """Call fn(*args_fn(b0, b1)) over blocks [0, nb), split between torch's threads."""
    if nb == 0:
        return
    t = min(torch.get_num_threads(), max(1, nb * elems_per_block // MIN_ELEMS_PER_THREAD), nb)
    if t <= 1:
        fn(*args_fn(0, nb))
        return
    global _pool
    if _pool is None or _pool._max_workers < t:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=t, thread_name_prefix="mt_cpu_fast")
    bounds = [nb * i // t for i in range(t + 1)]
    futs = [_pool.submit(fn, *args_fn(bounds[i], bounds[i + 1])) for i in range(1, t)]
    fn(*args_fn(bounds[0], bounds[1]))
    for f in futs:
        f.result()


def _check_cpu(*ts):
    for t in ts:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"the cpu_fast backend needs CPU tensors, got one on {t.device}")


# ---------------------------------------------------------------------------------- ops
def _quantize_into(flat, bits, block_size, q, scales, nblocks):
    lib = _lib()
    dt = _DT[flat.dtype]
    n = flat.numel()
    xp, qp, sp = flat.data_ptr(), q.data_ptr(), scales.data_ptr()
    _run(lib.mt_quantize, nblocks, block_size, lambda b0, b1: (xp, dt, n, block_size, bits, b0, b1, qp, sp))


def quantize(x: torch.Tensor, bits: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as :func:`zero_topo.kernels.reference.quantize`."""
    bits, block_size, _ = check_quantize_args(x, bits, block_size)
    _check_cpu(x)
    flat = x.reshape(-1).contiguous()
    n = flat.numel()
    nb = num_blocks(n, block_size)
    q = torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits))
    scales = torch.empty(nb, dtype=torch.float32)
    _quantize_into(flat, bits, block_size, q, scales, nb)
    return q, scales


def dequantize(
    q: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same as :func:`zero_topo.kernels.reference.dequantize`."""
    check_dequantize_args(q, scales, bits, block_size, numel, dtype, out)
    _check_cpu(q, scales)
    lib = _lib()
    qf, sf = q.reshape(-1).contiguous(), scales.reshape(-1).contiguous()
    out = torch.empty(numel, dtype=dtype) if out is None else out
    nb = num_blocks(numel, block_size)
    qp, sp, op, dt = qf.data_ptr(), sf.data_ptr(), out.data_ptr(), _DT[dtype]
    _run(lib.mt_dequantize, nb, block_size, lambda b0, b1: (qp, sp, bits, block_size, numel, b0, b1, op, dt))
    return out


def _stack_args(q_stack, scales_stack):
    qs, ss = q_stack.contiguous(), scales_stack.contiguous()
    return qs, ss, qs.data_ptr(), qs.shape[1], ss.data_ptr(), ss.shape[1]


def dequantize_sum(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Same as :func:`zero_topo.kernels.reference.dequantize_sum`."""
    k, numel = check_dequantize_sum_args(q_stack, scales_stack, bits, block_size, numel, out, accumulate)
    _check_cpu(q_stack, scales_stack, out)
    lib = _lib()
    result = torch.empty(numel, dtype=torch.float32) if out is None else out
    qs, ss, qp, qstride, sp, sstride = _stack_args(q_stack, scales_stack)
    nb = num_blocks(numel, block_size)
    rp, acc = result.data_ptr(), int(bool(accumulate))
    _run(
        lib.mt_dequant_sum,
        nb,
        block_size * k,
        lambda b0, b1: (qp, qstride, sp, sstride, k, bits, block_size, numel, b0, b1, rp, acc),
    )
    return result


def dequantize_sum_requantize(
    q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int, out_bits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as :func:`zero_topo.kernels.reference.dequantize_sum_requantize`."""
    k, numel, out_bits = check_requantize_args(q_stack, scales_stack, bits, block_size, out_bits)
    _check_cpu(q_stack, scales_stack)
    lib = _lib()
    nb = num_blocks(numel, block_size)
    q_out = torch.empty(payload_nbytes(numel, out_bits, block_size), dtype=payload_dtype(out_bits))
    s_out = torch.empty(nb, dtype=torch.float32)
    qs, ss, qp, qstride, sp, sstride = _stack_args(q_stack, scales_stack)
    op, osp = q_out.data_ptr(), s_out.data_ptr()
    _run(
        lib.mt_dequant_sum_requant,
        nb,
        block_size * k,
        lambda b0, b1: (qp, qstride, sp, sstride, k, bits, block_size, out_bits, b0, b1, op, osp),
    )
    return q_out, s_out


def quantize_reordered(x: torch.Tensor, bits: int, block_size: int, perm) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as :func:`zero_topo.kernels.reference.quantize_reordered`."""
    bits, block_size, perm = check_quantize_args(x, bits, block_size, perm)
    _check_cpu(x)
    flat = x.reshape(-1).contiguous()
    n = flat.numel()
    lib = _lib()
    k = len(perm)
    rows = n // k // block_size  # blocks per slice
    q = torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits))
    scales = torch.empty(num_blocks(n, block_size), dtype=torch.float32)
    qw = block_size if bits == 8 else block_size // 2
    es, dt = flat.element_size(), _DT[flat.dtype]
    xp, qp, sp = flat.data_ptr(), q.data_ptr(), scales.data_ptr()
    slice_elems = rows * block_size

    for i, p in enumerate(perm):  # slot i <- slice p: blocks [0, rows) of a view of each
        src, dst_q, dst_s = xp + p * slice_elems * es, qp + i * rows * qw, sp + i * rows * 4
        _run(
            lib.mt_quantize,
            rows,
            block_size,
            lambda b0, b1, src=src, dst_q=dst_q, dst_s=dst_s: (
                src,
                dt,
                slice_elems,
                block_size,
                bits,
                b0,
                b1,
                dst_q,
                dst_s,
            ),
        )
    return q, scales
