"""Time all-gather and reduce-scatter over every rank and fit the performance model's ring constants.

    sbatch slurm/frontier_collectives.sh                       # 48 Frontier nodes, 384 GCDs (RCCL)
    torchrun --nproc-per-node 4 tools/measure_collectives.py --sizes-mb 1,4,16   # any machine

Sizes are per rank, as in seed 004 §6.1.1: the output of an all-gather, the input of a
reduce-scatter. For each (collective, size): ``--warmup`` untimed calls, then ``--iters`` timed
ones; a call's time is the slowest rank's, the reported time the median over calls. Rank 0
prints time, algorithm and bus bandwidth per size, the least-squares fit of
``T = S(p-1)/p / beta + (p-1) * alpha`` per collective (megatron_topo.analysis.perf_sources.fit_ring) and,
when the ranks span several nodes, the ``--set system.latency_inter_node_us=...`` that feeds the
measured step cost to tools/predict_perf.py (docs/frontier.md §4). It writes
``OUT/collectives.json`` atomically (with ``"tool": "measure_collectives"``). Bad arguments print one
line on stderr and exit 2; so does an ``--out`` that is not a folder, is or lies inside a
checkpoint, an HF export or a run's log folder, or whose collectives.json is a link, a FIFO or a
file that is not an earlier result of this tool (megatron_topo.tool_outputs), checked by every rank
before anything is measured.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from megatron_topo.analysis.perf_sources import fit_ring
from megatron_topo.cli import OneLineParser, ascii_number, bounded, comma_items, fail, interruptible, path_arg
from megatron_topo.config import ConfigError, load_config
from megatron_topo.error_lines import clean, escaped
from megatron_topo.lifecycle import leave_rank
from megatron_topo.tool_outputs import OutputError, check_file, check_folder, write_result
from megatron_topo.topology import every_rank_finds, launcher_env
from megatron_topo.training import setup_runtime

OPS = ("all_gather", "reduce_scatter")
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # as zero_topo.comm
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MIB = 2**20
MAX_ITERS, MAX_WARMUP = 100_000, 10_000
TOOL = "measure_collectives"
RESULT = "collectives.json"
LEGACY = ("world_size", "backend", "rows", "fit")  # a result written before the "tool" field


def parse_args(argv=None):
    p = OneLineParser(description=__doc__.splitlines()[0], job_tool=True)
    p.add_argument("--sizes-mb", default="16,64,256,1024", help="comma-separated MB per rank")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: all_gather, reduce_scatter")
    p.add_argument("--iters", type=bounded(int, 1, MAX_ITERS), default=10, help="timed calls per size")
    p.add_argument("--warmup", type=bounded(int, 0, MAX_WARMUP), default=3, help="untimed calls first")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--system", type=path_arg, help="a YAML with a distributed: block (backend/device); default: auto")
    p.add_argument(
        "--out",
        type=path_arg,
        default="runs/collectives",
        help="directory for collectives.json (replaced only when it is an earlier result of this tool)",
    )
    return p.parse_args(argv)


def check(args) -> tuple[list[float], list[str]]:
    items = comma_items(args.sizes_mb, "--sizes-mb", "comma-separated numbers like 16,64,256", error=ConfigError)
    try:
        if not all(ascii_number(x) for x in items):
            raise ValueError
        sizes = [float(x) for x in items]
    except ValueError:
        raise ConfigError(f"--sizes-mb '{args.sizes_mb}': expected comma-separated numbers like 16,64,256") from None
    if not sizes or min(sizes) <= 0:
        raise ConfigError(f"--sizes-mb '{args.sizes_mb}': sizes must be positive")
    ops = comma_items(args.ops, "--ops", f"collectives from {', '.join(OPS)}", error=ConfigError)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ConfigError(f"--ops: '{','.join(bad) or args.ops}' is not valid; use {', '.join(OPS)}")
    if not (1 <= args.iters <= MAX_ITERS and 0 <= args.warmup <= MAX_WARMUP):  # main(argv) from code
        raise ConfigError(
            f"--iters {args.iters} / --warmup {args.warmup}: need iters in 1..{MAX_ITERS:,} and warmup in "
            f"0..{MAX_WARMUP:,}"
        )
    if max(sizes) > 1 << 20 or not all(math.isfinite(x) for x in sizes):
        raise ConfigError(f"--sizes-mb '{args.sizes_mb}': sizes must be finite and at most 1,048,576 MB")
    return sizes, ops


def time_op(op: str, numel: int, world: int, dtype, device, iters: int, warmup: int) -> list[float]:
    """Per-call times (s) of one collective on ``numel`` elements per rank (the slowest rank's)."""
    full = torch.ones(numel, dtype=dtype, device=device)
    part = torch.ones(numel // world, dtype=dtype, device=device)

    def call():
        if op == "all_gather":
            _all_gather(full, part)
        else:
            _reduce_scatter(part, full)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        call()
    sync()
    times = torch.zeros(iters, dtype=torch.float64, device=device)
    for i in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        sync()
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.cpu().tolist()


def measure(args) -> dict:
    with every_rank_finds():  # the same flags and --system file on every rank: rank 0 says it
        sizes, ops = check(args)
        cfg = load_config([args.system] if args.system else [], require=False)
    rt = setup_runtime(cfg)
    try:
        if not rt.distributed:
            raise ConfigError("one rank only: launch with torchrun or srun (e.g. slurm/frontier_collectives.sh)")
        world, dtype = rt.world_size, DTYPES[args.dtype]
        elem = torch.tensor([], dtype=dtype).element_size()
        rows = []
        for op in ops:
            for mb in sizes:
                numel = max(world, int(mb * MIB / elem) // world * world)
                t = statistics.median(time_op(op, numel, world, dtype, rt.device, args.iters, args.warmup))
                S = numel * elem
                rows.append(
                    {
                        "op": op,
                        "mb": mb,
                        "bytes": S,
                        "seconds": t,
                        "algbw_gbs": S / t / 1e9,
                        "busbw_gbs": S * (world - 1) / world / t / 1e9,
                    }
                )
        fits = {}
        for op in ops:
            pts = [(world, r["bytes"], r["seconds"]) for r in rows if r["op"] == op]
            fits[op] = fit_ring(pts) if len(pts) >= 2 else None
        return {
            "world_size": world,
            "nodes": rt.topo.num_nodes,
            "ranks_per_node": rt.topo.ranks_per_node,
            "backend": dist.get_backend(),
            "device": str(rt.device),
            "dtype": args.dtype,
            "iters": args.iters,
            "rows": rows,
            "fit": fits,
            "rank": rt.rank,
        }
    finally:
        if rt.heartbeat is not None:
            rt.heartbeat.stop()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def render(r: dict) -> str:
    lines = [
        f"{r['world_size']} ranks ({r['nodes']} node(s) x {r['ranks_per_node']}), {r['backend']} on "
        f"{r['device']}, {r['dtype']}, median of {r['iters']} calls (slowest rank each)",
        "",
        f"{'collective':<15} {'MB/rank':>8} {'ms':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}",
    ]
    for x in r["rows"]:
        lines.append(
            f"{x['op']:<15} {x['mb']:>8g} {x['seconds'] * 1e3:>10.3f} {x['algbw_gbs']:>11.2f} {x['busbw_gbs']:>11.2f}"
        )
    lines.append("")
    for op, f in r["fit"].items():
        if f is None:
            lines.append(f"{op}: one size only, no fit (pass two or more --sizes-mb)")
            continue
        lines.append(
            f"{op}: alpha {f['alpha_us']:.1f} us per ring step, beta {f['beta_gbs']:.1f} GB/s per rank "
            f"(worst residual {f['worst_rel_residual'] * 100:.0f} %)"
            + ("; alpha < 0: the sizes do not resolve the latency, add smaller ones" if f["alpha_us"] < 0 else "")
        )
    alphas = [f["alpha_us"] for f in r["fit"].values() if f and f["alpha_us"] > 0]
    if alphas and r["nodes"] > 1:
        lines.append(f"for tools/predict_perf.py: --set system.latency_inter_node_us={statistics.median(alphas):.1f}")
    return "\n".join(lines)


def check_out(args) -> None:
    """Refuse ``--out`` (OutputError) before anything is measured (megatron_topo.tool_outputs)."""
    check_folder(args.out, "--out", TOOL)
    check_file(os.path.join(args.out, RESULT), "--out", TOOL, LEGACY, inputs=[args.system or ""])


def write_json(r: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, RESULT)
    write_result(path, r, TOOL)
    return path


@interruptible
def main(argv=None) -> int:
    args = parse_args(argv)
    rc = _measure_and_report(args)
    try:
        several = launcher_env()["world_size"] > 1
    except ConfigError:  # a bad launcher variable: its line is printed already
        several = False
    if several:
        leave_rank(rc)  # one rank of a job: no interpreter teardown (lifecycle.leave_rank)
    return rc


def _rank() -> int:
    try:
        return launcher_env()["rank"]
    except ValueError:
        return 0


def _measure_and_report(args) -> int:
    try:
        check_out(args)  # every rank: on a shared file system all refuse at once, none waits for rank 0
    except OutputError as e:
        if _rank() == 0:
            print(clean(f"error: {e}"), file=sys.stderr)  # once per job
        return 2
    try:
        r = measure(args)
        if r["rank"] == 0:
            print(render(r))
            print(escaped(f"wrote {write_json(r, args.out)}"))
    except (ConfigError, ValueError, OSError) as e:
        return fail(e)  # error: lines, as every tool's
    return 0


if __name__ == "__main__":
    sys.exit(main())
