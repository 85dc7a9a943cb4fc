"""PyTorch FSDP2 baseline: the same GPT-NeoX, data, batch, optimizer and schedule as train.py,
sharded by ``torch.distributed.fsdp.fully_shard`` instead of the zero_topo engine.

    torchrun --nproc_per_node 8 tools/fsdp_baseline.py CONFIG.yml [MORE.yml ...] \\
        [--mode full|hsdp] [--set key=value ...]

``--mode full``: one 1-D mesh over the world (ZeRO-3 equivalent). ``--mode hsdp``: a 2-D mesh
(replicate across nodes x shard inside the node, ranks node-major), gradients reduce-scattered in
the node every micro-batch and all-reduced across nodes only on the last micro-batch of a step
(``set_requires_all_reduce``), as MiCS/our ``mics`` preset does. Each unit of
``GPTNeoX.shard_units()`` (embedding, every layer, head) is one FSDP module, the last one kept
unsharded after forward (as the engine keeps its last unit). Mixed precision: parameters are
gathered and gradients reduced in the run's ``precision`` (bf16/fp16), the sharded fp32
parameters are AdamW's masters. Works on CPU with gloo (checked with torch 2.13).

Writes ``{log_dir}/metrics.jsonl`` with the trainer's keys; ``comm_bytes_*`` count every
collective FSDP issues with the same ring formulas and level attribution as zero_topo's
``Comm`` (scalar norm all-reduces go to ``comm_bytes_control``). log_dir is checked as train.py's
(config.check_run_outputs: no checkpoint, HF export or other save folder, no linked metrics.jsonl)
and an earlier run's metrics.jsonl there is moved aside to ``metrics.jsonl.N``, never appended to.

It trains only: a key of train.py's config that it does not implement (load, save and its keys,
finetune_from, auto_resume, an evaluation a step reaches, valid/test_data_paths, tensorboard_dir,
profiling, trace_collectives, the zero_topo plan, a system or zero_optimization block, fp16, which
train.py runs with a loss scaler) is refused in one line before any rank starts (``fsdp_keys``),
never silently ignored. One process without launcher variables runs as one rank (a gloo group of
its own), as train.py does. OMP_NUM_THREADS (default 1) must be a whole number 1..4096. Ctrl-C:
``error: interrupted; ...`` from rank 0, exit 130. A data error (every rank reads the same data) is
rank 0's one line, exit 2; a rank whose collective fails because another rank left exits 1, rank 0
saying so in one line.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from megatron_topo import metrics as M
from megatron_topo.cli import OneLineParser, fail
from megatron_topo.commands.fsdp_env import omp_threads, quiet_rank
from megatron_topo.commands.fsdp_keys import refusal, unimplemented
from megatron_topo.config import ConfigError, check_run_outputs, load_config
from megatron_topo.config.output import note_lines
from megatron_topo.data.errors import DataError
from megatron_topo.lifecycle import leave_rank
from megatron_topo.model import build_model
from megatron_topo.topology import JobWideError, Topology, launcher_env, topology_from_config
from megatron_topo.training import Batches, learning_rate, loss_fn, seed_everything
from megatron_topo.zero_topo.volumes import ring_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class CommCounter:
    """Wraps torch.distributed's collectives (FSDP2 calls them through the module) and charges
    the bytes this rank sends to the widest link level of the group (``zero_topo.volumes.ring_bytes``,
    docs/design.md §4.8)."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.bytes = {"intra_gpu": 0, "intra_node": 0, "inter_node": 0, "control": 0}
        self._levels: dict = {}
        self._orig = {}

    def level(self, group) -> tuple[str, int]:
        key = id(group)
        if key not in self._levels:
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            self._levels[key] = (self.topo.level(ranks), len(ranks))
        return self._levels[key]

    def _charge(self, group, nbytes: int):
        lvl, d = self.level(group)
        if d > 1:
            self.bytes["control" if nbytes <= 64 else lvl] += int(nbytes)

    def install(self):
        c = self
        o = self._orig = {
            n: getattr(dist, n)
            for n in ("all_gather_single", "reduce_scatter_single", "all_reduce", "all_to_all_single")
        }

        def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
            d = c.level(group)[1]
            c._charge(group, ring_bytes("all_gather", input_tensor.numel() * input_tensor.element_size() * d, d))
            return o["all_gather_single"](output_tensor, input_tensor, group=group, async_op=async_op)

        def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
            d = c.level(group)[1]
            c._charge(group, ring_bytes("reduce_scatter", input.numel() * input.element_size(), d))
            return o["reduce_scatter_single"](output, input, op=op, group=group, async_op=async_op)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            d = c.level(group)[1]
            nb = tensor.numel() * tensor.element_size()
            c._charge(group, ring_bytes("all_reduce", nb, d) if nb > 64 else nb)
            return o["all_reduce"](tensor, op=op, group=group, async_op=async_op)

        def all_to_all_single(
            output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
        ):
            d = c.level(group)[1]
            c._charge(group, ring_bytes("all_to_all", input.numel() * input.element_size(), d))
            return o["all_to_all_single"](
                output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
            )

        for name, fn in (
            ("all_gather_single", all_gather_single),
            ("reduce_scatter_single", reduce_scatter_single),
            ("all_reduce", all_reduce),
            ("all_to_all_single", all_to_all_single),
        ):
            setattr(dist, name, fn)
        return self

    def reset(self) -> dict:
        out = dict(self.bytes)
        for k in self.bytes:
            self.bytes[k] = 0
        return out


def shard_model(model, topo: Topology, mode: str, precision: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mode == "full":
        mesh = init_device_mesh("cpu", (topo.world_size,), mesh_dim_names=("shard",))
    elif mode == "hsdp":
        # node-major ranks: mesh[i] = node i's ranks -> shard inside, replicate across nodes
        mesh = init_device_mesh("cpu", (topo.num_nodes, topo.ranks_per_node), mesh_dim_names=("replicate", "shard"))
    else:
        raise ConfigError(f"--mode '{mode}' is not valid; use full or hsdp")
    dt = DTYPES[precision]
    mp = MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=dt) if dt != torch.float32 else MixedPrecisionPolicy()
    units = model.shard_units()
    for i, u in enumerate(units):
        fully_shard(u, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(units) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, mesh


def param_groups(model, weight_decay: float):
    decay, no_decay = [], []
    for unit in model.shard_units():
        for name, p in unit.named_parameters():
            (decay if p.ndim >= 2 and "norm" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def main(argv=None) -> int:
    got = []  # SIGINT received: a collective the other ranks left while this rank waited fails after it

    def on_sigint(signum, frame):
        got.append(signum)
        raise KeyboardInterrupt

    prev = signal.getsignal(signal.SIGINT)
    if prev is signal.default_int_handler:  # Python's handler (a terminal); an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, on_sigint)
    try:
        return _main(argv)
    except DataError as e:  # every rank reads the same data and reaches the same verdict: rank 0 says it
        return _leave(2 if quiet_rank() else fail(e))
    except OSError as e:  # an output folder or file of this rank, found bad once the run started
        return _leave(fail(e))
    except Exception as e:
        group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if not got and group:
            _await_sigint(got)  # a Ctrl-C that reached another rank first ends this rank's collective
        if got:
            return _interrupted()
        if group and any(m in str(e) for m in PEER_LEFT):  # another rank left; its own line says why
            if not quiet_rank():  # rank 0 says so once; the launcher reports a rank that died without a word
                print(
                    f"error: another rank left the job mid-run ({_peer_reason(e)}); its output says why",
                    file=sys.stderr,
                )
            return _leave(1)
        raise
    except KeyboardInterrupt:  # Ctrl-C: one line from rank 0 (a terminal gives every rank the SIGINT), exit 130
        return _interrupted()
    finally:
        if prev is signal.default_int_handler:
            signal.signal(signal.SIGINT, prev)


# how gloo reports a collective whose peer process is gone
PEER_LEFT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _peer_reason(e: BaseException) -> str:
    return next(f"gloo: {m}" for m in PEER_LEFT if m in str(e))


def _folder_problem(key: str, path: str):
    """A ConfigError when a part of ``path`` (an output folder of key ``key``) exists but is not a folder."""
    p = os.path.abspath(path)
    while p and not os.path.lexists(p):
        p = os.path.dirname(p)
    if p and not os.path.isdir(p):
        where = f"{key} {path}" if p == os.path.abspath(path) else f"{key} {path}: {os.path.relpath(p)}"
        return ConfigError(f"{where} exists and is not a directory; point {key} at a directory")
    return None


def _await_sigint(got: list, seconds: float = 2.0) -> None:
    """A rank whose collective failed because a peer left: wait up to ``seconds`` for the SIGINT that a
    Ctrl-C gives every rank of the job (delivered to the ranks one after another), so that rank
    leaves as interrupted, without the collective's traceback; another failure is raised as before."""
    end = time.monotonic() + seconds
    try:
        while not got and time.monotonic() < end:
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass


def _interrupted() -> int:
    if not quiet_rank():
        print("error: interrupted; metrics.jsonl holds the steps logged so far", file=sys.stderr)
    return _leave(130)


def _leave(rc: int) -> int:
    """End the run: a rank of several leaves through lifecycle.leave_rank (no interpreter teardown);
    one process destroys its own group and returns ``rc``."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            leave_rank(rc)
        dist.destroy_process_group()
    return rc


def _main(argv=None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, job_tool=True)
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--mode", default="full", choices=("full", "hsdp"))
    args = ap.parse_args(argv)
    try:  # everything that can refuse the run, before any rank joins a process group
        cfg = load_config(args.configs, args.overrides)
        keys = unimplemented(cfg)  # a key it would ignore: refused, never a silent fresh start
        if keys:
            raise ConfigError(refusal(keys))
        for key, path in (("log_dir", cfg.logging.log_dir), ("data_cache_dir", cfg.data.data_cache_dir)):
            problem = path and _folder_problem(key, path)
            if problem:
                raise problem
        check_run_outputs(cfg)  # log_dir and its metrics.jsonl: as train.py's, not over others' files
        env = launcher_env()
        world, rank = env["world_size"], env["rank"]
        topo = topology_from_config(cfg.topology, world, env["local_world_size"])
        threads = omp_threads()
        if world > 1:
            for var in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(var):
                    raise JobWideError(f"{var} is not set; launch with torchrun, srun (see slurm/) or set it")
    except ConfigError as e:
        # every rank reaches the same verdict from the same files and environment: rank 0 says it
        return 2 if quiet_rank() else fail(e)
    torch.set_num_threads(threads)
    if rank == 0:
        for line in note_lines(cfg):  # train.py's start-of-run notes (keys set but without effect)
            print(line, file=sys.stderr)
    timeout = datetime.timedelta(seconds=cfg.distributed.collective_timeout_s)
    if not dist.is_initialized():
        if world > 1:
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        else:  # one process without a launcher runs as one rank, as train.py does: a group of its own
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    t, lg = cfg.train, cfg.logging
    log = print if rank == 0 else (lambda *a, **k: None)
    seed_everything(t.seed)
    model = build_model(cfg.model, device="cpu", seed=t.seed)
    nparams = sum(p.numel() for p in model.parameters())
    counter = CommCounter(topo).install()
    model, mesh = shard_model(model, topo, args.mode, cfg.precision)
    prm = t.optimizer.params
    opt = torch.optim.AdamW(
        param_groups(model, t.weight_decay), lr=prm.lr, betas=tuple(prm.betas), eps=prm.eps, foreach=True
    )
    from megatron_topo.data import build_datasets

    gb = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * world
    train_ds, _, _ = build_datasets(
        cfg.data,
        seq_length=cfg.model.seq_length,
        seed=t.seed,
        num_samples=(t.train_iters * gb, 0, 0),
        vocab_size=cfg.model.vocab_size,
        is_builder=rank == 0,
        barrier=dist.barrier if world > 1 else None,
    )
    batches = Batches(
        train_ds, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, world, rank, torch.device("cpu")
    )
    # fresh: a new run (it never resumes); an earlier run's metrics.jsonl is moved aside, not appended to
    writer = M.MetricsWriter(lg.log_dir, enabled=rank == 0, tensorboard=False, fresh=True)
    log(f"topology: {topo.describe()}; FSDP2 fully_shard mode={args.mode} mesh={tuple(mesh.shape)}")
    log(f"model: {nparams:,} parameters; precision {cfg.precision}; global batch {gb} x {cfg.model.seq_length} tokens")
    consumed, step = 0, 0
    counter.reset()
    accum = t.gradient_accumulation_steps
    while step < t.train_iters:
        t0 = time.perf_counter()
        losses = []
        for m in range(accum):
            last = m == accum - 1
            if args.mode == "hsdp":
                model.set_requires_all_reduce(last)
            x, y = batches.micro(consumed, m)
            loss = loss_fn(model(x), y)
            losses.append(loss.detach())
            (loss / accum).backward()
        lr = learning_rate(cfg, step + 1)
        for g in opt.param_groups:
            g["lr"] = lr
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.gradient_clipping or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        opt.zero_grad(set_to_none=True)
        consumed += gb
        step += 1
        comm = counter.reset()
        vec = torch.tensor(
            [
                torch.stack(losses).float().mean().item(),
                comm["intra_gpu"],
                comm["intra_node"],
                comm["inter_node"],
                comm["control"],
            ],
            dtype=torch.float64,
        )
        if world > 1:
            counter._orig["all_reduce"](vec)
        counter.reset()
        dt = time.perf_counter() - t0  # wall clock with the per-step log reduction, as the trainer's
        if step % lg.log_interval == 0 or step == t.train_iters:
            writer.log(
                step,
                {
                    "loss": vec[0].item() / world,
                    "lr": lr,
                    "grad_norm": float(norm),
                    "step_time_s": dt,
                    "samples_per_sec": gb / dt,
                    "tokens_per_sec": gb * cfg.model.seq_length / dt,
                    "peak_mem_bytes": M.peak_memory_bytes("cpu"),
                    "comm_bytes_intra_gpu": int(vec[1]),
                    "comm_bytes_intra_node": int(vec[2]),
                    "comm_bytes_inter_node": int(vec[3]),
                    "comm_bytes_control": int(vec[4]),
                },
            )
            log(f"step {step}: loss {vec[0].item() / world:.4f} step_time {dt:.3f}s")
    writer.close()
    log(f"done: step {step}, metrics: {os.path.join(lg.log_dir, 'metrics.jsonl')}")
    rc = 0 if all(math.isfinite(float(x)) for x in [vec[0]]) else 1
    return _leave(rc)


if __name__ == "__main__":
    sys.exit(main())
