"""The training loop: distributed setup, schedule, accumulation, eval, logging, checkpoints."""
from __future__ import annotations

import datetime
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import fault_injection, faults, preflight
from .analysis import autoplan
from . import lifecycle
from . import metrics as M
from .config import Config, ConfigError, check_batch_size, write_effective_config
from .hf_import import is_hf_folder, load_hf_into_engine, load_weights_only, weights_source
from .model import build_model
from .topology import Topology, launcher_env, topology_from_config
from .zero_topo import checkpoint as ckpt
from .zero_topo.comm import Comm
from .zero_topo.engine import ZeroTopoEngine
from .zero_topo.plan import Plan, effective_config


class TrainingError(RuntimeError):
    """A condition that stops training; one line for the user."""


# ------------------------------------------------------------------------------- schedule
def learning_rate(cfg: Config, step: int) -> float:
    """GPT-NeoX AnnealingLR: linear warmup over ``warmup * lr_decay_iters`` steps, then cosine or
    linear decay to ``min_lr`` at ``lr_decay_iters``. ``step`` counts optimizer steps from 1."""
    t = cfg.train
    max_lr, min_lr = t.optimizer.params.lr, t.min_lr
    decay_iters = t.lr_decay_iters or t.train_iters
    warmup = int(t.warmup * decay_iters)
    if warmup > 0 and step <= warmup:
        return max_lr * step / warmup
    if t.lr_decay_style == "constant":
        return max_lr
    if step >= decay_iters:
        return min_lr
    ratio = (step - warmup) / max(1, decay_iters - warmup)
    if t.lr_decay_style == "linear":
        return max_lr - (max_lr - min_lr) * ratio
    return min_lr + (max_lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1.0)


# ------------------------------------------------------------------------------- runtime
@dataclass
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    topo: Topology
    device: torch.device
    distributed: bool
    heartbeat: Optional[object] = None  # faults.Heartbeat: names a vanished rank when a collective fails
    strict: bool = False  # Comm checks that every collective's tensors live on ``device``

    def barrier(self):
        """All ranks wait for each other: a one-element all-reduce on the runtime device read
        back on the host (``dist.barrier`` needs a CPU backend or a bound device; this works
        on gloo, NCCL/RCCL and the fake process group alike)."""
        if self.distributed:
            t = torch.zeros(1, device=self.device)
            dist.all_reduce(t)
            if t.device.type != "meta":
                t.cpu()


def setup_runtime(cfg: Config) -> Runtime:
    try:
        env = launcher_env()
    except ValueError as e:
        raise ConfigError(f"launcher environment: {e} (WORLD_SIZE, RANK, LOCAL_RANK must be integers)") from None
    world, rank = env["world_size"], env["rank"]
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"launcher environment: RANK={rank} is outside WORLD_SIZE={world}; valid ranks 0..{world - 1}")
    dcfg = cfg.distributed
    use_cuda = dcfg.device == "cuda" or (dcfg.device == "auto" and torch.cuda.is_available())
    if dcfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("distributed.device=cuda but no GPU is visible; use cpu or auto")
    if use_cuda:
        # under srun --gpus-per-task=1 each task sees one device; otherwise pick by local rank
        torch.cuda.set_device(env["local_rank"] % max(1, torch.cuda.device_count()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    distributed = world > 1
    if distributed and not dist.is_initialized():
        backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(var):
                raise ConfigError(f"{var} is not set; launch with torchrun, srun (see slurm/) or set it")
        if not str(os.environ["MASTER_PORT"]).isdigit():
            raise ConfigError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} is not a port number")
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=dcfg.collective_timeout_s),
                                device_id=device if use_cuda else None)
    topo = topology_from_config(cfg.topology, world, env["local_world_size"])
    heartbeat = faults.Heartbeat.start(rank, world) if distributed else None
    return Runtime(rank, world, env["local_rank"], topo, device, distributed, heartbeat)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------- data
class Batches:
    """Micro-batches of global step ``s``: micro-batch j = m * world + rank covers samples
    ``consumed + j * mb .. + mb`` so any (world, accumulation) split of a global batch sees the
    same micro-batches."""

    def __init__(self, dataset, mb: int, accum: int, world: int, rank: int, device):
        self.ds, self.mb, self.accum, self.world, self.rank, self.device = dataset, mb, accum, world, rank, device

    @property
    def global_batch(self) -> int:
        return self.mb * self.accum * self.world

    def micro(self, consumed: int, m: int):
        j = m * self.world + self.rank
        start = consumed + j * self.mb
        rows = [np.asarray(self.ds[(start + i) % len(self.ds)], dtype=np.int64) for i in range(self.mb)]
        t = torch.from_numpy(np.stack(rows)).to(self.device)
        return t[:, :-1], t[:, 1:]


def loss_fn(logits, labels):
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def dataset_num_samples(cfg: Config, world_size: int) -> tuple[int, int, int]:
    """(train, valid, test) sample counts a run on ``world_size`` ranks draws: the sizes its
    index caches are built for (tools/prepare_data.py builds the same ones ahead of a job)."""
    t, lg = cfg.train, cfg.logging
    gb = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * world_size
    evals = (t.train_iters // max(1, lg.eval_interval) + 1) * lg.eval_iters * gb
    return t.train_iters * gb, evals, lg.eval_iters * gb


# ------------------------------------------------------------------------------- trainer
@dataclass
class TrainState:
    step: int = 0
    consumed_samples: int = 0
    consumed_valid: int = 0
    bad_steps: int = 0
    extra: dict = field(default_factory=dict)


def build_engine(cfg: Config, rt: Runtime, plan: Optional[Plan] = None, model=None):
    """Sharded initialisation: the model is built without storage and the engine materialises,
    initialises and shards one unit at a time, so no rank ever holds the whole model."""
    t = cfg.train
    model = model if model is not None else build_model(cfg.model, device="meta")
    model.init_buffers(rt.device)
    plan = plan or autoplan.resolve(cfg, rt.topo)[0]
    comm = Comm(rt.topo, rt.rank, distributed=rt.distributed, device=rt.device, strict=rt.strict)
    eng = ZeroTopoEngine(
        model, model.shard_units(), plan, comm, precision=cfg.precision,
        lr=t.optimizer.params.lr, betas=tuple(t.optimizer.params.betas), eps=t.optimizer.params.eps,
        weight_decay=t.weight_decay, grad_clip=t.gradient_clipping, fp16_cfg=t.fp16,
        kernel_backend=cfg.zero_topo.kernels, device=rt.device,
        init=lambda unit: model.init_parameters(unit, t.seed),
    )
    return eng


class Trainer:
    def __init__(self, cfg: Config, rt: Runtime, datasets=None, log=print):
        self.cfg, self.rt = cfg, rt
        self.log = log if rt.rank == 0 else (lambda *a, **k: None)
        ckpt.check_save_dir(cfg.checkpoint.save)  # before anything is built or written
        check_batch_size(cfg, rt.world_size)  # DeepSpeed's train_batch_size, now that the world is known
        self.weights_from = weights_source(cfg)  # finetune_from / an HF `load` / finetune, no_load_optim
        self.resume_from = self._resume_source()  # `load`, `save` under auto_resume, or None: fresh
        if self.resume_from and self.resume_from != cfg.checkpoint.load:
            self.weights_from = None  # an interrupted fine-tuning run resumes from its own save folder
        elif self.weights_from:
            self.resume_from = None
        seed_everything(cfg.train.seed)
        plan, ranked = autoplan.resolve(cfg, rt.topo)  # preset auto: the modelled fastest plan that fits
        if ranked:
            self.log(autoplan.summary(ranked, cfg.system))
        self.effective_cfg = effective_config(cfg, plan, rt.topo)  # what config.yml and checkpoints record
        self.memory_estimate = preflight.check(cfg, plan, rt.topo, rt.device)  # before allocating
        self.engine = build_engine(cfg, rt, plan)
        self.plan = self.engine.plan
        self.state = TrainState()
        if self.weights_from:  # weights only: step 0 (finetune), fresh optimizer
            self._load_weights(self.weights_from)
        elif self.resume_from:  # a bad checkpoint fails before data is built or logs are written
            self._load(self.resume_from)
        t = cfg.train
        self.batches_per_step = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * rt.world_size
        if datasets is None:
            datasets = self._build_data()
        self.train_ds, self.valid_ds = datasets[0], datasets[1]
        mk = lambda ds: Batches(ds, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps,
                                rt.world_size, rt.rank, rt.device) if ds is not None else None
        self.train_batches, self.valid_batches = mk(self.train_ds), mk(self.valid_ds)
        lg = cfg.logging
        # metrics.jsonl belongs to its run: a resumed run appends, a fresh one moves an older file aside
        self.writer = M.MetricsWriter(lg.log_dir, lg.tensorboard_dir, enabled=rt.rank == 0,
                                      fresh=not self.resume_from)
        if self.writer.moved_to:
            self.log(f"{self.writer.path} held an earlier run's records: moved to {self.writer.moved_to}")
        if rt.rank == 0:
            write_effective_config(self.effective_cfg, lg.log_dir)
        self.flops_per_iter = M.flops_per_iteration(cfg.model, self.batches_per_step,
                                                    cfg.model.checkpoint_activations)
        fault_injection.install(self)  # only with MEGATRON_TOPO_FAULT set (tests): wraps _loss/_backward

    # ---------------------------------------------------------------- data
    def _build_data(self):
        from .data import build_datasets

        t = self.cfg.train
        return build_datasets(self.cfg.data, seq_length=self.cfg.model.seq_length, seed=t.seed,
                              num_samples=dataset_num_samples(self.cfg, self.rt.world_size),
                              vocab_size=self.cfg.model.vocab_size, is_builder=self.rt.rank == 0,
                              barrier=self.rt.barrier if self.rt.distributed else None)

    # ---------------------------------------------------------------- checkpoints
    def _resume_source(self) -> Optional[str]:
        """Where this run resumes from: an explicit ``load`` (must exist); else, with
        ``auto_resume``, the ``save`` folder when it holds a checkpoint; else None (a fresh run,
        which must not save into a folder holding another run's checkpoints)."""
        c = self.cfg.checkpoint
        if c.load and c.load != self.weights_from:
            ckpt.resolve(c.load)
            return c.load
        if c.save and ckpt.holds_checkpoints(c.save):
            if c.auto_resume:
                ckpt.resolve(c.save)
                return c.save
            try:
                latest = f"latest step {ckpt.read_meta(ckpt.resolve(c.save))['step']}"
            except ckpt.CheckpointError as e:
                latest = f"unreadable: {e}"
            raise ckpt.CheckpointError(
                f"checkpoint.save {c.save} already holds checkpoints ({latest}) and this run starts fresh; "
                f"resume it with --set load={c.save} or --set auto_resume=true, or save elsewhere with --set save=DIR")
        if c.auto_resume:
            self.log(f"no checkpoint in {c.save or '(checkpoint.save unset)'}: starting fresh")
        return None

    def _load_weights(self, path: str):
        """GPT-NeoX's finetune / no_load_optim: the weights of an HF folder or of one of our
        checkpoints, a fresh optimizer; the step is 0 except for no_load_optim without finetune."""
        c = self.cfg.checkpoint
        if is_hf_folder(path):
            load_hf_into_engine(self.engine, path)
            self.log(f"fine-tuning from the HuggingFace model {path} (step 0, fresh optimizer)")
            return
        st = load_weights_only(self.engine, path)
        keep = c.no_load_optim and not c.finetune and not c.finetune_from
        if keep:
            self.state = TrainState(step=st["step"], consumed_samples=st["consumed_samples"],
                                    consumed_valid=st.get("consumed_valid", 0))
        self.log(f"loaded the weights of {ckpt.resolve(path)} (step {self.state.step}, fresh optimizer)")

    def _load(self, path: str):
        st = ckpt.load(self.engine, path, self.rt.rank, config=self.cfg)  # refuses another architecture
        self.state = TrainState(step=st["step"], consumed_samples=st["consumed_samples"],
                                consumed_valid=st.get("consumed_valid", 0))
        if "python_rng" in st:
            random.seed(st["python_rng"])
        self.log(f"resumed from {ckpt.resolve(path)} at step {self.state.step}")

    def save(self) -> Optional[str]:
        c = self.cfg.checkpoint
        if not c.save:
            return None
        s = self.state
        trainer_state = {"step": s.step, "consumed_samples": s.consumed_samples,
                         "consumed_valid": s.consumed_valid}
        path = ckpt.save(self.engine, c.save, s.step, trainer_state, self.effective_cfg.to_flat_yaml(), self.rt.rank,
                         self.rt.barrier, keep_last=c.keep_last)
        if getattr(self, "lifecycle", None) is not None:
            self.lifecycle.saved()  # the time-based interval restarts
        return path

    # ---------------------------------------------------------------- steps
    def train_step(self) -> dict:
        t = self.cfg.train
        eng = self.engine
        eng.train()
        losses = []
        step, accum = self.state.step + 1, t.gradient_accumulation_steps
        for m in range(accum):
            x, y = self.train_batches.micro(self.state.consumed_samples, m)
            loss = self._loss(x, y)
            losses.append(loss.detach())
            self._backward(loss, m, accum)
        lr = learning_rate(self.cfg, step)
        stats = eng.step(lr)
        self.state.consumed_samples += self.batches_per_step
        self.state.step += 1
        stats["lr"] = lr
        stats["loss"] = torch.stack(losses).float().mean()
        if stats.get("nonfinite") and not eng.scaler:
            self.state.bad_steps += 1
            if self.state.bad_steps >= t.max_bad_steps:
                raise TrainingError(
                    f"step {self.state.step}: non-finite gradients for {self.state.bad_steps} consecutive "
                    f"steps in {self.cfg.precision} ({self._bad_units(stats['nonfinite_units'])}; loss {stats['loss'].item():.4g}); "
                    f"lower the learning rate or check the data"
                )
        else:
            self.state.bad_steps = 0
        return stats

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One micro-batch's loss."""
        return loss_fn(self.engine(x), y)

    def _backward(self, loss: torch.Tensor, m: int, accum: int) -> None:
        """Backward of micro-batch ``m`` of ``accum``; the last one starts the step's reductions."""
        self.engine.backward(loss / accum, last_micro_batch=m == accum - 1)

    def _bad_units(self, idx: list[int]) -> str:
        """'unit 2 (layers.1)': the units whose gradient is non-finite on any rank (the engine
        found them with one flag per unit, max over every rank)."""
        mods = {id(m): n for n, m in self.engine.module.named_modules()}
        if not idx:
            return "no unit's gradient shard was non-finite"
        names = [f"{i} ({mods.get(id(self.engine.units[i].module), '?')})" for i in idx]
        return ("unit " if len(names) == 1 else "units ") + ", ".join(names[:4]) + (
            f" and {len(names) - 4} more" if len(names) > 4 else "")

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        if self.valid_batches is None:
            return None
        eng = self.engine
        eng.eval()
        tot = torch.zeros(1, dtype=torch.float64, device=self.rt.device)
        iters = self.cfg.logging.eval_iters
        for _ in range(iters):
            x, y = self.valid_batches.micro(self.state.consumed_valid, 0)
            tot += loss_fn(eng(x), y).double()
            self.state.consumed_valid += self.valid_batches.mb * self.rt.world_size
        eng.train()
        (total,) = eng.comm.all_reduce_host(eng.comm.to_host(tot).tolist())
        return total / (iters * self.rt.world_size)

    def _reduce_log(self, loss_sum: torch.Tensor, comm_bytes: dict) -> tuple[float, dict]:
        """Mean loss and summed traffic counters over ranks: one all-reduce of a device tensor
        (not counted in the traffic it reports)."""
        comm = self.engine.comm
        loss = comm.to_host(loss_sum.reshape(1).double()).item()
        vec = comm.all_reduce_host([loss, comm_bytes["intra_gpu"], comm_bytes["intra_node"],
                                    comm_bytes["inter_node"], comm_bytes["control"]])
        return vec[0] / self.rt.world_size, {
            "comm_bytes_intra_gpu": int(vec[1]), "comm_bytes_intra_node": int(vec[2]),
            "comm_bytes_inter_node": int(vec[3]), "comm_bytes_control": int(vec[4])}

    def train(self, until: Optional[int] = None) -> dict:
        """Train to ``train_iters`` (or stop early after step ``until``, saving as at the end).

        SIGTERM, SIGUSR1 and SIGINT stop it after the current step on every rank, saving as at the
        end; the returned record then has ``stopped_by`` (the signal's name)."""
        signals = lifecycle.StopSignals().install()
        try:
            self.lifecycle = lifecycle.Lifecycle(
                signals, self.cfg.checkpoint.save_interval_minutes, rank=self.rt.rank,
                start_reduce_max=self._start_reduce_max if self.rt.distributed else None)
            return self._train(until)
        finally:
            signals.restore()

    def _start_reduce_max(self, values: list):
        """Launch a MAX all-reduce of a few numbers over all ranks, through a tensor on the
        runtime device (NCCL/RCCL reduce no CPU tensors); returns a function that waits for it
        and returns the values (not counted in the traffic counters)."""
        comm = self.engine.comm
        t = torch.tensor(values, dtype=torch.float64, device=self.rt.device)
        work = comm.all_reduce(t, comm.world, op=dist.ReduceOp.MAX, async_op=True, account=False)

        def finish() -> list:
            if work is not None:
                work.wait()
            return comm.to_host(t).tolist()
        return finish

    def _train(self, until: Optional[int]) -> dict:
        cfg, rt, s = self.cfg, self.rt, self.state
        life = self.lifecycle
        start_step = s.step
        t, lg = cfg.train, cfg.logging
        end = min(t.train_iters, until) if until is not None else t.train_iters
        if cfg.no_effect:
            self.log(f"note: set but without effect in megatron_topo (docs/neox_compat.md): {', '.join(cfg.no_effect)}")
        self.log(f"topology: {rt.topo.describe()}; plan: {self.plan.describe()}")
        self.log(f"model: {sum(u.numel for u in self.engine.units):,} parameters; precision {cfg.precision}; "
                 f"global batch {self.batches_per_step} x {cfg.model.seq_length} tokens")
        bar = None
        if rt.rank == 0 and lg.progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=t.train_iters, initial=s.step, desc="train", unit="step", dynamic_ncols=True,
                       file=sys.stdout)
        last = {}
        window_loss = torch.zeros((), dtype=torch.float64, device=rt.device)
        window_steps, window_time = 0, 0.0
        self.engine.comm.reset_counters()
        while s.step < end:
            t0 = time.perf_counter()
            stats = self.train_step()
            window_time += time.perf_counter() - t0
            window_loss += stats["loss"].double()
            window_steps += 1
            if bar is not None:
                bar.update(1)
            stop, save_due = life.poll()  # agreed by all ranks: a stop signal, a time-based save
            evals = {}
            if lg.eval_interval and s.step % lg.eval_interval == 0 and self.valid_batches is not None:
                ev = self.evaluate()
                evals = {"eval_loss": ev, "eval_ppl": math.exp(min(ev, 50))}
            if s.step % lg.log_interval == 0 or s.step == end or stop:
                elapsed = window_time
                loss, comm_bytes = self._reduce_log(window_loss / window_steps, self.engine.comm.reset_counters())
                step_time = elapsed / window_steps
                rec = {
                    "loss": loss, "lr": stats["lr"], "grad_norm": stats["grad_norm"],
                    "loss_scale": stats["loss_scale"], "skipped": stats["skipped"],
                    "step_time_s": step_time,
                    "samples_per_sec": self.batches_per_step / step_time,
                    "tokens_per_sec": self.batches_per_step * cfg.model.seq_length / step_time,
                    "tflops_per_gpu": M.tflops_per_gpu(self.flops_per_iter, step_time, rt.world_size),
                    "peak_mem_bytes": M.peak_memory_bytes(rt.device),
                    **{k: v // window_steps for k, v in comm_bytes.items()},
                    "consumed_samples": s.consumed_samples,
                    **evals,
                }
                evals = {}
                if s.step == lg.log_interval or s.step == end:
                    rec.update({f"model_state_bytes_{k}": v
                                for k, v in self.engine.state_bytes_before_step.items()})
                self.writer.log(s.step, rec)
                last = rec
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.4f}", lr=f"{stats['lr']:.2e}",
                                    tok_s=f"{rec['tokens_per_sec']:.0f}", refresh=False)
                window_loss.zero_()
                window_steps, window_time = 0, 0.0
            if evals:  # an eval step that is not a log step gets its own record
                self.writer.log(s.step, evals)
                last.update(evals)
            c = cfg.checkpoint
            if c.save and s.step < end and not stop and (
                    (c.checkpoint_factor and s.step % c.checkpoint_factor == 0) or save_due):
                self.save()
            if stop:
                break
        life.close()
        if bar is not None:
            bar.close()
        if cfg.checkpoint.save and (s.step > start_step or not self.resume_from):
            last["checkpoint"] = self.save()
        elif cfg.checkpoint.save:  # resumed at train_iters: nothing trained, the checkpoint stands
            last["checkpoint"] = ckpt.resolve(self.resume_from)
        if life.stop_signal:
            last["stopped_by"] = life.stop_name
        self.writer.close()
        return last
