"""The training loop: accumulation, the optimizer step, eval, logging, stop signals and periodic
checkpoints. The plan is chosen before the Trainer is built (:func:`.start.choose_plan`); the
Trainer composes the engine, the data, a :class:`.checkpoints.Checkpointer` and a
:class:`.log_window.LogWindow`."""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from .. import lifecycle, preflight
from .. import metrics as M
from ..config import Config, note_lines, write_effective_config
from ..zero_topo import checkpoint as ckpt
from ..zero_topo.sharding import effective_config
from . import fault_injection, profiling, step_sync
from . import start as run_start
from .batches import Batches, build_data, check_eval_data, learning_rate, loss_fn
from .checkpoints import Checkpointer, TrainState
from .log_window import LogWindow
from .runtime import Runtime
from .start import RunStart, choose_plan
from .step import run_step


class TrainingError(RuntimeError):
    """A condition that stops training; one line for the user."""


class Trainer:
    """Builds the engine, the data and the logs of one run from its :class:`.start.RunStart`
    (chosen here by :func:`.start.choose_plan` when not given), and trains it."""

    def __init__(self, cfg: Config, rt: Runtime, datasets=None, log=print, start: Optional[RunStart] = None):
        self.cfg, self.rt = cfg, rt
        self.log = log if rt.rank == 0 else (lambda *a, **k: None)
        self.lifecycle: Optional[lifecycle.Lifecycle] = None  # set while train() runs
        start = start or choose_plan(cfg, rt, self.log)
        self.resume_from, self.weights_from = start.resume_from, start.weights_from
        plan = start.plan
        self.effective_cfg = effective_config(cfg, plan, rt.topo)  # what config.yml and checkpoints record
        self.memory_estimate = preflight.check(cfg, plan, rt.topo, rt.device)  # before allocating
        self.engine = run_start.build_engine(cfg, rt, plan, comm=start.comm)
        self.plan = self.engine.plan
        t = cfg.train
        self.batches_per_step = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * rt.world_size
        self.checkpointer = Checkpointer(
            cfg,
            rt.rank,
            self.engine,
            self.effective_cfg,
            self.batches_per_step,
            self.resume_from,
            self.weights_from,
            self.log,
        )
        self.state = self.checkpointer.load_start(TrainState())
        if datasets is None:
            datasets = self._build_data()
        self.train_ds, self.valid_ds = datasets[0], datasets[1]
        self.checkpointer.check_data_position(self.state, self.train_ds)
        check_eval_data(cfg, self.train_ds, self.valid_ds)  # evaluation asked for: it must have data
        mk = lambda ds: (
            Batches(
                ds, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, rt.world_size, rt.rank, rt.device
            )
            if ds is not None
            else None
        )
        self.train_batches, self.valid_batches = mk(self.train_ds), mk(self.valid_ds)
        lg = cfg.logging
        # metrics.jsonl belongs to its run: a resumed run appends, a fresh one moves an older file aside
        self.writer = M.MetricsWriter(
            lg.log_dir,
            lg.tensorboard_dir,
            enabled=rt.rank == 0,
            fresh=not self.resume_from,
            resume_step=self.state.step if self.resume_from else None,
        )
        if self.writer.moved_to:
            self.log(f"{self.writer.path} held an earlier run's records: moved to {self.writer.moved_to}")
        if self.writer.superseded:
            self.log(
                f"{self.writer.path}: {self.writer.superseded} records of steps after {self.state.step} "
                f"(trained after the last checkpoint by a job that did not save them) moved to "
                f"{self.writer.path}.superseded"
            )
        if rt.rank == 0:
            write_effective_config(self.effective_cfg, lg.log_dir)
        self.flops_per_iter = M.flops_per_iteration(cfg.model, self.batches_per_step, cfg.model.checkpoint_activations)
        fault_injection.install(self)  # only with MEGATRON_TOPO_FAULT set (tests): wraps _loss/_backward
        self.profiler = profiling.install(self)  # only with profile / memory_profiling: wraps train_step too

    # ---------------------------------------------------------------- data
    def _build_data(self):
        rt = self.rt
        return build_data(self.cfg, rt.rank, rt.world_size, self.engine.comm.barrier if rt.distributed else None)

    # ---------------------------------------------------------------- steps
    def train_step(self) -> Optional[dict]:
        """One optimizer step (:func:`.step.run_step`) and the trainer state it advances; None when
        a stop signal came between micro-batches (all ranks agree, pipelined by one micro-batch):
        the partial step is discarded and the run saves the last whole step."""
        t, s, life = self.cfg.train, self.state, self.lifecycle
        stats = run_step(
            self.engine,
            lambda m: self.train_batches.micro(s.consumed_samples, m),
            t.gradient_accumulation_steps,
            learning_rate(self.cfg, s.step + 1),
            loss_of=self._loss,
            backward=self._backward,
            stop=life.poll_micro if life is not None else None,
            before_step=life.end_micro if life is not None else None,
        )
        if stats is None:
            self._discard_partial_step()
            return None
        s.consumed_samples += self.batches_per_step
        s.step += 1
        if stats.get("nonfinite") and not self.engine.scaler:
            s.bad_steps += 1
            if s.bad_steps >= t.max_bad_steps:
                raise TrainingError(
                    f"step {s.step}: non-finite gradients for {s.bad_steps} consecutive "
                    f"steps in {self.cfg.precision} ({self._bad_units(stats['nonfinite_units'])}; "
                    f"loss {stats['loss'].item():.4g}); "
                    f"lower the learning rate or check the data"
                )
        else:
            s.bad_steps = 0
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
        return (
            ("unit " if len(names) == 1 else "units ")
            + ", ".join(names[:4])
            + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        )

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        if self.valid_batches is None:
            return None
        eng = self.engine
        eng.eval()
        tot = torch.zeros(1, dtype=torch.float64, device=self.rt.device)
        iters, life, stopped = self.cfg.logging.eval_iters, self.lifecycle, False
        for i in range(iters):
            # a stop signal abandons the evaluation, on every rank at the same micro-batch (the
            # agreement of a step's micro-batches); the run then saves and stops
            if i and life is not None and life.poll_micro():
                stopped = True
                break
            x, y = self.valid_batches.micro(self.state.consumed_valid, 0)
            tot += loss_fn(eng(x), y).double()
            self.state.consumed_valid += self.valid_batches.mb * self.rt.world_size
        if life is not None:
            life.end_micro()
        eng.train()
        if stopped:
            return None
        (total,) = eng.comm.all_reduce_host(eng.comm.to_host(tot).tolist())
        return total / (iters * self.rt.world_size)

    def _reduce_log(self, loss_sum: torch.Tensor, comm_bytes: dict) -> tuple[float, dict]:
        """Mean loss and summed traffic counters over ranks (step_sync.reduce_log)."""
        return step_sync.reduce_log(self.engine.comm, self.rt.world_size, loss_sum, comm_bytes)

    def save(self) -> Optional[str]:
        """Save the current step now (collective; None when ``checkpoint.save`` is unset)."""
        return self.checkpointer.save(self.state)

    def train(self, until: Optional[int] = None, signals: Optional[lifecycle.StopSignals] = None) -> dict:
        """Train to ``train_iters`` (or stop early after step ``until``, saving as at the end).

        SIGTERM, SIGUSR1, SIGUSR2, SIGINT and SIGHUP stop it at the next micro-batch (the partial step is
        discarded) or after the current step on every rank, saving as at the end; the returned
        record then has ``stopped_by`` (the signal's name). ``signals``: handlers installed when
        the process started (train.py), so a signal during start-up stops the run before its first
        step; None installs them now."""
        own = signals is None
        signals = signals or lifecycle.StopSignals().install()
        try:
            self.lifecycle = step_sync.agreement(
                self.engine.comm, self.rt, signals, self.cfg.checkpoint.save_interval_minutes
            )
            self.checkpointer.lifecycle = self.lifecycle
            return self._train(until)
        finally:
            if own:
                signals.restore()

    def _train(self, until: Optional[int]) -> dict:
        s, life, ck = self.state, self.lifecycle, self.checkpointer
        end = min(self.cfg.train.train_iters, until) if until is not None else self.cfg.train.train_iters
        self._log_start()
        window = self._log_window(end)
        if life.agree_now():  # a stop signal came while the run started up: stop before training
            life.close()
            return self._close(
                window,
                {
                    "stopped_by": life.stop_name,
                    "before_training": True,
                    "checkpoint": ckpt.resolve(self.resume_from) if self.resume_from else None,
                },
            )
        start_step, last = s.step, {}
        self.engine.comm.reset_counters()
        ck.at_start(s)
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
            window.add(time.perf_counter() - t0, stats["loss"])
            evals = {} if stop else self._evaluate_due()  # a stopping run does not evaluate first
            stop = stop or bool(life.stop_signal)  # a stop signal during the evaluation
            if window.due(s.step, stop):
                last, evals = window.record(s.step, stats, s.consumed_samples, evals), {}
            if evals:  # an eval step that is not a log step gets its own record
                self.writer.log(s.step, evals)
                last.update(evals)
            ck.after_step(s, end, stop, save_due)
            if stop:
                break
        life.close()
        last.update(ck.at_end(s, start_step))
        if life.stop_signal:
            last["stopped_by"] = life.stop_name
        return self._close(window, last)

    def _log_start(self) -> None:
        cfg, rt = self.cfg, self.rt
        for line in note_lines(cfg):  # accepted no-effect keys, DeepSpeed "auto" values
            self.log(line)
        self.log(f"topology: {rt.topo.describe()}; plan: {self.plan.describe()}")
        self.log(
            f"model: {sum(u.numel for u in self.engine.units):,} parameters; precision {cfg.precision}; "
            f"global batch {self.batches_per_step} x {cfg.model.seq_length} tokens"
        )

    def _log_window(self, end: int) -> LogWindow:
        cfg, rt = self.cfg, self.rt
        return LogWindow(
            self.engine,
            self.writer,
            self._reduce_log,
            device=rt.device,
            world_size=rt.world_size,
            global_batch=self.batches_per_step,
            seq_length=cfg.model.seq_length,
            flops_per_iter=self.flops_per_iter,
            log_interval=cfg.logging.log_interval,
            end=end,
            total=cfg.train.train_iters,
            step=self.state.step,
            progress_bar=rt.rank == 0 and cfg.logging.progress_bar,
        )

    def _evaluate_due(self) -> dict:
        """Eval loss and perplexity every ``eval_interval`` steps (when there is validation data)."""
        lg = self.cfg.logging
        if not (lg.eval_interval and self.state.step % lg.eval_interval == 0 and self.valid_batches is not None):
            return {}
        ev = self.evaluate()
        if ev is None:  # abandoned for a stop signal
            return {}
        return {"eval_loss": ev, "eval_ppl": math.exp(min(ev, 50))}

    def _close(self, window: LogWindow, last: dict) -> dict:
        """The end of :meth:`_train`: the progress bar and the metrics file closed."""
        if self.profiler is not None:  # a window the run left early (a stop signal, ``until``)
            self.profiler.close()
        window.close()
        self.writer.close()
        return last
