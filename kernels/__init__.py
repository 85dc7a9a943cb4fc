"""Block INT8/INT4 quantization kernels (DESIGN.md §5) — the API the ZeRO engine calls.

The format is defined by :mod:`kernels.reference` (pure PyTorch); :mod:`kernels.triton_kernels`
matches it bit for bit on GPUs (NVIDIA and AMD) and under ``TRITON_INTERPRET=1``.

Backend selection, per call:
1. the ``backend=`` argument if given: ``"triton"``, ``"reference"`` or ``"auto"``;
2. else the environment variable ``MEGATRON_TOPO_KERNELS`` (same values), read at call time;
3. ``"auto"`` (the default): GPU tensors (``x.is_cuda``, which includes ROCm) use Triton when it
   imports, everything else uses the reference.
Forcing ``"triton"`` with CPU tensors only works when the kernels were built for the interpreter
(``TRITON_INTERPRET=1`` set before ``kernels.triton_kernels`` is first imported).

Non-finite inputs propagate (a block with NaN/inf dequantizes to all-NaN); see the reference.
"""
from __future__ import annotations

import os

import torch

from . import reference
from ._common import inverse_permutation, num_blocks, payload_nbytes

__all__ = ["quantize", "dequantize", "dequantize_sum", "dequantize_sum_requantize",
           "quantize_reordered", "inverse_permutation", "payload_nbytes", "num_blocks",
           "resolve_backend", "triton_available", "ENV_VAR", "BACKENDS"]

ENV_VAR = "MEGATRON_TOPO_KERNELS"
BACKENDS = ("auto", "triton", "reference")


def _triton_module():
    from . import triton_kernels  # lazy: importing triton is slow and may be absent
    return triton_kernels


def triton_available() -> bool:
    """True when the Triton backend imports (says nothing about a GPU being present)."""
    return _triton_module().available()


def resolve_backend(backend: str | None, tensor: torch.Tensor) -> str:
    """'triton' or 'reference' for an op on ``tensor`` (argument > env var > auto)."""
    source = "backend argument"
    if backend is None:
        backend, source = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto", ENV_VAR
    if backend not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "triton" if tensor.is_cuda and triton_available() else "reference"
    return backend


def _impl(backend, tensor):
    if tensor.device.type == "meta":  # dry run: shapes only
        from . import meta
        return meta
    return _triton_module() if resolve_backend(backend, tensor) == "triton" else reference


def _tensor_arg(t, name):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def quantize(x: torch.Tensor, bits: int, block_size: int,
             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten ``x`` (fp32/bf16/fp16) and quantize it -> (payload, fp32 scales)."""
    return _impl(backend, _tensor_arg(x, "x")).quantize(x, bits, block_size)


def dequantize(q: torch.Tensor, scales: torch.Tensor, bits: int, block_size: int, numel: int,
               dtype: torch.dtype = torch.float32, backend: str | None = None) -> torch.Tensor:
    """Flat tensor of ``numel`` elements in ``dtype`` (q_fp32 * scale, then cast)."""
    return _impl(backend, _tensor_arg(q, "q")).dequantize(q, scales, bits, block_size, numel, dtype)


def dequantize_sum(q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int, block_size: int,
                   numel: int, out: torch.Tensor | None = None, accumulate: bool = False,
                   backend: str | None = None) -> torch.Tensor:
    """fp32 sum over k stacked inputs ([k, nbytes], [k, nblocks]) in index order; with
    ``accumulate=True`` returns ``out`` after ``out += sum``; with ``out`` only, writes into it."""
    return _impl(backend, _tensor_arg(q_stack, "q_stack")).dequantize_sum(
        q_stack, scales_stack, bits, block_size, numel, out=out, accumulate=accumulate)


def dequantize_sum_requantize(q_stack: torch.Tensor, scales_stack: torch.Tensor, bits: int,
                              block_size: int, backend: str | None = None, *,
                              out_bits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dequantize + fp32 sum + quantize (to ``out_bits``, default ``bits``) over all
    nblocks*block_size elements: the intra-node hop of ZeRO++ 2-hop gradient reduction."""
    return _impl(backend, _tensor_arg(q_stack, "q_stack")).dequantize_sum_requantize(
        q_stack, scales_stack, bits, block_size, out_bits=out_bits)


def quantize_reordered(x: torch.Tensor, bits: int, block_size: int, perm,
                       backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut ``x`` into len(perm) equal slices; output slot i holds quantized slice perm[i]."""
    return _impl(backend, _tensor_arg(x, "x")).quantize_reordered(x, bits, block_size, perm)
