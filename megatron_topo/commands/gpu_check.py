"""The one-node check to run before a big job (``tools/gpu_check.py``; ``slurm/frontier_check.sh``).

On every GPU of the node (one rank per GPU/GCD, started by srun or torchrun), with the job's own
config files:

    srun -N1 -n8 ... python tools/gpu_check.py configs/20B.yml configs/topo.yml configs/frontier.yml
    python tools/gpu_check.py configs/tiny.yml configs/topo.yml configs/local_cpu.yml --spawn 8 --small

it checks, and prints as one table (exit status 1 on any FAIL):

- ``triton``: the version; on NVIDIA before 3.6 fails (subnormal block scales flushed to zero);
- ``kernels``: the device's quantization kernels (Triton on GPUs, cpu_fast on CPUs) against the
  reference bit for bit, with NaN/inf, +-0, exact ties and subnormal scales;
- ``kernel speed``: INT8 quantize + dequantize of one 20B-sized unit (a layer, 453 M elements);
- ``network plugin``: RCCL/NCCL's network plugin loads (not the socket fallback; n.a. on CPU);
- ``communicators``: every communicator type of the plan live at once, random per-rank delays;
- ``collective order``: one training step of 20B-sized layers (``--layers``) with the job's plan,
  random per-rank delays before every collective: every rank issued the same sequence;
- ``replicated shards``: after the step, every copy of a shard equal bit for bit;
- ``memory``: the device memory the step used against the dry run's projection and the
  preflight's estimate; the context, communicator buffers and fragmentation against
  ``system.memory_reserve_gib``.

A check that does not finish within ``--timeout`` seconds is reported as a hang (the watchdog
prints the table so far and exits 1), not waited out. ``--small`` shrinks the layers for a CPU run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from ..cli import OneLineParser, fail, interruptible, number, path_arg
from ..config import ConfigError
from .gpu_check_memory import dry_run_projection, memory_row

SMALL = {
    "hidden_size": 256,
    "num_attention_heads": 8,
    "seq_length": 128,
    "max_position_embeddings": 128,
    "vocab_size": 1024,
    "train_micro_batch_size_per_gpu": 1,
}
LAYER_20B = 12 * 6144**2 + 13 * 6144  # parameters of one GPT-NeoX-20B layer: the unit the kernels are timed on


def parse_args(argv=None):
    p = OneLineParser(prog="gpu_check.py", description=__doc__.splitlines()[0], job_tool=True)
    p.add_argument("configs", type=path_arg, nargs="+", help="the job's config files (model, preset, system)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--layers", type=number(int), default=2, help="transformer layers of the training-step check")
    p.add_argument("--small", action="store_true", help="small layers and kernels (a CPU run)")
    p.add_argument("--timeout", type=number(float), default=300.0, help="seconds a check may take before it is a hang")
    p.add_argument("--max-delay-ms", type=number(float), default=20.0, help="random delay before each collective")
    p.add_argument("--spawn", type=number(int), default=0, metavar="N", help="start N local ranks (CPU, gloo)")
    p.add_argument("--no-dry-run", action="store_true", help="skip the dry run's projection (memory row)")
    args = p.parse_args(argv)
    import math

    if not 0 <= args.spawn <= MAX_SPAWN:
        p.error(f"--spawn {args.spawn}: must lie in 0..{MAX_SPAWN} (local CPU ranks; 0: the launcher's ranks)")
    if not 1 <= args.layers <= 4096:
        p.error(f"--layers {args.layers}: must lie in 1..4096 (num_layers' bound)")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= 86400):
        p.error(f"--timeout {args.timeout}: must lie in (0, 86400] seconds")
    if not (math.isfinite(args.max_delay_ms) and 0 <= args.max_delay_ms <= 60_000):
        p.error(f"--max-delay-ms {args.max_delay_ms}: must lie in [0, 60000]")
    return args


MAX_SPAWN = 64  # processes started on this machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, argv: list[str]) -> int:
    """Run this check as ``args.spawn`` local ranks; rank 0's table is the output."""
    port = str(_free_port())
    rest = [
        a
        for i, a in enumerate(argv)
        if a != "--spawn" and (i == 0 or argv[i - 1] != "--spawn") and not a.startswith("--spawn=")
    ]
    procs = []
    for r in range(args.spawn):
        env = {
            **os.environ,
            "RANK": str(r),
            "WORLD_SIZE": str(args.spawn),
            "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(args.spawn),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "megatron_topo.commands.gpu_check", *rest],
                env=env,
                stdout=None if r == 0 else subprocess.DEVNULL,
            )
        )
    deadline = time.monotonic() + args.timeout * 8
    codes = []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(1)
    except KeyboardInterrupt:  # Ctrl-C reached the local ranks too (one process group): rank 0 says it, once
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        return 130
    return max(codes)


class Watchdog:
    """Reports a check that does not finish in time as a hang and ends the rank (exit 1)."""

    def __init__(self, rank: int, timeout: float, rows: list, render) -> None:
        self.rank, self.timeout, self.rows, self.render = rank, timeout, rows, render
        self._timer: Optional[threading.Timer] = None

    def start(self, check: str) -> None:
        self.stop()
        self._timer = threading.Timer(self.timeout, self._fire, args=(check,))
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self, check: str) -> None:
        from .gpu_check_cases import Row

        row = Row(check, "FAIL", f"did not finish within {self.timeout:g} s on rank {self.rank}: a hang")
        if self.rank == 0:
            print(self.render([*self.rows, row]), flush=True)
        print(
            f"error: rank {self.rank}: {check} did not finish within {self.timeout:g} s (a hang)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def render(rows) -> str:
    w = max([len(r.check) for r in rows] + [5])
    lines = [f"{'check':<{w}}  {'result':<6}  detail"]
    lines += [f"{r.check:<{w}}  {r.status:<6}  {r.detail}" for r in rows]
    failed = [r.check for r in rows if r.status == "FAIL"]
    lines.append(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return "\n".join(lines)


@interruptible(preload=("torch",))
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.spawn:
        return spawn(args, argv)
    try:
        rc = run_rank(args)
    except ConfigError as e:
        rc = fail(e)
    if _one_rank_of_a_job():
        from ..lifecycle import leave_rank

        leave_rank(rc)  # one rank of a job: no interpreter teardown (lifecycle.leave_rank)
    return rc


def _one_rank_of_a_job() -> bool:
    from ..topology import launcher_env

    try:
        return launcher_env()["world_size"] > 1
    except ConfigError:
        return False


def run_rank(args) -> int:
    import torch.distributed as dist

    from ..config import load_config
    from ..topology import every_rank_finds
    from ..training.runtime import setup_runtime

    sets = [f"num_layers={args.layers}", *args.set]
    if args.small:
        sets = [f"{k}={v}" for k, v in SMALL.items()] + sets
    with every_rank_finds():  # the same files and --set options on every rank: rank 0 says it
        cfg = load_config(args.configs, sets)
    rt = setup_runtime(cfg)
    try:
        return _checks(args, cfg, sets, rt)
    finally:
        if rt.heartbeat is not None:
            rt.heartbeat.stop()
        if rt.distributed and dist.is_initialized():
            dist.destroy_process_group()


def _checks(args, cfg, sets, rt) -> int:
    import torch
    import torch.distributed as dist

    from .. import preflight
    from ..analysis import autoplan
    from ..training import build_engine, loss_fn
    from ..training.runtime import seed_everything
    from ..zero_topo import memory
    from . import gpu_check_cases as C

    seed_everything(cfg.train.seed)
    rows: list = []
    dog = Watchdog(rt.rank, args.timeout, rows, render)

    def run(name, fn):
        dog.start(name)
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed row, not a traceback
            out = C.Row(name, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        finally:  # also on KeyboardInterrupt/SystemExit: an armed timer would later end the process
            dog.stop()
        return out

    dev = rt.device
    if dev.type == "cpu" and not args.small and rt.rank == 0:
        print(
            "note: full-size checks on CPU (a 453 M-element kernel unit, 20B-sized layers) take a minute or "
            "more; --small shrinks them for a CPU run",
            file=sys.stderr,
            flush=True,
        )
    rows.append(run("triton", lambda: C.triton_row(dev)))
    blocks = (cfg.zero_topo.quant_block_size, cfg.zero_topo.grad_quant_block_size)
    rows.append(run("kernels", lambda: C.kernels_row(dev, blocks, n=1 << 14 if args.small else 1 << 20)))
    numel = (1 << 20) if args.small else LAYER_20B
    rows.append(run("kernel speed", lambda: C.kernel_speed_row(dev, numel, cfg.zero_topo.quant_block_size)))
    rows.append(run("network plugin", lambda: C.network_plugin_row(dev)))

    plan, _ = autoplan.resolve(cfg, rt.topo)
    projection = None
    if rt.rank == 0 and not args.no_dry_run:
        try:
            projection = dry_run_projection(args.configs, sets, rt.world_size, rt.rank)
        except Exception as e:  # noqa: BLE001 - reported in the memory row
            projection = {"error": str(e)}
    libraries = 0
    if dev.type == "cuda":  # the kernel checks' blocks must not count as the step's, nor as overhead
        torch.cuda.empty_cache()
        libraries = C.warm_blas(dev)  # cuBLAS/hipBLAS workspaces: the libraries', not the step's tensors
        torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    eng = build_engine(cfg, rt, plan)
    comm_trace: list = []

    def communicators():
        row, tr = C.communicators_row(eng.comm, eng.groups, cfg.train.seed * 1000 + rt.rank, args.max_delay_ms / 1e3)
        comm_trace.extend(tr)
        return row

    rows.append(run("communicators", communicators))

    step_trace: list = []

    def train_step():
        tracer = C.TracingDelays(eng.comm, cfg.train.seed * 7919 + rt.rank, args.max_delay_ms / 1e3)
        try:
            accum = min(cfg.train.gradient_accumulation_steps, 2)
            mb, seq = cfg.train.train_micro_batch_size_per_gpu, cfg.model.seq_length
            g = torch.Generator().manual_seed(cfg.train.seed + rt.rank)
            for m in range(accum):
                x = torch.randint(0, cfg.model.vocab_size, (mb, seq + 1), generator=g).to(dev)
                loss = loss_fn(eng(x[:, :-1]), x[:, 1:])
                eng.backward(loss / accum, last_micro_batch=m == accum - 1)
            stats = eng.step(cfg.train.optimizer.params.lr)
            for u in eng.units:
                u.wait_publish()
        finally:
            tracer.restore()
        step_trace.extend(tracer.trace)
        return C.Row(
            "collective order",
            "PASS",
            f"one step ({accum} micro-batches, {args.layers} layers of "
            f"hidden {cfg.model.hidden_size}, plan {plan.preset}): "
            f"{len(tracer.trace)} collectives; loss scale "
            f"{stats['loss_scale']:g}, grad norm {stats['grad_norm']:.3g}",
        )

    step_row = run("collective order", train_step)

    # agreement: every rank's rows, traces and shard digests, compared on rank 0
    digests = C.shard_digests(eng) if step_row.status == "PASS" else {}
    mine = {"rows": rows + [step_row], "comm": comm_trace, "step": step_trace, "digests": digests}
    if dev.type == "cuda":
        mine["memory"] = {
            "peak": torch.cuda.max_memory_allocated(dev) - base,
            "libraries": libraries,
            "reserved": torch.cuda.max_memory_reserved(dev),
            "allocated": torch.cuda.max_memory_allocated(dev),
            "used": (lambda f, t: t - f)(*torch.cuda.mem_get_info(dev)),
        }
    everyone = [None] * rt.world_size
    dog.start("agreement")
    try:
        if rt.distributed:
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
    finally:
        dog.stop()
    if rt.rank != 0:
        if rt.distributed:
            dist.barrier()
        return 0
    merged = []
    for i, row in enumerate(mine["rows"]):
        worst = next((e["rows"][i] for e in everyone if e["rows"][i].status == "FAIL"), row)
        if worst is not row:
            r = next(k for k, e in enumerate(everyone) if e["rows"][i] is worst)
            worst = C.Row(row.check, "FAIL", f"rank {r}: {worst.detail}")
        merged.append(worst)
    comm_row = merged[4]
    why = C.first_trace_problem([e["comm"] for e in everyone])
    if comm_row.status == "PASS" and why:
        merged[4] = C.Row("communicators", "FAIL", f"traces differ: {why}")
    order = merged[5]
    if order.status == "PASS":
        why = C.first_trace_problem([e["step"] for e in everyone])
        if why:
            merged[5] = C.Row(
                "collective order", "FAIL", f"ranks issued different collectives: {why} (NCCL/RCCL would hang)"
            )
        merged.append(C.replicas_row([e["digests"] for e in everyone]))
    else:
        merged.append(C.Row("replicated shards", "SKIP", "the training step failed"))
    merged.append(memory_row(everyone, projection, cfg, plan, rt, preflight, memory))
    print(render(merged), flush=True)
    if rt.distributed:
        dist.barrier()
    return 1 if any(r.status == "FAIL" for r in merged) else 0


if __name__ == "__main__":
    sys.exit(main())
