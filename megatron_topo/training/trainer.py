"""The training loop: accumulation, the optimizer step, eval, logging, stop signals and periodic
checkpoints."""
from __future__ import annotations

import datetime
import math
import sys
import time
from typing import Optional

import torch

from .. import lifecycle, preflight
from .. import metrics as M
from ..analysis import autoplan
from ..config import Config, ConfigError, DistributedConfig, check_batch_size, check_log_dir, note_lines, write_effective_config
from ..config.hf_config import weights_source
from ..model import build_model
from ..zero_topo import checkpoint as ckpt
from ..zero_topo import trace
from ..zero_topo.comm import Comm
from ..zero_topo.engine import ZeroTopoEngine
from ..zero_topo.sharding import Plan, effective_config
from . import auto_trials, fault_injection, step_sync
from .batches import Batches, build_data, learning_rate, loss_fn
from .checkpoints import TrainerCheckpoints, TrainState
from .runtime import Runtime, seed_everything


class TrainingError(RuntimeError):
    """A condition that stops training; one line for the user."""


def new_comm(rt: Runtime, dcfg: Optional[DistributedConfig] = None) -> Comm:
    """The collectives of this process on the runtime's topology and device (groups created on use,
    with ``dcfg``'s collective timeout; its collective trace, when ``trace_collectives`` is set)."""
    dcfg = dcfg or DistributedConfig()
    if dcfg.trace_collectives:
        bad = trace.check_dir(dcfg.trace_collectives)
        if bad:
            raise ConfigError(bad)
    return Comm(rt.topo, rt.rank, distributed=rt.distributed, device=rt.device, strict=rt.strict,
                timeout=datetime.timedelta(seconds=dcfg.collective_timeout_s), trace_dir=dcfg.trace_collectives)


def build_engine(cfg: Config, rt: Runtime, plan: Optional[Plan] = None, model=None, comm: Optional[Comm] = None):
    """Sharded initialisation: the model is built without storage and the engine materialises,
    initialises and shards one unit at a time, so no rank ever holds the whole model. ``comm``:
    an existing one (the run's: its collective trace; preset auto's trial engines build in it)."""
    t = cfg.train
    model = model if model is not None else build_model(cfg.model, device="meta")
    model.init_buffers(rt.device)
    plan = plan or autoplan.resolve(cfg, rt.topo)[0]
    comm = comm or new_comm(rt, cfg.distributed)
    eng = ZeroTopoEngine(
        model, model.shard_units(), plan, comm, precision=cfg.precision,
        lr=t.optimizer.params.lr, betas=tuple(t.optimizer.params.betas), eps=t.optimizer.params.eps,
        weight_decay=t.weight_decay, grad_clip=t.gradient_clipping, fp16_cfg=t.fp16,
        kernel_backend=cfg.zero_topo.kernels, device=rt.device,
        init=lambda unit: model.init_parameters(unit, t.seed),
    )
    return eng


class Trainer(TrainerCheckpoints):
    """Builds the plan, the engine, the data and the logs of one run, and trains it."""

    def __init__(self, cfg: Config, rt: Runtime, datasets=None, log=print):
        self.cfg, self.rt = cfg, rt
        self.log = log if rt.rank == 0 else (lambda *a, **k: None)
        self.lifecycle: Optional[lifecycle.Lifecycle] = None  # set while train() runs
        ckpt.check_save_dir(cfg.checkpoint.save)  # before anything is built or written
        check_log_dir(cfg.logging.log_dir)  # not inside a checkpoint, not over a user's config.yml
        self.weights_from = weights_source(cfg)  # finetune_from / an HF `load` / finetune, no_load_optim
        self.resume_from = self._resume_source()  # `load`, `save` under auto_resume, or None: fresh
        if self.resume_from and self.resume_from != cfg.checkpoint.load:
            self.weights_from = None  # an interrupted fine-tuning run resumes from its own save folder
        elif self.weights_from:
            self.resume_from = None
        # DeepSpeed's train_batch_size, now that the world is known: the accumulation count is
        # derived from the global batch (train_batch_size, or a resumed run's when the world changed)
        batch_note = check_batch_size(cfg, rt.world_size, rt.topo.ranks_per_node, *self._kept_global_batch())
        if batch_note:
            self.log(batch_note)
        seed_everything(cfg.train.seed)
        plan, ranked = autoplan.resolve(cfg, rt.topo)  # preset auto: the modelled fastest plan that fits
        comm = new_comm(rt, cfg.distributed)
        if ranked:
            self.log(autoplan.summary(ranked, cfg.system))
            # the plans the model cannot tell apart are timed here (zero_topo.auto_trials)
            plan = auto_trials.choose(cfg, rt, ranked, comm, build_engine, self.resume_from, self.log)
        self.effective_cfg = effective_config(cfg, plan, rt.topo)  # what config.yml and checkpoints record
        self.memory_estimate = preflight.check(cfg, plan, rt.topo, rt.device)  # before allocating
        self.engine = build_engine(cfg, rt, plan, comm=comm)
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
        self._check_data_position()
        mk = lambda ds: Batches(ds, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps,
                                rt.world_size, rt.rank, rt.device) if ds is not None else None
        self.train_batches, self.valid_batches = mk(self.train_ds), mk(self.valid_ds)
        lg = cfg.logging
        # metrics.jsonl belongs to its run: a resumed run appends, a fresh one moves an older file aside
        self.writer = M.MetricsWriter(lg.log_dir, lg.tensorboard_dir, enabled=rt.rank == 0,
                                      fresh=not self.resume_from,
                                      resume_step=self.state.step if self.resume_from else None)
        if self.writer.moved_to:
            self.log(f"{self.writer.path} held an earlier run's records: moved to {self.writer.moved_to}")
        if self.writer.superseded:
            self.log(f"{self.writer.path}: {self.writer.superseded} records of steps after {self.state.step} "
                     f"(trained after the last checkpoint by a job that did not save them) moved to "
                     f"{self.writer.path}.superseded")
        if rt.rank == 0:
            write_effective_config(self.effective_cfg, lg.log_dir)
        self.flops_per_iter = M.flops_per_iteration(cfg.model, self.batches_per_step,
                                                    cfg.model.checkpoint_activations)
        fault_injection.install(self)  # only with MEGATRON_TOPO_FAULT set (tests): wraps _loss/_backward

    # ---------------------------------------------------------------- data
    def _build_data(self):
        rt = self.rt
        return build_data(self.cfg, rt.rank, rt.world_size, self.engine.comm.barrier if rt.distributed else None)

    # ---------------------------------------------------------------- steps
    def train_step(self) -> dict:
        t = self.cfg.train
        eng = self.engine
        eng.train()
        losses = []
        step, accum = self.state.step + 1, t.gradient_accumulation_steps
        life = self.lifecycle
        for m in range(accum):
            # a stop signal is honoured at the next micro-batch (all ranks agree, pipelined by one
            # micro-batch); the partial step is discarded and the run saves the last whole step
            if m and life is not None and life.poll_micro():
                self._discard_partial_step()
                return None
            x, y = self.train_batches.micro(self.state.consumed_samples, m)
            loss = self._loss(x, y)
            losses.append(loss.detach())
            self._backward(loss, m, accum)
        if life is not None:
            life.end_micro()
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

    def _discard_partial_step(self) -> None:
        """Drop the gradients of a step stopped between micro-batches (the weights, optimizer and
        data position stay those of the last whole step, which is what gets saved)."""
        for u in self.engine.units:
            u.grad_acc.zero_()
            u.reset_residuals()

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
        """Mean loss and summed traffic counters over ranks (step_sync.reduce_log)."""
        return step_sync.reduce_log(self.engine.comm, self.rt.world_size, loss_sum, comm_bytes)

    def train(self, until: Optional[int] = None, signals: Optional[lifecycle.StopSignals] = None) -> dict:
        """Train to ``train_iters`` (or stop early after step ``until``, saving as at the end).

        SIGTERM, SIGUSR1, SIGUSR2 and SIGINT stop it at the next micro-batch (the partial step is
        discarded) or after the current step on every rank, saving as at the end; the returned
        record then has ``stopped_by`` (the signal's name). ``signals``: handlers installed when
        the process started (train.py), so a signal during start-up stops the run before its first
        step; None installs them now."""
        own = signals is None
        signals = signals or lifecycle.StopSignals().install()
        try:
            self.lifecycle = step_sync.agreement(self.engine.comm, self.rt, signals,
                                                 self.cfg.checkpoint.save_interval_minutes)
            return self._train(until)
        finally:
            if own:
                signals.restore()

    def _train(self, until: Optional[int]) -> dict:
        cfg, rt, s = self.cfg, self.rt, self.state
        life = self.lifecycle
        start_step = s.step
        t, lg = cfg.train, cfg.logging
        end = min(t.train_iters, until) if until is not None else t.train_iters
        for line in note_lines(cfg):  # accepted no-effect keys, DeepSpeed "auto" values
            self.log(line)
        self.log(f"topology: {rt.topo.describe()}; plan: {self.plan.describe()}")
        self.log(f"model: {sum(u.numel for u in self.engine.units):,} parameters; precision {cfg.precision}; "
                 f"global batch {self.batches_per_step} x {cfg.model.seq_length} tokens")
        bar = None
        if rt.rank == 0 and lg.progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=t.train_iters, initial=s.step, desc="train", unit="step", dynamic_ncols=True,
                       file=sys.stdout)
        last = {}
        if life.agree_now():  # a stop signal came while the run started up: stop before training
            life.close()
            if bar is not None:
                bar.close()
            self.writer.close()
            return {"stopped_by": life.stop_name, "before_training": True,
                    "checkpoint": ckpt.resolve(self.resume_from) if self.resume_from else None}
        window_loss = torch.zeros((), dtype=torch.float64, device=rt.device)
        window_steps, window_time = 0, 0.0
        self.engine.comm.reset_counters()
        extra = set(cfg.checkpoint.extra_save_iters or ())  # GPT-NeoX's extra_save_iters (Pythia: log-spaced)
        if cfg.checkpoint.save and 0 in extra and s.step == 0 and not self.resume_from:
            self.save()  # GPT-NeoX saves step 0 when asked and starting from it
        while s.step < end:
            # step_time_s is wall clock: a step until the next one starts, less evaluation,
            # checkpoints and writing the record. It includes the end-of-step agreement and the log
            # reduction (which waits for the device), so work a step leaves running (post-step
            # gathers, queued kernels) is counted where it ends, not hidden between timed regions.
            t0 = time.perf_counter()
            stats = self.train_step()
            if stats is None:  # stopped between micro-batches: the partial step is discarded
                break
            stop, save_due = life.poll()  # agreed by all ranks: a stop signal, a time-based save
            window_time += time.perf_counter() - t0
            window_loss += stats["loss"].double()
            window_steps += 1
            if bar is not None:
                bar.update(1)
            evals = {}
            if lg.eval_interval and s.step % lg.eval_interval == 0 and self.valid_batches is not None:
                ev = self.evaluate()
                evals = {"eval_loss": ev, "eval_ppl": math.exp(min(ev, 50))}
            if s.step % lg.log_interval == 0 or s.step == end or stop:
                t1 = time.perf_counter()
                loss, comm_bytes = self._reduce_log(window_loss / window_steps, self.engine.comm.reset_counters())
                step_time = (window_time + time.perf_counter() - t1) / window_steps
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
                    (c.checkpoint_factor and s.step % c.checkpoint_factor == 0) or save_due or s.step in extra):
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
