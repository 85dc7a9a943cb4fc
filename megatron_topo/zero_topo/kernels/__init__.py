"""Block INT8/INT4 quantization kernels (docs/design.md §5) — the API the ZeRO engine calls.

The format is defined by :mod:`zero_topo.kernels.reference` (pure PyTorch);
:mod:`zero_topo.kernels.triton_kernels` matches it bit for bit on GPUs (NVIDIA and AMD) and under
``TRITON_INTERPRET=1``, and :mod:`zero_topo.kernels.cpu_fast` (one C pass per block, compiled on
first use) matches it on CPUs.

Backend selection, per call:
1. the ``backend=`` argument if given: ``"triton"``, ``"cpu_fast"``, ``"reference"`` or ``"auto"``;
2. else the environment variable ``MEGATRON_TOPO_KERNELS`` (same values), read at call time;
3. ``"auto"`` (the default): GPU tensors (``x.is_cuda``, which includes ROCm) use Triton when it
   imports, else the reference; CPU tensors use ``cpu_fast`` when it builds and passes its
   self-check (:func:`cpu_fast_available`), else the reference.
Forcing ``"triton"`` with CPU tensors only works when the kernels were built for the interpreter
(``TRITON_INTERPRET=1`` set before ``zero_topo.kernels.triton_kernels`` is first imported). Forcing
``"cpu_fast"`` raises when it is unavailable (the reason is in the message).

Timing: :data:`timer` sums the wall time spent inside these calls per process when enabled
(``timer.enable()``, or ``MEGATRON_TOPO_KERNEL_TIMES`` set: ``1`` counts, a directory also writes
``kernel_times.<rank>.<pid>.json`` there at exit). For GPU tensors it measures launch time only.

Non-finite inputs propagate (a block with NaN/inf dequantizes to all-NaN); see the reference.
"""

from __future__ import annotations

import atexit
import json
import os
import time

import torch

from ...atomic import write_text
from . import reference
from ._common import inverse_permutation, num_blocks, payload_nbytes

__all__ = [
    "quantize",
    "dequantize",
    "dequantize_sum",
    "dequantize_sum_requantize",
    "quantize_reordered",
    "inverse_permutation",
    "payload_nbytes",
    "num_blocks",
    "resolve_backend",
    "triton_available",
    "cpu_fast_available",
    "ENV_VAR",
    "BACKENDS",
    "timer",
    "TIMES_ENV",
    "KernelTimer",
]

ENV_VAR = "MEGATRON_TOPO_KERNELS"
TIMES_ENV = "MEGATRON_TOPO_KERNEL_TIMES"
BACKENDS = ("auto", "triton", "cpu_fast", "reference")


class KernelTimer:
    """Per-process totals of the wall time spent in the kernel calls (off unless enabled)."""

    def __init__(self):
        self.enabled = False
        self.reset()

    def reset(self) -> None:
        self.calls, self.seconds, self.per_op = 0, 0.0, {}

    def enable(self, on: bool = True) -> None:
        self.enabled = bool(on)

    def add(self, op: str, backend: str, dt: float) -> None:
        self.calls += 1
        self.seconds += dt
        c = self.per_op.setdefault(f"{op}/{backend}", [0, 0.0])
        c[0] += 1
        c[1] += dt

    def snapshot(self) -> dict:
        return {
            "calls": self.calls,
            "seconds": self.seconds,
            "per_op": {k: {"calls": v[0], "seconds": v[1]} for k, v in self.per_op.items()},
        }

    def write(self, directory: str) -> str:
        """Write the snapshot (plus rank and pid) as JSON into ``directory``; returns the path."""
        os.makedirs(directory, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        path = os.path.join(directory, f"kernel_times.{rank}.{os.getpid()}.json")
        number = rank.isascii() and rank.isdigit()  # '²' is a digit to isdigit, not to int()
        write_text(path, json.dumps({"rank": int(rank) if number else rank, "pid": os.getpid(), **self.snapshot()}))
        return path


timer = KernelTimer()


def _init_timer_from_env() -> None:
    v = os.environ.get(TIMES_ENV, "").strip()
    if not v or v == "0":
        return
    timer.enable()
    if v != "1":
        atexit.register(_write_times_at_exit, v)


def _write_times_at_exit(directory: str) -> None:
    """The totals into ``directory`` at exit, unless it is or lies inside another artifact's folder
    (a checkpoint, an HF export: one warning line, from rank 0) or cannot be written (one line)."""
    import sys

    from ...safe_outputs import artifact_above

    found = artifact_above(directory)
    try:
        if found is not None:
            raise OSError(f"{directory} lies inside {found[0]}, {found[1]}; nothing is written there")
        timer.write(directory)
    except OSError as e:
        if os.environ.get("RANK", "0") in ("0", ""):
            print(f"warning: {TIMES_ENV}: kernel times not written: {str(e)[:300]}", file=sys.stderr)


_init_timer_from_env()


def _triton_module():
    from . import triton_kernels  # lazy: importing triton is slow and may be absent

    return triton_kernels


def triton_available() -> bool:
    """True when the Triton backend imports (says nothing about a GPU being present)."""
    return _triton_module().available()


def resolve_backend(backend: str | None, tensor: torch.Tensor) -> str:
    """'triton', 'cpu_fast' or 'reference' for an op on ``tensor`` (argument > env var > auto)."""
    source = "backend argument"
    if backend is None:
        backend, source = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto", ENV_VAR
    if backend not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        if tensor.is_cuda:
            return "triton" if triton_available() else "reference"
        if tensor.device.type == "cpu" and cpu_fast_available():
            return "cpu_fast"
        return "reference"
    return backend


def _cpu_fast_module():
    from . import cpu_fast  # lazy: the first use compiles (or loads the cached) C library

    return cpu_fast


def cpu_fast_available() -> bool:
    """True when the cpu_fast C library builds (or is cached), loads and passes its self-check;
    ``zero_topo.kernels.cpu_fast.unavailable_reason()`` says why not."""
    return _cpu_fast_module().available()


def _impl(backend, tensor):
    if tensor.device.type == "meta":  # dry run: shapes only
        from . import meta

        return meta
    name = resolve_backend(backend, tensor)
    if name == "triton":
        return _triton_module()
    return _cpu_fast_module() if name == "cpu_fast" else reference


def _call(op: str, backend, tensor, *args, **kw):
    impl = _impl(backend, tensor)
    if not timer.enabled or tensor.device.type == "meta":
        return getattr(impl, op)(*args, **kw)
    t0 = time.perf_counter()
    try:
        return getattr(impl, op)(*args, **kw)
    finally:
        timer.add(op, impl.__name__.rsplit(".", 1)[-1], time.perf_counter() - t0)


def _tensor_arg(t, name):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def quantize(
    x: torch.Tensor, bits: int, block_size: int, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten ``x`` (fp32/bf16/fp16) and quantize it -> (payload, fp32 scales)."""
    return _call("quantize", backend, _tensor_arg(x, "x"), x, bits, block_size)


def dequantize(
    q: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    dtype: torch.dtype = torch.float32,
    backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flat tensor of ``numel`` elements in ``dtype`` (q_fp32 * scale, then cast); written into
    ``out`` (contiguous, ``numel`` elements of ``dtype``) when given, and ``out`` returned."""
    return _call("dequantize", backend, _tensor_arg(q, "q"), q, scales, bits, block_size, numel, dtype, out=out)


def dequantize_sum(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    numel: int,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """fp32 sum over k stacked inputs ([k, nbytes], [k, nblocks]) in index order; with
    ``accumulate=True`` returns ``out`` after ``out += sum``; with ``out`` only, writes into it."""
    return _call(
        "dequantize_sum",
        backend,
        _tensor_arg(q_stack, "q_stack"),
        q_stack,
        scales_stack,
        bits,
        block_size,
        numel,
        out=out,
        accumulate=accumulate,
    )


def dequantize_sum_requantize(
    q_stack: torch.Tensor,
    scales_stack: torch.Tensor,
    bits: int,
    block_size: int,
    backend: str | None = None,
    *,
    out_bits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dequantize + fp32 sum + quantize (to ``out_bits``, default ``bits``) over all
    nblocks*block_size elements: the intra-node hop of ZeRO++ 2-hop gradient reduction."""
    return _call(
        "dequantize_sum_requantize",
        backend,
        _tensor_arg(q_stack, "q_stack"),
        q_stack,
        scales_stack,
        bits,
        block_size,
        out_bits=out_bits,
    )


def quantize_reordered(
    x: torch.Tensor, bits: int, block_size: int, perm, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut ``x`` into len(perm) equal slices; output slot i holds quantized slice perm[i]."""
    return _call("quantize_reordered", backend, _tensor_arg(x, "x"), x, bits, block_size, perm)
