"""Shape-only kernels for meta tensors (the dry run): outputs of the right shape, dtype and
device with no data, so a 20B step on the meta device does not walk millions of blocks."""

from __future__ import annotations

import torch

from ._common import num_blocks, payload_dtype, payload_nbytes


def _quantized(n: int, bits: int, block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(payload_nbytes(n, bits, block_size), dtype=payload_dtype(bits), device=device),
        torch.empty(num_blocks(n, block_size), dtype=torch.float32, device=device),
    )


def quantize(x, bits, block_size):
    return _quantized(x.numel(), bits, block_size, x.device)


def quantize_reordered(x, bits, block_size, perm):
    return _quantized(x.numel(), bits, block_size, x.device)


def dequantize(q, scales, bits, block_size, numel, dtype=torch.float32, out=None):
    return out if out is not None else torch.empty(numel, dtype=dtype, device=q.device)


def dequantize_sum(q_stack, scales_stack, bits, block_size, numel, out=None, accumulate=False):
    return out if out is not None else torch.empty(numel, dtype=torch.float32, device=q_stack.device)


def dequantize_sum_requantize(q_stack, scales_stack, bits, block_size, out_bits=None):
    n = scales_stack.shape[-1] * block_size
    return _quantized(n, out_bits or bits, block_size, q_stack.device)
