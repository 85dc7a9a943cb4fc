"""Train a GPT-NeoX model with the zero_topo engine.

    python train.py CONFIG.yml [MORE.yml ...] [--set dotted.key=value ...]
    python train.py --list-keys        # every config key: type, default, valid values, doc

Launched directly (one process), by torchrun, or by srun (see slurm/).
"""

from __future__ import annotations

import argparse
import os
import sys

from megatron_topo.cli import OneLineParser, interruptible, leave_to_rank_0, number, other_rank_of_job, path_arg
from megatron_topo.error_lines import clean, emit, escaped, problem_lines


@interruptible(preload=("torch",))
def main(argv=None) -> int:
    if "--list-keys" in (sys.argv[1:] if argv is None else argv):
        from megatron_topo.config import describe_keys

        print(describe_keys())
        return 0
    ap = OneLineParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage_line="python train.py CONFIG.yml [MORE.yml ...] [--set KEY=VALUE ...]",
        job_tool=True,
    )
    ap.add_argument("configs", type=path_arg, nargs="+", help="YAML files merged in order")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train_iters=10 --set zero_topo.preset=zero3",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="run one step's real engine code as one rank on meta tensors and the fake process "
        "group (no data, no GPU): prints the config, plan, traffic and memory; last line JSON",
    )
    ap.add_argument(
        "--world-size",
        type=number(int),
        default=None,
        help="with --dry-run: the world to emulate, 1..131,072 (default: the launcher's)",
    )
    ap.add_argument(
        "--rank", type=number(int), default=None, help="with --dry-run: the rank to be (default: the launcher's)"
    )
    args = ap.parse_args(argv)
    if (args.world_size is not None or args.rank is not None) and not args.dry_run:
        ap.error("--world-size and --rank go with --dry-run")
    if args.dry_run:
        return dry_run(args)

    # stop signals are kept from here on: one that arrives while the run starts up stops it before
    # its first step (lifecycle.StopSignals); srun_task.sh ignores SIGUSR1/SIGUSR2 until this point
    from megatron_topo.lifecycle import StopSignals

    signals = StopSignals().install()
    try:
        rc = _train(args, signals)
    finally:
        signals.restore()
    if rc != 0 and _distributed():
        # a refused or failed distributed run leaves at once, its line printed and its lock released:
        # the interpreter's teardown of a live gloo/NCCL process group can abort the process
        # ("terminate called without an active exception", exit -6 instead of the run's status)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if _distributed():
        # a finished run destroys its process groups while the interpreter is fully alive: left to
        # the interpreter's teardown, gloo's worker threads can still hold tensors and abort the
        # process (SIGABRT, "terminate called without an active exception", exit -6 after "done:");
        # NCCL warns that the group was never destroyed
        import torch.distributed as dist

        dist.destroy_process_group()
        # and the process leaves without the interpreter's teardown: with the groups destroyed a rank
        # still aborted once after "done:" (a real-Slurm CI run, rank 1 of 2); everything the run
        # writes is closed by now, and the atexit handlers run first
        _leave(rc)
    return rc


def _leave(rc: int) -> None:
    """Exit a distributed rank now (``lifecycle.leave_rank``); a name of its own so that a test can
    observe the exit."""
    from megatron_topo.lifecycle import leave_rank

    leave_rank(rc)


def _distributed() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


def _train(args, signals) -> int:
    from megatron_topo import runlock
    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.data import DataError
    from megatron_topo.topology import every_rank_finds
    from megatron_topo.training import Trainer, TrainingError, choose_plan, setup_runtime
    from megatron_topo.training.fault_injection import active as active_faults
    from megatron_topo.training.heartbeat import describe_failure
    from megatron_topo.training.rendezvous import PeerRefused, RendezvousStopped
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    rt = None
    lock = runlock.RunLock(log=lambda m: print(clean(m), flush=True))
    try:
        with every_rank_finds():  # the same files and --set options on every rank: rank 0 says it
            cfg = load_config(args.configs, args.overrides)
        active_faults()  # a malformed MEGATRON_TOPO_FAULT fails here, not mid-run
        rt = setup_runtime(cfg, stop=lambda: signals.signum)
        take_run_folders(cfg, rt, lock)  # one owner per run folder, before anything is written
        log = print if rt.rank == 0 else (lambda *a, **k: None)
        trainer = Trainer(cfg, rt, start=choose_plan(cfg, rt, log))  # the plan (preset auto: its trials) first
        last = trainer.train(signals=signals)
    except PeerRefused:  # rank 0 refused the job at the rendezvous and printed the one line
        return 2
    except RendezvousStopped as e:  # a stop signal while the ranks joined: the job never formed
        print(f"error: {e}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:  # a third Ctrl-C (the first stops at the next micro-batch and saves)
        print("error: interrupted; nothing saved since the last checkpoint", file=sys.stderr)
        return 130
    except (ConfigError, DataError, CheckpointError, TrainingError, runlock.LockError, OtherRankFailed) as e:
        if rt is not None and rt.heartbeat is not None:
            rt.heartbeat.stop()  # leaving on purpose: the other ranks must not report this rank as lost
        report_once(None if isinstance(e, OtherRankFailed) else e, rt)
        return 2 if not isinstance(e, TrainingError) else 1
    except Exception as e:
        # a vanished peer or a collective time-out: one line naming the lost rank, then exit at
        # once (tearing down a broken process group can hang)
        line = (
            describe_failure(e, rt.rank, rt.world_size, rt.heartbeat, cfg.distributed.collective_timeout_s)
            if rt is not None and rt.distributed
            else None
        )
        if line is not None:
            emit("error", line, flush=True)
            sys.stdout.flush()
            os._exit(1)
        if isinstance(e, OSError) and e.filename is not None:
            emit("error", f"{e.filename}: {e.strerror or e}")
            return 2
        oom = _out_of_memory(e)
        if oom is not None:  # a model too large for this machine: one line, not a C++ traceback
            if rt is not None and rt.heartbeat is not None:
                rt.heartbeat.stop()
            emit(
                "error",
                f"rank {rt.rank if rt is not None else 0}: out of memory ({oom}); use a smaller model or "
                f"micro-batch, shard more (zero_topo.preset: zero3 or topo) or add ranks",
            )
            return 1
        raise
    finally:
        lock.release()
    if rt.heartbeat is not None:
        rt.heartbeat.stop()
    if rt.rank == 0 and last.get("before_training"):  # a signal during start-up: nothing trained
        where = f"the checkpoint {last['checkpoint']} stands" if last.get("checkpoint") else "nothing saved"
        print(
            f"stopped by {last['stopped_by']} before training started (step {trainer.state.step}); "
            f"no step trained; {where}",
            flush=True,
        )
    elif rt.rank == 0 and last.get("stopped_by"):  # SIGTERM/SIGUSR1/SIGUSR2/SIGINT/SIGHUP: saved, exit 0
        where = (
            f"checkpoint {last['checkpoint']}" if last.get("checkpoint") else "no checkpoint (checkpoint.save is unset)"
        )
        print(f"stopped by {last['stopped_by']} at step {trainer.state.step}; {where}", flush=True)
    elif rt.rank == 0:
        lg = cfg.logging
        if "loss" in last:
            print(f"done: step {trainer.state.step}, loss {last['loss']:.4f}")
        else:
            print(f"done: step {trainer.state.step} (train_iters reached before this run: nothing to train)")
        print(escaped(f"metrics:     {os.path.join(lg.log_dir, 'metrics.jsonl')}"))
        print(escaped(f"tensorboard: {lg.tensorboard_dir or os.path.join(lg.log_dir, 'tensorboard')}"))
        if last.get("checkpoint"):
            print(f"checkpoint:  {last['checkpoint']}")
    return 0


def dry_run(args) -> int:
    # the fake process group warns once per group that it has no hooks: not for the user
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from megatron_topo import dryrun
    from megatron_topo.config import ConfigError, load_config
    from megatron_topo.topology import JobWideError, every_rank_finds, launcher_env, show_int

    try:
        with every_rank_finds():
            cfg = load_config(args.configs, args.overrides)
        env = launcher_env()
        world = args.world_size if args.world_size is not None else env["world_size"]
        rank = args.rank if args.rank is not None else (env["rank"] if args.world_size is None else 0)
        if not 1 <= world <= DRY_RUN_MAX_WORLD:
            raise JobWideError(
                f"--world-size {show_int(world)} must lie in 1..{DRY_RUN_MAX_WORLD:,} (2**17, more ranks "
                f"than any machine has; the dry run builds every process group, so its time grows with the world)"
            )
        if not 0 <= rank < world:
            err = JobWideError if args.rank is not None else ConfigError  # --rank: the same argv everywhere
            raise err(f"--rank {show_int(rank)} is outside the world of {world} ranks; valid 0..{world - 1}")
        local = env["local_world_size"] if args.world_size is None else None
        with every_rank_finds():  # the config's topology and plan: the same verdict on every rank
            return dryrun.main(cfg, world, rank, local, sys.stdout)
    except (ConfigError, ValueError) as e:
        if getattr(e, "job_wide", False) and other_rank_of_job():  # once per job (report_once)
            return leave_to_rank_0(2)
        print_errors(e)
        return 2


DRY_RUN_MAX_WORLD = 1 << 17  # Frontier has 75,264 GCDs; 2**17 ranks of the 20B model: ~20 s on a CPU


class OtherRankFailed(Exception):
    """Rank 0 stopped the run before training (its error line says why); this rank exits quietly."""


def take_run_folders(cfg, rt, lock) -> None:
    """Rank 0 locks the run's save and log folders (megatron_topo.runlock); every rank learns the
    outcome through one collective, so a refused run stops on every rank with rank 0's one line."""
    import torch

    from megatron_topo import runlock
    from megatron_topo.config import ConfigError, check_run_outputs
    from megatron_topo.safe_outputs import cannot_write_in

    err = None
    if rt.rank == 0:
        try:
            check_run_outputs(cfg)  # every output key: its shape, the run's own names, other runs' folders
            for folder, what in runlock.run_folders(cfg):
                why = cannot_write_in(folder)  # /proc, /sys, a read-only mount: the key named, not an OSError
                if why:
                    key = "save" if what == "checkpoint.save" else what  # as --set and the YAML name it
                    raise runlock.LockError(f"{key} {folder}: {why}; set {key} to a folder the run can write")
                lock.acquire(folder, what)
        except (runlock.LockError, ConfigError, OSError) as e:
            lock.release()
            err = (
                e
                if isinstance(e, (runlock.LockError, ConfigError))
                else runlock.LockError(f"cannot lock the run folder: {e.filename or ''}: {e.strerror or e}")
            )
    if rt.distributed:
        import torch.distributed as dist

        t = torch.tensor([1.0 if err else 0.0], device=rt.device)
        dist.all_reduce(t)
        failed = t.item() > 0
    else:
        failed = err is not None
    if err is not None:
        raise err
    if failed:
        raise OtherRankFailed()


def report_once(e, rt) -> None:
    """Print the error lines of ``e`` once per job: every rank of a distributed run usually fails
    with the same line (a bad config, a refused folder): rank 0 prints it, and another rank only when
    its line differs from rank 0's. The ranks compare through the rendezvous store (no collective:
    they may have failed at different points). Rank 0 prints first, then publishes its line and
    keeps the store up for up to 3 s until the others have looked; a rank whose error is rank 0's
    verdict (``e`` None: OtherRankFailed) waits up to 3 s for rank 0 to print before it exits, so
    a launcher that kills the remaining ranks (srun --kill-on-bad-exit, torchrun) does not cut
    rank 0's line. Without a store every rank prints."""
    if rt is None or not rt.distributed:
        # an error every rank finds before the ranks meet (a job-wide launcher variable such as
        # MASTER_PORT=29500.0, a bad config key or value, a topology that does not fit the world:
        # topology.every_rank_finds): every rank has it, rank 0 prints it (cli.other_rank_of_job)
        if e is not None and getattr(e, "job_wide", False) and other_rank_of_job():
            leave_to_rank_0(2)
        elif e is not None:
            print_errors(e)
        return
    import datetime
    import hashlib
    import time

    lines = [] if e is None else (getattr(e, "problems", None) or [str(e)])
    key = "megatron_topo/error/" + hashlib.sha1("\n".join(lines).encode()).hexdigest()
    try:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
    except Exception:
        if e is not None:
            print_errors(e)
        return
    try:
        if rt.rank == 0:
            if e is not None:
                print_errors(e)
                sys.stderr.flush()
                store.set(key, "1")
            store.set("megatron_topo/error/printed", "1")
            t0 = time.monotonic()
            while store.add("megatron_topo/error/seen", 0) < rt.world_size - 1 and time.monotonic() - t0 < 3:
                time.sleep(0.05)
            return
        store.set_timeout(datetime.timedelta(seconds=3))
        try:
            store.get(key if e is not None else "megatron_topo/error/printed")
            same = True
        except Exception:
            same = False
        try:
            store.add("megatron_topo/error/seen", 1)
        except Exception:
            pass
    except Exception:  # rank 0 gone: say it here
        same = False
    if e is not None and not same:
        print_errors(e)


def print_errors(e) -> None:
    """One ``error:`` line per problem (a config file's problems are all reported at once)."""
    for line in problem_lines(e):
        emit("error", line)


def _out_of_memory(e: BaseException):
    """A short description when ``e`` is an allocation failure (host or device), else None."""
    import re

    import torch

    text = str(e)
    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if t is not None
    )
    if not (
        isinstance(e, MemoryError)
        or isinstance(e, oom_types)
        or "can't allocate memory" in text
        or "out of memory" in text.lower()
    ):
        return None
    m = re.search(r"(?:tried to allocate|allocate) ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)", text)
    return f"an allocation of {m.group(1)} failed" if m else (text.splitlines()[0][:120] if text else type(e).__name__)


if __name__ == "__main__":
    sys.exit(main())
