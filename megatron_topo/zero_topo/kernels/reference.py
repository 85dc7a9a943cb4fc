"""Pure-PyTorch block quantization: this module is the DEFINITION of the format (docs/design.md §5).

Format
------
* The input (any shape, float32/bfloat16/float16) is flattened and cut into blocks of ``B``
  elements, ``B`` a power of two in [64, 8192]. A ragged last block is zero-padded internally, so
  outputs always cover ``nblocks = ceil(n / B)`` whole blocks.
* One float32 scale per block: ``scale = absmax / qmax`` with ``absmax = max(|x_fp32|)`` over the
  block, computed in fp32 from the input upcast to fp32; ``qmax`` = 127 (INT8) or 7 (INT4).
* ``q = clamp(round_half_to_even(x_fp32 / scale), -qmax, qmax)``: a true IEEE fp32 division
  (never a multiplication by a reciprocal), so the Triton kernels can match bit for bit.
* INT8 payload: ``torch.int8``, ``nblocks * B`` elements, element order unchanged.
  INT4 payload: ``torch.uint8``, ``nblocks * B / 2`` bytes; byte ``i`` holds element ``2i`` in the
  low nibble and element ``2i+1`` in the high nibble, each as 4-bit two's complement.
* Dequantization is ``q_fp32 * scale`` (one rounding), then a cast to the caller's dtype.

Special blocks (no host synchronisation is ever needed to handle them):
* all-zero block: ``scale = 0``, payload zeros, dequantizes to exact (+0) zeros. The same happens
  when ``absmax / qmax`` underflows to 0 (|x| < ~1e-43): such a block dequantizes to zeros.
* non-finite input, policy PROPAGATE: a block containing any NaN or +-inf gets ``scale = NaN`` and
  a zero payload, so it dequantizes to all-NaN (a sum or requantization involving it stays NaN).
  The engine's fp16-style overflow check then sees the NaN and skips the step, exactly as it would
  for an unquantized non-finite gradient.

Error bound: for every block with a normal (not subnormal) scale,
``|x - dequantize(quantize(x))| <= scale / 2`` elementwise.

Fused ops (defined as the composition of the simple ones, in this exact fp32 order):
* ``dequantize_sum``: k inputs stacked as ``[k, nbytes]`` / ``[k, nblocks]`` (an all-to-all receive
  buffer); ``sum = ((d_0 + d_1) + d_2) + ... + d_{k-1}`` in fp32; with ``accumulate`` the result is
  ``out + sum`` (the sum first, then one add into ``out``).
* ``dequantize_sum_requantize``: the fp32 sum over all ``nblocks * B`` padded elements is
  quantized again (the intra-node hop of ZeRO++ qgZ).
* ``quantize_reordered``: ``quantize(cat([slice[perm[i]] for i in range(k)]))`` where ``x`` is cut
  into ``k = len(perm)`` equal slices (ZeRO++ Eq. 2 tensor-slice reordering).

The implementation works on ``[rows, B]`` views in cache-sized chunks with in-place ops. It is the
CPU fallback; the default CPU path is :mod:`zero_topo.kernels.cpu_fast` (the same operations in
C, one pass per block, tested equal to this module bit for bit), used when a C compiler is available.
"""

from __future__ import annotations

import sys

import torch

from ._common import (
    QMAX,
    check_dequantize_args,
    check_dequantize_sum_args,
    check_quantize_args,
    check_requantize_args,
    inverse_permutation,
    num_blocks,
    payload_dtype,
    payload_nbytes,
)

__all__ = [
    "quantize",
    "dequantize",
    "dequantize_sum",
    "dequantize_sum_requantize",
    "quantize_reordered",
    "inverse_permutation",
    "pack_int4",
    "unpack_int4",
    "num_blocks",
    "payload_nbytes",
]

CHUNK_ELEMS = 1 << 18  # ~1 MiB of fp32 per chunk: the temporaries stay in L2


class _Workspace:
    """Chunk-sized scratch buffers, allocated once per call and reused across chunks."""

    def __init__(self, rows: int, block_size: int, device):
        self.rows, self.block_size, self.device, self._bufs = rows, block_size, device, {}

    def get(self, name: str, dtype: torch.dtype, m: int) -> torch.Tensor:
        buf = self._bufs.get(name)
        if buf is None:
            buf = torch.empty(self.rows, self.block_size, dtype=dtype, device=self.device)
            self._bufs[name] = buf
        return buf[:m]


def _rows_per_chunk(block_size: int) -> int:
    return max(1, CHUNK_ELEMS // block_size)


_LITTLE = sys.byteorder == "little"
_LUT: dict = {}


def _int16_pairs(t: torch.Tensor):
    """``t`` (int8/uint8, last dim even) viewed as int16 pairs, or None if that is impossible."""
    if not _LITTLE or t.shape[-1] % 2 or not t.is_contiguous():
        return None
    try:
        return t.view(torch.int16)
    except RuntimeError:  # odd storage offset
        return None


def _unpack_lut(device) -> torch.Tensor:
    """int16 per byte value whose two bytes are the sign-extended (low, high) nibbles."""
    lut = _LUT.get(device)
    if lut is None:
        v = torch.arange(256, dtype=torch.int32)
        lo, hi = v & 15, (v >> 4) & 15
        lo, hi = lo - ((lo & 8) << 1), hi - ((hi & 8) << 1)
        lut = _LUT[device] = ((lo & 0xFF) | (hi << 8)).to(torch.int16).to(device)
    return lut


def pack_int4(q8: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pack int8 values in [-8, 7] (last dim even) into bytes: element 2i -> low nibble of byte i,
    element 2i+1 -> high nibble."""
    if out is None:
        out = torch.empty(*q8.shape[:-1], q8.shape[-1] // 2, dtype=torch.uint8, device=q8.device)
    v = _int16_pairs(q8)
    if v is not None:  # fast path: (pair & 0x000F) | ((pair >> 4) & 0x00F0) on int16 pairs
        w = torch.bitwise_right_shift(v, 4).bitwise_and_(0xF0)
        return out.copy_(w.bitwise_or_(v.bitwise_and(0x0F)))
    u = q8.view(torch.uint8)
    torch.bitwise_and(u[..., 0::2], 0x0F, out=out)
    out.bitwise_or_(torch.bitwise_left_shift(u[..., 1::2], 4))  # uint8 shift wraps mod 256
    return out


def unpack_int4(packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: bytes -> sign-extended int8 values (last dim doubled)."""
    if out is None:
        out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.int8, device=packed.device)
    v = _int16_pairs(out)
    if v is not None:  # fast path: one table lookup per byte writes both values
        idx = packed.reshape(-1).to(torch.int32)
        torch.index_select(_unpack_lut(packed.device), 0, idx, out=v.view(-1))
        return out
    pairs = out.view(*packed.shape, 2)
    lo = torch.bitwise_left_shift(packed, 4).view(torch.int8)
    torch.bitwise_right_shift(lo, 4, out=pairs[..., 0])  # arithmetic shift sign-extends
    torch.bitwise_right_shift(packed.view(torch.int8), 4, out=pairs[..., 1])
    return out


def _quant_rows(xr: torch.Tensor, bits: int, q_out: torch.Tensor, s_out: torch.Tensor, ws: _Workspace) -> None:
    """Quantize full blocks ``xr`` [R, B] into ``q_out`` ([R, B] int8 or [R, B/2] uint8) and
    ``s_out`` [R], chunk by chunk."""
    qmax = QMAX[bits]
    step = ws.rows
    for r0 in range(0, xr.shape[0], step):
        r1 = min(xr.shape[0], r0 + step)
        m = r1 - r0
        xs = xr[r0:r1]
        if xs.dtype != torch.float32:
            xs = ws.get("up", torch.float32, m).copy_(xs)  # exact upcast
        b = ws.get("f32", torch.float32, m)
        s = s_out[r0:r1]
        # absmax = max(|x|) = |max(amax, -amin)| (two cheap reductions instead of abs + amax;
        # the final abs_ turns a -0.0 of an all-(-0.0) block into +0.0). NaN propagates, inf -> inf.
        torch.maximum(torch.amax(xs, dim=1, out=s), torch.amin(xs, dim=1).neg_(), out=s).abs_()
        s.div_(qmax)
        s.masked_fill_(~torch.isfinite(s), float("nan"))  # non-finite block -> NaN scale
        torch.div(xs, s[:, None], out=b)
        # NaN-scale blocks (x/NaN) and all-zero blocks (0/0) -> payload 0. When every scale is > 0
        # nothing is non-finite and the pass is skipped (checked only on CPU: no device sync).
        if xs.device.type != "cpu" or not bool((s > 0).all()):
            b.nan_to_num_(0.0, 0.0, 0.0)
        b.round_()  # round half to even
        b.clamp_(-qmax, qmax)
        if bits == 8:
            q_out[r0:r1].copy_(b)
        else:
            t = ws.get("i8", torch.int8, m).copy_(b)
            pack_int4(t, out=q_out[r0:r1])


def _dequant_rows(
    q_rows: torch.Tensor, s_rows: torch.Tensor, bits: int, out: torch.Tensor, ws: _Workspace
) -> torch.Tensor:
    """fp32 ``out`` [m, B] = q_fp32 * scale for m full blocks."""
    if bits == 4:
        q_rows = unpack_int4(q_rows, out=ws.get("i8", torch.int8, q_rows.shape[0]))
    # exact int8 -> fp32 conversion, then one fp32 multiply (a mixed-dtype mul is ~3x slower)
    return out.copy_(q_rows).mul_(s_rows[:, None])


def _sum_rows(
    q3: torch.Tensor, s2: torch.Tensor, r0: int, r1: int, bits: int, acc: torch.Tensor, ws: _Workspace
) -> torch.Tensor:
    """acc = ((d_0 + d_1) + ...) + d_{k-1} over blocks r0:r1 of the k stacked inputs."""
    _dequant_rows(q3[0, r0:r1], s2[0, r0:r1], bits, acc, ws)
    if q3.shape[0] > 1:
        tmp = ws.get("f32b", torch.float32, r1 - r0)
        for i in range(1, q3.shape[0]):
            acc.add_(_dequant_rows(q3[i, r0:r1], s2[i, r0:r1], bits, tmp, ws))
    return acc


def _payload_rows(q: torch.Tensor, bits: int, block_size: int) -> torch.Tensor:
    """View a flat (or stacked [k, nbytes]) payload as rows of one block each."""
    width = block_size if bits == 8 else block_size // 2
    return q.reshape(*q.shape[:-1], q.shape[-1] // width, width)


def quantize(x: torch.Tensor, bits: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten ``x`` and quantize it. Returns (payload, fp32 scales [ceil(n/B)])."""
    bits, block_size, _ = check_quantize_args(x, bits, block_size)
    flat = x.reshape(-1)
    n = flat.numel()
    nb, nfull = num_blocks(n, block_size), n // block_size
    q = torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits), device=x.device)
    scales = torch.empty(nb, dtype=torch.float32, device=x.device)
    q2 = _payload_rows(q, bits, block_size)
    ws = _Workspace(min(_rows_per_chunk(block_size), max(nb, 1)), block_size, x.device)
    _quant_rows(flat[: nfull * block_size].view(nfull, block_size), bits, q2[:nfull], scales[:nfull], ws)
    if nb > nfull:  # ragged last block, zero-padded
        tail = torch.zeros(1, block_size, dtype=torch.float32, device=x.device)
        tail[0, : n - nfull * block_size].copy_(flat[nfull * block_size :])
        _quant_rows(tail, bits, q2[nfull:], scales[nfull:], ws)
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
    """Flat tensor of ``numel`` elements in ``dtype``: (q_fp32 * scale).to(dtype) (into ``out``
    when given)."""
    check_dequantize_args(q, scales, bits, block_size, numel, dtype, out)
    nb, nfull = num_blocks(numel, block_size), numel // block_size
    q2, s = _payload_rows(q.reshape(-1), bits, block_size), scales.reshape(-1)
    given = out
    out = torch.empty(numel, dtype=dtype, device=q.device) if out is None else out.view(-1)
    rows = out[: nfull * block_size].view(nfull, block_size)
    ws = _Workspace(min(_rows_per_chunk(block_size), max(nb, 1)), block_size, q.device)
    for r0 in range(0, nb, ws.rows):
        r1 = min(nb, r0 + ws.rows)
        full = min(r1, nfull)
        if dtype == torch.float32 and full == r1:
            _dequant_rows(q2[r0:r1], s[r0:r1], bits, rows[r0:r1], ws)
            continue
        b = _dequant_rows(q2[r0:r1], s[r0:r1], bits, ws.get("f32", torch.float32, r1 - r0), ws)
        rows[r0:full].copy_(b[: full - r0])
        if full < r1:  # ragged last block: drop the padding
            out[nfull * block_size :].copy_(b[-1, : numel - nfull * block_size])
    return out if given is None else given


def _sum_into(q_stack, scales_stack, bits, block_size, numel, result, accumulate):
    nb, nfull = num_blocks(numel, block_size), numel // block_size
    q3, s2 = _payload_rows(q_stack, bits, block_size), scales_stack
    rows = result[: nfull * block_size].view(nfull, block_size)
    ws = _Workspace(min(_rows_per_chunk(block_size), max(nb, 1)), block_size, q_stack.device)
    for r0 in range(0, nb, ws.rows):
        r1 = min(nb, r0 + ws.rows)
        full = min(r1, nfull)
        if not accumulate and full == r1:
            _sum_rows(q3, s2, r0, r1, bits, rows[r0:r1], ws)
            continue
        acc = _sum_rows(q3, s2, r0, r1, bits, ws.get("acc", torch.float32, r1 - r0), ws)
        dst, src = [rows[r0:full]], [acc[: full - r0]]
        if full < r1:
            dst.append(result[nfull * block_size :])
            src.append(acc[-1, : numel - nfull * block_size])
        for d, a in zip(dst, src):
            d.add_(a) if accumulate else d.copy_(a)


def dequantize_sum(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """fp32 sum of k stacked quantized tensors (index order 0..k-1); see the module docstring."""
    k, numel = check_dequantize_sum_args(q_stack, scales_stack, bits, block_size, numel, out, accumulate)
    result = torch.empty(numel, dtype=torch.float32, device=q_stack.device) if out is None else out
    _sum_into(q_stack, scales_stack, bits, block_size, numel, result.view(-1), accumulate)
    return result


def dequantize_sum_requantize(
    q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int, out_bits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize(dequantize_sum(...over all nblocks*B padded elements...), out_bits)."""
    k, numel, out_bits = check_requantize_args(q_stack, scales_stack, bits, block_size, out_bits)
    nb = num_blocks(numel, block_size)
    dev = q_stack.device
    q_out = torch.empty(payload_nbytes(numel, out_bits, block_size), dtype=payload_dtype(out_bits), device=dev)
    s_out = torch.empty(nb, dtype=torch.float32, device=dev)
    q3, qo2 = _payload_rows(q_stack, bits, block_size), _payload_rows(q_out, out_bits, block_size)
    ws = _Workspace(min(_rows_per_chunk(block_size), max(nb, 1)), block_size, dev)
    for r0 in range(0, nb, ws.rows):
        r1 = min(nb, r0 + ws.rows)
        acc = _sum_rows(q3, scales_stack, r0, r1, bits, ws.get("acc", torch.float32, r1 - r0), ws)
        _quant_rows(acc, out_bits, qo2[r0:r1], s_out[r0:r1], ws)
    return q_out, s_out


def quantize_reordered(x: torch.Tensor, bits: int, block_size: int, perm) -> tuple[torch.Tensor, torch.Tensor]:
    """Output slot i holds quantized slice perm[i] of x (x cut into len(perm) equal slices)."""
    bits, block_size, perm = check_quantize_args(x, bits, block_size, perm)
    flat = x.reshape(-1)
    n = flat.numel()
    rows_per_slice = n // len(perm) // block_size
    q = torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits), device=x.device)
    scales = torch.empty(num_blocks(n, block_size), dtype=torch.float32, device=x.device)
    q2, xr = _payload_rows(q, bits, block_size), flat.view(-1, block_size)
    ws = _Workspace(min(_rows_per_chunk(block_size), max(rows_per_slice, 1)), block_size, x.device)
    for i, p in enumerate(perm):
        src, dst = (
            slice(p * rows_per_slice, (p + 1) * rows_per_slice),
            slice(i * rows_per_slice, (i + 1) * rows_per_slice),
        )
        _quant_rows(xr[src], bits, q2[dst], scales[dst], ws)
    return q, scales
