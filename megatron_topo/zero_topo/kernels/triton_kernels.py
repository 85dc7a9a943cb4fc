"""Triton kernels for the block quantization format of :mod:`zero_topo.kernels.reference` (bit
for bit).

How bit-exactness is kept (the reference is the definition):
* all math in fp32; divisions use ``tl.math.div_rn`` (IEEE round-to-nearest). Plain ``/`` is
  NOT used: on NVIDIA it lowers to ``div.full.f32`` (approximate).
* round-half-to-even is ``(y + 1.5*2**23) - 1.5*2**23``, exact in fp32 round-to-nearest for
  ``|y| < 2**22`` (here ``|y| < 200``, even for subnormal scales); no libdevice needed, so it is
  identical on NVIDIA, AMD and the interpreter. (Checked exhaustively against numpy.rint, which
  like ``torch.round`` rounds half to even, for every fp32 in [-2**10, 2**10].)
* kernels are launched with ``enable_fp_fusion=False`` so ``acc + q*scale`` is never contracted
  into an FMA (the reference rounds the product first).
* bf16 <-> fp32 conversions are done on the bit patterns with integer ops (upcast: shift by 16;
  downcast: round-to-nearest-even), identical to the native ``cvt`` instructions. The
  interpreter's own bf16 casts are wrong (the downcast truncates, the upcast mangles subnormals),
  so the explicit versions keep one code path that is exact everywhere. fp16 uses native casts.
* absmax uses a separate non-finite flag instead of relying on NaN propagation of ``tl.max``.
* every tile is handled as an (even, odd) pair of ``[ROWS, B/2]`` tiles, so INT8 and INT4 (two
  values per byte) share one code path; INT4 nibbles are sign-extended with integer ops.

Triton is imported lazily: this module imports fine without it (``available()`` is then False).
Kernels are decorated at import time, so ``TRITON_INTERPRET=1`` must be set before this module is
first imported for the CPU interpreter to be used (``interpreted()`` tells).
"""

from __future__ import annotations

import torch

from ._common import (
    QMAX,
    check_dequantize_args,
    check_dequantize_sum_args,
    check_quantize_args,
    check_requantize_args,
    num_blocks,
    payload_dtype,
    payload_nbytes,
)

try:
    import triton
    import triton.language as tl

    IMPORT_ERROR: Exception | None = None
except Exception as e:  # ImportError, or a broken/ABI-mismatched install
    triton = tl = None
    IMPORT_ERROR = e


def _jit(fn):
    return triton.jit(fn) if triton is not None else fn


def available() -> bool:
    return triton is not None


TILE_ELEMS = 4096  # elements per program (ROWS blocks of B); B=8192 uses one block per program


# ----------------------------------------------------------------------------- device code
@_jit
def _round_clamp(y, QMAX: tl.constexpr):
    r = (y + 12582912.0) - 12582912.0  # rint (half to even) for |y| < 2**22
    return tl.minimum(tl.maximum(r, -QMAX * 1.0), QMAX * 1.0)


@_jit
def _load_f32(ptrs, mask, IN_BF16: tl.constexpr):
    """Masked load (0 where masked) upcast exactly to fp32; bf16 by bit shift."""
    if IN_BF16:
        u = tl.load(ptrs.to(tl.pointer_type(tl.uint16)), mask=mask, other=0)
        return (u.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@_jit
def _to_out(v, out_ptr, OUT_BF16: tl.constexpr):
    """Cast fp32 ``v`` to the element type of ``out_ptr`` with round-to-nearest-even."""
    if OUT_BF16:
        u = v.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where(v != v, 0x7FC0, r)  # canonical quiet NaN
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(out_ptr.dtype.element_ty)


@_jit
def _quant_pair(xe, xo, QMAX: tl.constexpr):
    """(even, odd) fp32 tiles [ROWS, B/2] -> int32 q tiles and the fp32 scale per row."""
    ae = tl.abs(xe)
    ao = tl.abs(xo)
    bad_e = (ae != ae) | (ae == float("inf"))
    bad_o = (ao != ao) | (ao == float("inf"))
    # max over finite values only (NaN semantics of tl.max differ between backends)
    amax = tl.maximum(tl.max(tl.where(bad_e, 0.0, ae), axis=1), tl.max(tl.where(bad_o, 0.0, ao), axis=1))
    bad = tl.max(bad_e.to(tl.int32) | bad_o.to(tl.int32), axis=1)
    scale = tl.math.div_rn(amax, QMAX * 1.0)
    scale = tl.where(bad > 0, float("nan"), scale)
    ok = scale > 0  # False for all-zero (or underflowed) and non-finite blocks
    div = tl.where(ok, scale, 1.0)[:, None]
    qe = tl.where(ok[:, None], _round_clamp(tl.math.div_rn(xe, div), QMAX), 0.0)
    qo = tl.where(ok[:, None], _round_clamp(tl.math.div_rn(xo, div), QMAX), 0.0)
    return qe.to(tl.int32), qo.to(tl.int32), scale


@_jit
def _store_q(q_ptr, s_ptr, rows, cols, rmask, qe, qo, scale, HALF: tl.constexpr, BITS: tl.constexpr):
    tl.store(s_ptr + rows, scale, mask=rmask)
    if BITS == 8:
        offs = rows[:, None] * (2 * HALF) + 2 * cols[None, :]
        tl.store(q_ptr + offs, qe.to(tl.int8), mask=rmask[:, None])
        tl.store(q_ptr + offs + 1, qo.to(tl.int8), mask=rmask[:, None])
    else:
        byte = (qe & 15) | ((qo & 15) << 4)
        tl.store(q_ptr + rows[:, None] * HALF + cols[None, :], byte.to(tl.uint8), mask=rmask[:, None])


@_jit
def _load_deq(q_ptr, s_ptr, rows, cols, rmask, HALF: tl.constexpr, BITS: tl.constexpr):
    """Dequantized (even, odd) fp32 tiles: q_fp32 * scale."""
    s = tl.load(s_ptr + rows, mask=rmask, other=0.0)[:, None]
    if BITS == 8:
        offs = rows[:, None] * (2 * HALF) + 2 * cols[None, :]
        qe = tl.load(q_ptr + offs, mask=rmask[:, None], other=0).to(tl.float32)
        qo = tl.load(q_ptr + offs + 1, mask=rmask[:, None], other=0).to(tl.float32)
    else:
        b = tl.load(q_ptr + rows[:, None] * HALF + cols[None, :], mask=rmask[:, None], other=0).to(tl.int32)
        lo = b & 15
        hi = (b >> 4) & 15
        qe = (lo - ((lo & 8) << 1)).to(tl.float32)  # sign-extend the 4-bit two's complement
        qo = (hi - ((hi & 8) << 1)).to(tl.float32)
    return qe * s, qo * s


@_jit
def _sum_pair(q_ptr, s_ptr, K, q_stride, s_stride, rows, cols, rmask, HALF: tl.constexpr, BITS: tl.constexpr):
    """((d_0 + d_1) + ...) + d_{K-1} over the K stacked inputs, as (even, odd) fp32 tiles."""
    acc_e, acc_o = _load_deq(q_ptr, s_ptr, rows, cols, rmask, HALF, BITS)
    qp = q_ptr
    sp = s_ptr
    for _ in range(1, K):
        qp += q_stride
        sp += s_stride
        de, do = _load_deq(qp, sp, rows, cols, rmask, HALF, BITS)
        acc_e = acc_e + de
        acc_o = acc_o + do
    return acc_e, acc_o


@_jit
def _quantize_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    perm_ptr,
    n,
    nblocks,
    rows_per_slice,
    HALF: tl.constexpr,
    ROWS: tl.constexpr,
    BITS: tl.constexpr,
    QMAX: tl.constexpr,
    REORDER: tl.constexpr,
    IN_BF16: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < nblocks
    rows = rows.to(tl.int64)
    if REORDER:  # output block `rows` comes from block (perm[slot], same offset) of the input
        slot = rows // rows_per_slice
        src = tl.load(perm_ptr + slot, mask=rmask, other=0).to(tl.int64) * rows_per_slice + rows % rows_per_slice
    else:
        src = rows
    cols = tl.arange(0, HALF)
    offs = src[:, None] * (2 * HALF) + 2 * cols[None, :]
    xe = _load_f32(x_ptr + offs, rmask[:, None] & (offs < n), IN_BF16)
    xo = _load_f32(x_ptr + offs + 1, rmask[:, None] & (offs + 1 < n), IN_BF16)
    qe, qo, scale = _quant_pair(xe, xo, QMAX)
    _store_q(q_ptr, s_ptr, rows, cols, rmask, qe, qo, scale, HALF, BITS)


@_jit
def _dequant_sum_kernel(
    q_ptr,
    s_ptr,
    out_ptr,
    K,
    q_stride,
    s_stride,
    numel,
    nblocks,
    HALF: tl.constexpr,
    ROWS: tl.constexpr,
    BITS: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < nblocks
    rows = rows.to(tl.int64)
    cols = tl.arange(0, HALF)
    acc_e, acc_o = _sum_pair(q_ptr, s_ptr, K, q_stride, s_stride, rows, cols, rmask, HALF, BITS)
    offs = rows[:, None] * (2 * HALF) + 2 * cols[None, :]
    me = rmask[:, None] & (offs < numel)
    mo = rmask[:, None] & (offs + 1 < numel)
    if ACCUMULATE:
        acc_e = tl.load(out_ptr + offs, mask=me, other=0.0) + acc_e
        acc_o = tl.load(out_ptr + offs + 1, mask=mo, other=0.0) + acc_o
    tl.store(out_ptr + offs, _to_out(acc_e, out_ptr, OUT_BF16), mask=me)
    tl.store(out_ptr + offs + 1, _to_out(acc_o, out_ptr, OUT_BF16), mask=mo)


@_jit
def _dequant_sum_requant_kernel(
    q_ptr,
    s_ptr,
    qo_ptr,
    so_ptr,
    K,
    q_stride,
    s_stride,
    nblocks,
    HALF: tl.constexpr,
    ROWS: tl.constexpr,
    BITS: tl.constexpr,
    OUT_BITS: tl.constexpr,
    QMAX: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < nblocks
    rows = rows.to(tl.int64)
    cols = tl.arange(0, HALF)
    acc_e, acc_o = _sum_pair(q_ptr, s_ptr, K, q_stride, s_stride, rows, cols, rmask, HALF, BITS)
    qe, qo, scale = _quant_pair(acc_e, acc_o, QMAX)
    _store_q(qo_ptr, so_ptr, rows, cols, rmask, qe, qo, scale, HALF, OUT_BITS)


# ----------------------------------------------------------------------------- host wrappers
def interpreted() -> bool:
    """True when the kernels were built for the CPU interpreter (TRITON_INTERPRET=1)."""
    # triton's own library (tl.max, ...) is decorated when `triton` is first imported: if that
    # happened before TRITON_INTERPRET=1 (torch._dynamo imports triton), the interpreter cannot
    # call it, so both must have been built for the interpreter
    return (
        available()
        and type(_quantize_kernel).__name__ == "InterpretedFunction"
        and type(tl.standard.max).__name__ == "InterpretedFunction"
    )


def _require(*tensors: torch.Tensor) -> None:
    if not available():
        raise RuntimeError(f"triton backend requested but triton failed to import: {IMPORT_ERROR!r}")
    for t in tensors:
        if not t.is_cuda and not interpreted():
            raise ValueError(
                f"triton backend got a tensor on {t.device}; CPU tensors need "
                "TRITON_INTERPRET=1 set before triton is first imported (torch._dynamo "
                "imports it too)"
            )


def _launch(kernel, grid, device, *args, **meta):
    if grid[0] == 0:
        return
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta)


def _meta(block_size: int) -> tuple[int, dict]:
    rows = max(1, TILE_ELEMS // block_size)
    return rows, dict(HALF=block_size // 2, ROWS=rows, num_warps=4 if block_size <= 4096 else 8, enable_fp_fusion=False)


_PERM_CACHE: dict = {}


def _perm_tensor(perm: tuple[int, ...], device) -> torch.Tensor:
    key = (perm, str(device))
    t = _PERM_CACHE.get(key)
    if t is None:
        if len(_PERM_CACHE) > 256:
            _PERM_CACHE.clear()
        t = _PERM_CACHE[key] = torch.tensor(perm, dtype=torch.int32, device=device)
    return t


def _quantize_impl(x, bits, block_size, perm):
    bits, block_size, perm = check_quantize_args(x, bits, block_size, perm)
    _require(x)
    flat = x.reshape(-1)
    n = flat.numel()
    nb = num_blocks(n, block_size)
    q = torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits), device=x.device)
    scales = torch.empty(nb, dtype=torch.float32, device=x.device)
    rows, meta = _meta(block_size)
    rows_per_slice = n // len(perm) // block_size if perm is not None else 1
    perm_t = _perm_tensor(perm, x.device) if perm is not None else scales
    _launch(
        _quantize_kernel,
        (triton.cdiv(nb, rows),),
        x.device,
        flat,
        q,
        scales,
        perm_t,
        n,
        nb,
        max(rows_per_slice, 1),
        BITS=bits,
        QMAX=QMAX[bits],
        REORDER=perm is not None,
        IN_BF16=x.dtype == torch.bfloat16,
        **meta,
    )
    return q, scales


def quantize(x: torch.Tensor, bits: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_impl(x, bits, block_size, None)


def quantize_reordered(x: torch.Tensor, bits: int, block_size: int, perm) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_impl(x, bits, block_size, perm)


def _sum(q_stack, scales_stack, bits, block_size, numel, out, accumulate):
    q_stack, scales_stack = q_stack.contiguous(), scales_stack.contiguous()
    nb = num_blocks(numel, block_size)
    rows, meta = _meta(block_size)
    _launch(
        _dequant_sum_kernel,
        (triton.cdiv(nb, rows),),
        q_stack.device,
        q_stack,
        scales_stack,
        out,
        q_stack.shape[0],
        q_stack.shape[1],
        scales_stack.shape[1],
        numel,
        nb,
        BITS=bits,
        ACCUMULATE=accumulate,
        OUT_BF16=out.dtype == torch.bfloat16,
        **meta,
    )
    return out


def dequantize(
    q: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    check_dequantize_args(q, scales, bits, block_size, numel, dtype, out)
    _require(q, scales)
    out = torch.empty(numel, dtype=dtype, device=q.device) if out is None else out
    return _sum(q.reshape(1, -1), scales.reshape(1, -1), bits, block_size, numel, out, False)


def dequantize_sum(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    k, numel = check_dequantize_sum_args(q_stack, scales_stack, bits, block_size, numel, out, accumulate)
    _require(q_stack, scales_stack)
    result = torch.empty(numel, dtype=torch.float32, device=q_stack.device) if out is None else out
    _sum(q_stack, scales_stack, bits, block_size, numel, result, bool(accumulate))
    return result


def dequantize_sum_requantize(
    q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int, out_bits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    k, numel, out_bits = check_requantize_args(q_stack, scales_stack, bits, block_size, out_bits)
    _require(q_stack, scales_stack)
    q_stack, scales_stack = q_stack.contiguous(), scales_stack.contiguous()
    nb = num_blocks(numel, block_size)
    dev = q_stack.device
    q_out = torch.empty(payload_nbytes(numel, out_bits, block_size), dtype=payload_dtype(out_bits), device=dev)
    s_out = torch.empty(nb, dtype=torch.float32, device=dev)
    rows, meta = _meta(block_size)
    _launch(
        _dequant_sum_requant_kernel,
        (triton.cdiv(nb, rows),),
        dev,
        q_stack,
        scales_stack,
        q_out,
        s_out,
        k,
        q_stack.shape[1],
        scales_stack.shape[1],
        nb,
        BITS=bits,
        OUT_BITS=out_bits,
        QMAX=QMAX[out_bits],
        **meta,
    )
    return q_out, s_out
