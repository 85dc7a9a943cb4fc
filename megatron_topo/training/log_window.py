"""The training loop's log window: the steps since the last record, their summed loss and wall
time, and the record written every ``logging.log_interval`` steps (mean loss over ranks, step
time, samples and tokens per second, TFLOPS per GPU, peak memory, traffic per step), with the
progress bar."""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch

from .. import metrics as M


class LogWindow:
    """Accumulates the steps between two records. ``reduce(loss_mean, comm_bytes)`` returns the
    mean loss and the summed traffic counters over ranks (it waits for the device: its time is in
    the window's step time); ``engine`` provides the traffic counters and the model-state bytes;
    ``writer`` gets the records."""

    def __init__(
        self,
        engine,
        writer: M.MetricsWriter,
        reduce: Callable[[torch.Tensor, dict], tuple[float, dict]],
        *,
        device: torch.device,
        world_size: int,
        global_batch: int,
        seq_length: int,
        flops_per_iter: float,
        log_interval: int,
        end: int,
        total: int,
        step: int,
        progress_bar: bool,
    ) -> None:
        self.engine, self.writer, self.reduce = engine, writer, reduce
        self.device, self.world_size = device, world_size
        self.global_batch, self.seq_length, self.flops_per_iter = global_batch, seq_length, flops_per_iter
        self.log_interval, self.end = log_interval, end
        self.bar = None
        if progress_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=step, desc="train", unit="step", dynamic_ncols=True, file=sys.stdout)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.steps, self.seconds = 0, 0.0

    def add(self, seconds: float, loss: torch.Tensor) -> None:
        """One more step: its wall time and its loss (a device tensor; not synchronised here)."""
        self.seconds += seconds
        self.loss += loss.double()
        self.steps += 1
        if self.bar is not None:
            self.bar.update(1)

    def due(self, step: int, stop: bool) -> bool:
        """A record is written every ``log_interval`` steps, at the last step and when stopping."""
        return step % self.log_interval == 0 or step == self.end or stop

    def record(self, step: int, stats: dict, consumed_samples: int, evals: dict) -> dict:
        """Reduce the window over ranks, write its record for ``step`` (with ``evals``) and start a
        new window; returns the record."""
        t1 = time.perf_counter()
        loss, comm_bytes = self.reduce(self.loss / self.steps, self.engine.comm.reset_counters())
        step_time = (self.seconds + time.perf_counter() - t1) / self.steps
        rec = {
            "loss": loss,
            "lr": stats["lr"],
            "grad_norm": stats["grad_norm"],
            "loss_scale": stats["loss_scale"],
            "skipped": stats["skipped"],
            "step_time_s": step_time,
            "samples_per_sec": self.global_batch / step_time,
            "tokens_per_sec": self.global_batch * self.seq_length / step_time,
            "tflops_per_gpu": M.tflops_per_gpu(self.flops_per_iter, step_time, self.world_size),
            "peak_mem_bytes": M.peak_memory_bytes(self.device),
            **{k: v // self.steps for k, v in comm_bytes.items()},
            "consumed_samples": consumed_samples,
            **evals,
        }
        if step == self.log_interval or step == self.end:
            rec.update({f"model_state_bytes_{k}": v for k, v in self.engine.state_bytes_before_step.items()})
        self.writer.log(step, rec)
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{loss:.4f}", lr=f"{stats['lr']:.2e}", tok_s=f"{rec['tokens_per_sec']:.0f}", refresh=False
            )
        self.loss.zero_()
        self.steps, self.seconds = 0, 0.0
        return rec

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
