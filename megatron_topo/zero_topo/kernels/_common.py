"""Argument validation and size arithmetic shared by every backend (reference, cpu_fast, Triton).

Each op's arguments are checked by one ``check_*_args`` function that all backends call, so the
backends accept the same inputs and raise the same messages. Everything here is cheap host-side
checking on shapes/dtypes only (never reads tensor data, so it never synchronises with a device).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..plan_space import MAX_BLOCK_SIZE as MAX_BLOCK
from ..plan_space import MIN_BLOCK_SIZE as MIN_BLOCK

QMAX = {8: 127, 4: 7}
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_bits(bits) -> int:
    if bits not in QMAX:
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    return int(bits)


def check_block_size(block_size) -> int:
    ok = (
        isinstance(block_size, int)
        and not isinstance(block_size, bool)
        and MIN_BLOCK <= block_size <= MAX_BLOCK
        and block_size & (block_size - 1) == 0
    )
    if not ok:
        raise ValueError(f"block_size must be a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {block_size!r}")
    return block_size


def check_numel(numel) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")
    return numel


def num_blocks(numel: int, block_size: int) -> int:
    """Number of quantization blocks (and scales) covering ``numel`` elements."""
    check_numel(numel)
    check_block_size(block_size)
    return -(-numel // block_size)


def payload_nbytes(numel: int, bits: int, block_size: int) -> int:
    """Bytes of the quantized payload: ceil(numel/B)*B for INT8, half that for INT4."""
    check_bits(bits)
    padded = num_blocks(numel, block_size) * block_size
    return padded if bits == 8 else padded // 2


def payload_dtype(bits: int) -> torch.dtype:
    return torch.int8 if bits == 8 else torch.uint8


def check_input(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")


def check_out_dtype(dtype: torch.dtype) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")


def check_payload(q: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int, numel: int) -> None:
    """One quantized tensor: q is the flat payload, scales the flat fp32 scales."""
    check_bits(bits)
    check_block_size(block_size)
    check_numel(numel)
    want_q, want_s = payload_nbytes(numel, bits, block_size), num_blocks(numel, block_size)
    if q.dtype != payload_dtype(bits):
        raise ValueError(f"INT{bits} payload must be {payload_dtype(bits)}, got {q.dtype}")
    if scales.dtype != torch.float32:
        raise ValueError(f"scales must be float32, got {scales.dtype}")
    if q.numel() != want_q:
        raise ValueError(
            f"payload has {q.numel()} elements, expected {want_q} for numel={numel}, "
            f"bits={bits}, block_size={block_size}"
        )
    if scales.numel() != want_s:
        raise ValueError(
            f"scales has {scales.numel()} elements, expected {want_s} for numel={numel}, block_size={block_size}"
        )
    if q.device != scales.device:
        raise ValueError(f"payload on {q.device} but scales on {scales.device}")


def check_stacks(
    q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int, numel: int | None = None
) -> tuple[int, int]:
    """k stacked quantized tensors of the same layout: q_stack [k, nbytes], scales [k, nblocks].

    Returns (k, numel) where numel defaults to the padded length nblocks*block_size.
    """
    check_bits(bits)
    check_block_size(block_size)
    if q_stack.dim() != 2 or scales_stack.dim() != 2:
        raise ValueError(
            f"q_stack and scales_stack must be 2-D [k, ...], got shapes "
            f"{tuple(q_stack.shape)} and {tuple(scales_stack.shape)}"
        )
    k = q_stack.shape[0]
    if k < 1 or scales_stack.shape[0] != k:
        raise ValueError(
            f"mismatched stacks: q_stack has {q_stack.shape[0]} rows, scales_stack "
            f"has {scales_stack.shape[0]} (need the same k >= 1)"
        )
    if numel is None:
        numel = scales_stack.shape[1] * block_size
    check_numel(numel)
    want_q, want_s = payload_nbytes(numel, bits, block_size), num_blocks(numel, block_size)
    if q_stack.shape[1] != want_q or scales_stack.shape[1] != want_s:
        raise ValueError(
            f"mismatched stacks: got q_stack {tuple(q_stack.shape)} and scales_stack "
            f"{tuple(scales_stack.shape)}, expected [{k}, {want_q}] and [{k}, {want_s}] "
            f"for numel={numel}, bits={bits}, block_size={block_size}"
        )
    if q_stack.dtype != payload_dtype(bits):
        raise ValueError(f"INT{bits} payload must be {payload_dtype(bits)}, got {q_stack.dtype}")
    if scales_stack.dtype != torch.float32:
        raise ValueError(f"scales must be float32, got {scales_stack.dtype}")
    if q_stack.device != scales_stack.device:
        raise ValueError(f"q_stack on {q_stack.device} but scales_stack on {scales_stack.device}")
    return k, numel


def check_out(out: torch.Tensor | None, numel: int, accumulate: bool, device) -> None:
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out tensor to add into")
        return
    if out.dtype != torch.float32 or out.numel() != numel or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous float32 tensor of {numel} elements, got "
            f"{out.dtype} with {out.numel()} elements (contiguous={out.is_contiguous()})"
        )
    if out.device != device:
        raise ValueError(f"out on {out.device} but inputs on {device}")


def check_perm(perm, numel: int, block_size: int) -> tuple[int, ...]:
    """Validate a slice permutation; returns it as a tuple of ints."""
    if isinstance(perm, torch.Tensor):
        perm = perm.tolist()
    try:
        perm = tuple(int(p) for p in perm)
    except TypeError as e:
        raise ValueError(f"perm must be a sequence of ints, got {perm!r}") from e
    k = len(perm)
    if k == 0 or sorted(perm) != list(range(k)):
        raise ValueError(f"perm must be a permutation of 0..k-1, got {list(perm)}")
    if numel % k:
        raise ValueError(f"x.numel()={numel} is not divisible by len(perm)={k}")
    if (numel // k) % block_size:
        raise ValueError(
            f"slice length {numel // k} (x.numel()={numel} / len(perm)={k}) is not divisible by block_size={block_size}"
        )
    return perm


def check_quantize_args(x: torch.Tensor, bits, block_size, perm=None) -> tuple[int, int, tuple[int, ...] | None]:
    """``quantize`` (``perm`` None) and ``quantize_reordered``: (bits, block_size, perm)."""
    check_input(x)
    bits, block_size = check_bits(bits), check_block_size(block_size)
    if perm is not None:
        perm = check_perm(perm, x.numel(), block_size)
    return bits, block_size, perm


def check_dequantize_args(
    q: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> None:
    check_payload(q, scales, bits, block_size, numel)
    check_out_dtype(dtype)
    if out is not None:
        if out.dtype != dtype or out.numel() != numel or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous {dtype} tensor of {numel} elements, got "
                f"{out.dtype} with {out.numel()} elements (contiguous={out.is_contiguous()})"
            )
        if out.device != q.device:
            raise ValueError(f"out on {out.device} but inputs on {q.device}")


def check_dequantize_sum_args(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    out: torch.Tensor | None,
    accumulate: bool,
) -> tuple[int, int]:
    """``dequantize_sum``: (k, numel)."""
    k, numel = check_stacks(q_stack, scales_stack, bits, block_size, numel)
    check_out(out, numel, accumulate, q_stack.device)
    return k, numel


def check_requantize_args(
    q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int, out_bits: int | None
) -> tuple[int, int, int]:
    """``dequantize_sum_requantize``: (k, padded numel, out_bits)."""
    k, numel = check_stacks(q_stack, scales_stack, bits, block_size)
    return k, numel, bits if out_bits is None else check_bits(out_bits)


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    """inv such that inv[perm[i]] == i: slot i of a reordered buffer holds slice perm[i], so slice
    j sits in slot inv[j]; applying the reorder with inv undoes a reorder with perm."""
    perm = [int(p) for p in (perm.tolist() if isinstance(perm, torch.Tensor) else perm)]
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"perm must be a permutation of 0..k-1, got {perm}")
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv
