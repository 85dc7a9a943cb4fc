"""The checks of ``tools/gpu_check.py`` (one function per row of its table).

Each returns a :class:`Row`: ``PASS``, ``FAIL`` or ``SKIP`` (not applicable here, e.g. the network
plugin on CPU) and one line of detail. They run on every rank; the table merges the ranks' rows.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..zero_topo import kernels
from ..zero_topo.kernels import reference as R

TRITON_MIN = (3, 6)  # Triton before 3.6 flushes subnormal block scales to zero on NVIDIA (triton PR 8557)


@dataclass
class Row:
    check: str
    status: str  # PASS, FAIL or SKIP
    detail: str


def _version(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def triton_row(device: torch.device) -> Row:
    """The Triton version; on NVIDIA GPUs older than 3.6 fails (subnormal scales flushed to zero)."""
    try:
        import triton

        version = triton.__version__
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        if device.type == "cuda":
            return Row("triton", "FAIL", f"Triton does not import ({type(e).__name__}: {e}); the GPU kernels need it")
        return Row("triton", "SKIP", "not installed; CPU runs use cpu_fast / the reference kernels")
    nvidia = device.type == "cuda" and torch.version.hip is None
    if nvidia and _version(version) < TRITON_MIN:
        return Row(
            "triton",
            "FAIL",
            f"triton {version} flushes subnormal block scales to zero on NVIDIA "
            f"(triton PR 8557); install triton >= 3.6 (requirements.txt pins 3.7.1)",
        )
    where = "NVIDIA" if nvidia else ("ROCm" if device.type == "cuda" else "not used on CPU")
    return Row("triton", "PASS", f"triton {version} ({where})")


# ------------------------------------------------------------------------------ kernels
def special_input(n: int, dtype: torch.dtype, block: int, seed: int) -> torch.Tensor:
    """Random blocks of mixed magnitudes plus the cases a GPU kernel gets wrong first: all-zero
    and all -0.0 blocks, NaN/inf in a block, exact .5 ties (absmax 127: scale 1), subnormal
    scales (values ~1e-39: absmax / 127 is subnormal in fp32), huge values."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.logspace(-4, 2, 7)[torch.randint(0, 7, (n,), generator=g)]
    x = torch.randn(n, generator=g) * mags * 3.0
    specials = [float("nan"), float("inf"), -float("inf")]
    for b in range(-(-n // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        kind = b % 6
        if kind == 1:
            x[lo:hi] = 0.0 if b % 12 == 1 else -0.0
        elif kind == 2:
            x[lo + int(torch.randint(0, hi - lo, (1,), generator=g))] = specials[b % 3]
        elif kind == 3:
            x[lo] = 127.0
            x[lo + 1 : hi] = torch.arange(hi - lo - 1, dtype=torch.float32) % 254 - 126.5
        elif kind == 4:
            x[lo:hi] = x[lo:hi] * 1e-39
        elif kind == 5 and dtype != torch.float16:
            x[lo] = 3e38 if b % 2 else -3e38
    return x.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (NaNs need only be NaN in the same places)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    na, nb = a.isnan(), b.isnan()
    if not torch.equal(na, nb):
        return False
    iv = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a.view(iv)[~na], b.view(iv)[~nb])


def kernel_backend(device: torch.device) -> tuple[Optional[str], str]:
    """The backend the engine uses on ``device`` and why (None: only the reference is there)."""
    if device.type == "cuda":
        if kernels.triton_available():
            return "triton", "triton"
        return None, "Triton does not import: the engine would run the reference kernels on the GPU"
    if kernels.cpu_fast_available():
        return "cpu_fast", "cpu_fast"
    from ..zero_topo.kernels import cpu_fast

    return None, f"cpu_fast unavailable ({cpu_fast.unavailable_reason()}): the reference runs"


def kernels_row(device: torch.device, blocks: tuple[int, int], n: int = 1 << 16) -> Row:
    """Every kernel op on ``device`` against the reference on the host, bit for bit."""
    backend, name = kernel_backend(device)
    if backend is None:
        return Row("kernels", "FAIL" if device.type == "cuda" else "SKIP", name)
    bad, cases = [], 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for bits in (8, 4):
            for blk in sorted(set(blocks)):
                x = special_input(n, dtype, blk, seed=bits * 7 + blk)
                xd = x.to(device)
                tag = f"{str(dtype)[6:]}/int{bits}/B{blk}"
                q, s = kernels.quantize(xd, bits, blk, backend=backend)
                qr, sr = R.quantize(x, bits, blk)
                cases += 1
                if not (_same(q, qr) and _same(s, sr)):
                    bad.append(f"quantize {tag}")
                    continue
                for out in (torch.float32, dtype):
                    if not _same(
                        kernels.dequantize(q, s, bits, blk, n, dtype=out, backend=backend),
                        R.dequantize(qr, sr, bits, blk, n, out),
                    ):
                        bad.append(f"dequantize {tag}")
                k = 4
                perm = list(range(k))[::-1]
                qo, so = kernels.quantize_reordered(xd, bits, blk, perm, backend=backend)
                qro, sro = R.quantize_reordered(x, bits, blk, perm)
                if not (_same(qo, qro) and _same(so, sro)):
                    bad.append(f"quantize_reordered {tag}")
                qs, ss = qo.view(k, -1), so.view(k, -1)
                if not _same(
                    kernels.dequantize_sum(qs, ss, bits, blk, n // k, backend=backend),
                    R.dequantize_sum(qro.view(k, -1), sro.view(k, -1), bits, blk, n // k),
                ):
                    bad.append(f"dequantize_sum {tag}")
                a, b = kernels.dequantize_sum_requantize(qs, ss, bits, blk, backend=backend)
                ar, br = R.dequantize_sum_requantize(qro.view(k, -1), sro.view(k, -1), bits, blk)
                if not (_same(a, ar) and _same(b, br)):
                    bad.append(f"dequantize_sum_requantize {tag}")
    if bad:
        return Row(
            "kernels",
            "FAIL",
            f"{name} differs from the reference: {', '.join(bad[:4])}"
            + (f" (+{len(bad) - 4} more)" if len(bad) > 4 else ""),
        )
    return Row(
        "kernels",
        "PASS",
        f"{name} = reference bit for bit: 5 ops x {cases} cases (NaN/inf, +-0, ties, subnormal scales)",
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_speed_row(device: torch.device, numel: int, block: int, repeat: int = 3) -> Row:
    """Quantize + dequantize (INT8) of one unit of ``numel`` elements (a 20B layer: 453 M)."""
    backend, name = kernel_backend(device)
    backend = backend or "reference"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(numel, device=device).to(dtype)
    times = []
    for _ in range(repeat + 1):
        _sync(device)
        t0 = time.perf_counter()
        q, s = kernels.quantize(x, 8, block, backend=backend)
        kernels.dequantize(q, s, 8, block, numel, dtype=dtype, backend=backend)
        _sync(device)
        times.append(time.perf_counter() - t0)
    best = min(times[1:])  # the first call compiles
    gbs = numel * x.element_size() * 2 / best / 1e9
    return Row(
        "kernel speed",
        "PASS",
        f"{backend}: INT8 quantize + dequantize of {numel / 1e6:,.0f} M elements "
        f"({str(dtype)[6:]}, block {block}) {best * 1e3:,.1f} ms ({gbs:,.3g} GB/s)",
    )


# ------------------------------------------------------------------------------ network plugin
def warm_blas(device: torch.device) -> int:
    """Bytes the BLAS library's workspaces take on ``device`` once a matrix product has run forward
    (this thread's handle) and backward (autograd's device thread has a handle of its own). PyTorch
    takes them from its caching allocator, so a step's peak counts them unless they exist before it:
    32 MiB per handle on an H200 (seen 2026-11-27), a fixed cost that is no tensor of the engine."""
    before = torch.cuda.memory_allocated(device)
    a = torch.ones(16, 16, device=device, requires_grad=True)
    (a @ a).sum().backward()
    torch.cuda.synchronize(device)
    del a
    return max(0, torch.cuda.memory_allocated(device) - before)


def network_plugin_row(device: torch.device) -> Row:
    """RCCL/NCCL's network plugin loads (without one RCCL falls back to TCP sockets)."""
    if device.type != "cuda":
        return Row("network plugin", "SKIP", "n.a. on CPU (gloo over TCP)")
    if os.environ.get("NCCL_NET", "").lower() == "socket":
        return Row("network plugin", "FAIL", "NCCL_NET=Socket forces the TCP socket transport")
    names = []
    if os.environ.get("NCCL_NET_PLUGIN"):
        p = os.environ["NCCL_NET_PLUGIN"]
        names += [p, f"lib{p}.so", f"libnccl-net-{p}.so"]
    names += ["librccl-net.so", "libnccl-net.so"]
    errors = []
    for n in names:
        try:
            ctypes.CDLL(n)
            return Row(
                "network plugin",
                "PASS",
                f"{n} loads" + (f"; NCCL_NET={os.environ['NCCL_NET']}" if os.environ.get("NCCL_NET") else ""),
            )
        except OSError as e:
            errors.append(str(e).split(":")[-1].strip())
    if torch.version.hip is None and os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        return Row(
            "network plugin",
            "PASS",
            "no plugin; NCCL's own InfiniBand transport "
            f"({', '.join(sorted(os.listdir('/sys/class/infiniband'))[:4])})",
        )
    return Row(
        "network plugin",
        "FAIL",
        "no librccl-net.so / libnccl-net.so loads ("
        + "; ".join(errors[:2])
        + "): collectives between nodes would fall back to TCP sockets; load the aws-ofi plugin "
        "(docs/frontier.md §1 step 3)",
    )


# ------------------------------------------------------------------------------ collectives
class TracingDelays:
    """Wraps a Comm's collectives: a random per-rank delay before each is issued, and a record
    of each as issued ({"seq", "op", "group", "bytes", "dtype"}, the trace format of
    distributed.trace_collectives)."""

    OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")

    def __init__(self, comm, seed: int, max_delay_s: float) -> None:
        self.comm, self.trace = comm, []
        self.rng = random.Random(seed)
        self.max_delay_s = max_delay_s
        self._real = {op: getattr(comm, op) for op in self.OPS}
        for op in self.OPS:
            setattr(comm, op, self._wrap(op))

    def _wrap(self, op: str):
        real = self._real[op]

        def call(*args, **kw):
            # the buffer the collective moves, as distributed.trace_collectives records it: an
            # all-gather's output, a reduce-scatter's input, an all-to-all's or all-reduce's buffer
            t = args[0] if op in ("all_reduce", "all_gather") else args[1]
            group = args[1] if op == "all_reduce" else args[2]
            if group.size > 1:
                time.sleep(self.rng.random() * self.max_delay_s)
                self.trace.append(
                    {
                        "seq": len(self.trace),
                        "op": op,
                        "group": list(group.ranks),
                        "bytes": t.numel() * t.element_size(),
                        "dtype": str(t.dtype)[6:],
                    }
                )
            return real(*args, **kw)

        return call

    def restore(self) -> None:
        for op in self.OPS:
            setattr(self.comm, op, self._real[op])


def first_trace_problem(traces: list[list[dict]]) -> Optional[str]:
    """The first problem :mod:`zero_topo.trace` finds in the ranks' traces (the comparison of
    ``distributed.trace_collectives``), else :func:`compare_traces`'s; None when they agree."""
    try:
        from ..zero_topo.trace import compare_traces as compare
    except ImportError:
        return compare_traces(traces)
    problems = compare(dict(enumerate(traces)), len(traces))
    return problems[0] if problems else None


def compare_traces(traces: list[list[dict]]) -> Optional[str]:
    """None when every rank issued the same sequence of (op, group size, bytes, dtype) and the
    members of each group issued the same collectives on it; else the first difference."""
    key = lambda e: (e["op"], len(e["group"]), e["bytes"], e["dtype"])  # noqa: E731
    ref = [key(e) for e in traces[0]]
    for r, tr in enumerate(traces[1:], 1):
        mine = [key(e) for e in tr]
        if mine != ref:
            i = next((i for i, (a, b) in enumerate(zip(ref, mine)) if a != b), min(len(ref), len(mine)))
            return (
                f"rank {r}'s collective {i} is {mine[i] if i < len(mine) else 'missing'}, rank 0's "
                f"{ref[i] if i < len(ref) else 'missing'}"
            )
    per_group: dict[tuple, dict[int, list]] = {}
    for r, tr in enumerate(traces):
        for e in tr:
            per_group.setdefault(tuple(e["group"]), {}).setdefault(r, []).append(key(e))
    for g, by_rank in per_group.items():
        seqs = list(by_rank.values())
        if any(s != seqs[0] for s in seqs) or set(by_rank) != set(g):
            return f"the members of group {list(g)[:8]} issued different collectives on it"
    return None


def communicators_row(comm, groups, seed: int, max_delay_s: float, rounds: int = 3) -> tuple[Row, list[dict]]:
    """Every communicator type of the plan live at once: an async all-reduce on each group,
    issued in one program order with random per-rank delays, all in flight before any is waited
    for; each sum must be the sum of the group's ranks."""
    named = [(n, g) for n, g in vars(groups).items() if g is not None and g.size > 1]
    tracer = TracingDelays(comm, seed, max_delay_s)
    wrong = []
    try:
        for rnd in range(rounds):
            pending = []
            for name, g in named:
                t = torch.full((1024,), float(comm.rank + 1 + rnd), device=comm.device)
                pending.append((name, g, t, comm.all_reduce(t, g, async_op=True, account=False)))
            for name, g, t, w in pending:
                if w is not None:
                    w.wait()
                want = float(sum(r + 1 + rnd for r in g.ranks))
                if not bool((t == want).all()):
                    wrong.append(name)
    finally:
        tracer.restore()
    if wrong:
        return Row("communicators", "FAIL", f"wrong sums on {', '.join(sorted(set(wrong)))}"), tracer.trace
    sizes = ", ".join(f"{n} {g.size}" for n, g in named)
    return Row(
        "communicators",
        "PASS",
        f"{len(named)} live at once ({sizes}), {rounds} rounds, random delays <= {max_delay_s * 1e3:.0f} ms",
    ), tracer.trace


def shard_digests(engine) -> dict:
    """SHA-256 of every unit's primary shard and optimizer state, keyed by what a replica holds."""

    def h(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()

    out = {}
    for i, (u, master) in enumerate(zip(engine.units, engine.optimizer.params)):
        u.wait_publish()
        out[("primary", i, u.primary_range)] = h(u.primary)
        st = engine.optimizer.shard_state(i)
        out[("optimizer", i, u.optim_range)] = h(master) + h(st["exp_avg"]) + h(st["exp_avg_sq"])
    return out


def replicas_row(digests: list[dict]) -> Row:
    """Ranks holding the same shard (same unit, same range) hold the same bytes."""
    seen: dict[tuple, tuple[int, str]] = {}
    compared, bad = 0, []
    for r, d in enumerate(digests):
        for k, v in d.items():
            if k in seen:
                compared += 1
                if seen[k][1] != v:
                    bad.append(f"{k[0]} of unit {k[1]} on ranks {seen[k][0]} and {r}")
            else:
                seen[k] = (r, v)
    if bad:
        return Row("replicated shards", "FAIL", "differ: " + "; ".join(bad[:3]))
    return Row(
        "replicated shards",
        "PASS" if compared else "SKIP",
        f"{compared} replicated shard copies equal bit for bit" if compared else "no shard is replicated",
    )
