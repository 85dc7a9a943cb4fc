"""Throughput of the block-quantization kernels vs a plain ``copy_`` of the same bytes.

    python tools/bench_kernels.py [--sizes-mib 1 16 64] [--json OUT] [--device cpu|cuda]
        [--backends reference cpu_fast] [--rounds 3] [--threads N]

GB/s = logical fp32 bytes of the data the kernel covers / median time over ``--repeats`` runs
(after ``--warmup`` runs). "Logical bytes" is the size of the fp32 tensor: the input of quantize,
the output of dequantize, and for the k=8 fused ops the k stacked inputs each cover 1/k of it (an
all-to-all receive buffer of that size). The copy baseline copies that many fp32 bytes, so the
ratio column says how close a kernel is to a memory-bound copy on the same device; the copy is
re-timed right before every kernel (its own "copy GB/s" column) and the baseline row shows the
median of those. Kernels return freshly allocated outputs; on CPU first-touch page faults of
large new tensors are a visible part of their time, which the "clone" row (allocate + copy)
shows. Backends: on CPU the reference and cpu_fast (when it builds), on CUDA/ROCm the reference and
triton (when triton imports); ``--backends`` picks. Every kernel is timed in ``--rounds``
interleaved rounds (copy, then each backend in turn, so load drifts on a shared machine hit all
alike); a row's time is the median over rounds of the per-round medians, and its ratio is the
copy time over that (copy timed right before each kernel, median over the rounds). The last table
puts the backends side by side (``speedup`` = first backend's time / each other's).

``--json OUT`` (with ``"tool": "bench_kernels"``) is checked before anything is timed and replaces
only an earlier result of bench_kernels (megatron_topo.tool_outputs: never a link, a FIFO, a user's
file, or a file inside a checkpoint, an HF export or a run's log folder); written atomically.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import torch

from megatron_topo.cli import OneLineParser, bounded, interruptible, number, path_arg
from megatron_topo.error_lines import clean, escaped
from megatron_topo.tool_outputs import OutputError, check_file, write_result
from megatron_topo.zero_topo import kernels

TOOL = "bench_kernels"
LEGACY = ("device", "metric", "copy", "results")  # a result written before the "tool" field
K = 8  # stacked inputs for the fused sum kernels (ranks per node)


def _timer(device: torch.device):
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(fn, warmup: int, repeats: int) -> float:
        for _ in range(warmup):
            fn()
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return run


def cases(x: torch.Tensor, block_size: int):
    """(name, bits, callable(backend)) for every kernel, inputs prepared outside the timed region."""
    n = x.numel()
    out = []
    for bits in (8, 4):
        out.append(
            (f"quantize int{bits}", bits, lambda backend, b=bits: kernels.quantize(x, b, block_size, backend=backend))
        )
    for bits in (8, 4):
        q, s = kernels.quantize(x, bits, block_size, backend="reference")
        out.append(
            (
                f"dequantize int{bits}",
                bits,
                lambda backend, q=q, s=s, b=bits: kernels.dequantize(q, s, b, block_size, n, backend=backend),
            )
        )
    piece = n // K
    xs = x[: piece * K].view(K, piece)
    for bits in (8, 4):
        qs, ss = zip(*(kernels.quantize(xs[i], bits, block_size, backend="reference") for i in range(K)))
        q_stack, s_stack = torch.stack(qs), torch.stack(ss)
        acc = torch.zeros(piece, dtype=torch.float32, device=x.device)
        out.append(
            (
                f"dequantize_sum k={K} int{bits}",
                bits,
                lambda backend, q=q_stack, s=s_stack, b=bits, a=acc: kernels.dequantize_sum(
                    q, s, b, block_size, piece, out=a, accumulate=True, backend=backend
                ),
            )
        )
        out.append(
            (
                f"dequant_sum_requant k={K} int{bits}",
                bits,
                lambda backend, q=q_stack, s=s_stack, b=bits: kernels.dequantize_sum_requantize(
                    q, s, b, block_size, backend=backend
                ),
            )
        )
    perm = [(i * 3 + 1) % K for i in range(K)]  # any permutation of 8 slices (3 is odd)
    for bits in (8, 4):
        out.append(
            (
                f"quantize_reordered int{bits}",
                bits,
                lambda backend, b=bits: kernels.quantize_reordered(x, b, block_size, perm, backend=backend),
            )
        )
    return out


MAX_MIB = 16384  # 16 GiB per fp32 tensor: the input, its copy and the outputs fit an 80 GB GPU


@interruptible
def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes-mib",
        type=bounded(float, 0.0, MAX_MIB, lo_open=True, unit="MiB", why="several copies of each size are held"),
        nargs="+",
        default=[1, 16, 64],
        help=f"fp32 tensor sizes in MiB (default: 1 16 64; at most {MAX_MIB:,})",
    )
    ap.add_argument(
        "--json",
        type=path_arg,
        metavar="OUT",
        help="write the results as JSON to this path (a new file or an earlier result of bench_kernels)",
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--block-size", type=number(int), default=2048)
    # --repeats/--rounds: a benchmark runs as long as asked (no upper bound, docs/reliability.md)
    ap.add_argument("--repeats", type=bounded(int, 1), default=10)
    ap.add_argument("--warmup", type=bounded(int, 0, 10_000), default=2)
    ap.add_argument("--threads", type=bounded(int, 1, 4096), default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument(
        "--backends",
        nargs="+",
        choices=["reference", "cpu_fast", "triton"],
        default=None,
        help="default: reference + cpu_fast on CPU, reference + triton on CUDA",
    )
    ap.add_argument("--rounds", type=bounded(int, 1), default=3, help="interleaved rounds (median over them)")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="dtype of the quantized input (sizes stay fp32-logical bytes)",
    )
    args = ap.parse_args(argv)
    if args.json:
        try:
            check_file(args.json, "--json", TOOL, LEGACY)
        except OutputError as e:
            print(clean(f"error: {e}"), file=sys.stderr)
            return 2

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    try:
        kernels.num_blocks(0, args.block_size)
    except ValueError as e:
        ap.error(f"--block-size: {e}")
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = args.backends or ["reference"]
    if args.backends is None and device.type == "cuda" and kernels.triton_available():
        backends.append("triton")
    if args.backends is None and device.type == "cpu" and kernels.cpu_fast_available():
        backends.append("cpu_fast")
    if "cpu_fast" in backends and not kernels.cpu_fast_available():
        from megatron_topo.zero_topo.kernels import cpu_fast

        ap.error(f"cpu_fast unavailable: {cpu_fast.unavailable_reason()}")
    xdtype = getattr(torch, args.dtype)
    timed = _timer(device)
    unit = K * args.block_size  # sizes rounded down so 8 slices of whole blocks fit
    rows, copies = [], {}
    for mib in args.sizes_mib:
        n = max(unit, int(mib * 2**20 / 4) // unit * unit)
        nbytes = n * 4
        x = torch.randn(n, device=device)
        dst = torch.empty_like(x)
        xq = x.to(xdtype)
        copy_times = []
        for name, bits, fn in cases(xq, args.block_size):
            got = {b: ([], []) for b in backends}  # backend -> (kernel times, copy times)
            for _ in range(args.rounds):
                for backend in backends:
                    # the copy is timed right before each kernel, so the ratio stays meaningful
                    # when other work on the machine changes the available bandwidth
                    got[backend][1].append(timed(functools.partial(dst.copy_, x), args.warmup, args.repeats))
                    got[backend][0].append(timed(functools.partial(fn, backend), args.warmup, args.repeats))
            for backend in backends:
                t, t_copy = statistics.median(got[backend][0]), statistics.median(got[backend][1])
                copy_times.append(t_copy)
                rows.append(
                    {
                        "kernel": name,
                        "bits": bits,
                        "backend": backend,
                        "size_mib": nbytes / 2**20,
                        "ms": t * 1e3,
                        "gbps": nbytes / t / 1e9,
                        "copy_gbps": nbytes / t_copy / 1e9,
                        "ratio_vs_copy": t_copy / t,
                        "rounds_ms": [v * 1e3 for v in got[backend][0]],
                    }
                )
        t_copy = statistics.median(copy_times)
        t_clone = timed(x.clone, args.warmup, args.repeats)
        copies[mib] = {
            "size_mib": nbytes / 2**20,
            "ms": t_copy * 1e3,
            "gbps": nbytes / t_copy / 1e9,
            "clone_ms": t_clone * 1e3,
            "clone_gbps": nbytes / t_clone / 1e9,
        }
        del x, dst

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"block_size={args.block_size} input={args.dtype} repeats={args.repeats} "
        f"rounds={args.rounds} (median of medians) load average={load}"
    )
    hdr = f"{'kernel':<28} {'backend':<10} {'MiB':>7} {'ms':>9} {'GB/s':>8} {'copy GB/s':>10} {'ratio':>6}"
    print(hdr)
    print("-" * len(hdr))
    for c in copies.values():
        print(
            f"{'copy_ (baseline)':<28} {'torch':<10} {c['size_mib']:>7.1f} {c['ms']:>9.3f} "
            f"{c['gbps']:>8.2f} {c['gbps']:>10.2f} {1.0:>6.2f}"
        )
        print(
            f"{'clone (alloc + copy)':<28} {'torch':<10} {c['size_mib']:>7.1f} "
            f"{c['clone_ms']:>9.3f} {c['clone_gbps']:>8.2f} {c['gbps']:>10.2f} "
            f"{c['ms'] / c['clone_ms']:>6.2f}"
        )
        for r in (r for r in rows if r["size_mib"] == c["size_mib"]):
            print(
                f"{r['kernel']:<28} {r['backend']:<10} {r['size_mib']:>7.1f} {r['ms']:>9.3f} "
                f"{r['gbps']:>8.2f} {r['copy_gbps']:>10.2f} {r['ratio_vs_copy']:>6.2f}"
            )
    if len(backends) > 1:
        print()
        first = backends[0]
        hdr = (
            f"{'kernel':<28} {'MiB':>6} "
            + " ".join(f"{b + ' GB/s':>15}" for b in backends)
            + " "
            + " ".join(f"{b + ' ratio':>15}" for b in backends)
            + " "
            + " ".join(f"{'x ' + b:>13}" for b in backends[1:])
        )
        print(hdr)
        print("-" * len(hdr))
        for c in copies.values():
            names = list(dict.fromkeys(r["kernel"] for r in rows if r["size_mib"] == c["size_mib"]))
            for name in names:
                by = {r["backend"]: r for r in rows if r["size_mib"] == c["size_mib"] and r["kernel"] == name}
                print(
                    f"{name:<28} {c['size_mib']:>6.1f} "
                    + " ".join(f"{by[b]['gbps']:>15.2f}" for b in backends)
                    + " "
                    + " ".join(f"{by[b]['ratio_vs_copy']:>15.2f}" for b in backends)
                    + " "
                    + " ".join(f"{by[first]['ms'] / by[b]['ms']:>12.1f}x" for b in backends[1:])
                )
    if args.json:
        report = {
            "device": str(device),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "block_size": args.block_size,
            "input_dtype": args.dtype,
            "rounds": args.rounds,
            "load_average": load,
            "backends": backends,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "k": K,
            "metric": "logical fp32 bytes / median seconds",
            "copy": list(copies.values()),
            "results": rows,
        }
        if device.type == "cuda":
            report["gpu"] = torch.cuda.get_device_name(device)
        try:
            write_result(args.json, report, TOOL, makedirs=False)
        except OSError as e:
            print(clean(f"error: --json {args.json}: {e.strerror or e}; nothing written"), file=sys.stderr)
            return 1
        print(escaped(f"wrote {args.json}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
