"""Walltime safety for the training loop.

``StopSignals`` turns SIGTERM, SIGUSR1, SIGUSR2, SIGINT and SIGHUP into a request to stop: the handler only
records the signal, the loop stops at the next micro-batch (the partial step is discarded) or
after the current step, every rank agrees (one MAX all-reduce), the trainer saves and
``train.py`` exits 0 with one line. ``train.py`` installs the handlers when it starts, so a signal
that arrives while the run starts up (data, plan, engine, loading a checkpoint) is kept: the run
then stops before its first step with one line (nothing new to save). Slurm sends SIGUSR1 ahead of the time limit
(``#SBATCH --signal=B:USR1@...`` in slurm/, forwarded to the ranks) and SIGTERM when it cancels or
preempts a job; Ctrl-C is SIGINT; SIGHUP (the terminal or ssh session closed) is treated like
SIGTERM, except that a process started with SIGHUP ignored (``nohup``) keeps ignoring it.

``Lifecycle.poll`` is the per-step agreement: ``[signal number, time-based save due]`` reduced
with MAX over all ranks through a tensor on the runtime device (a GPU tensor under NCCL/RCCL; the
trainer passes the engine's ``Comm.all_reduce_host``). Only rank 0's clock decides whether a
time-based save is due, so every rank saves at the same step.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP)
# an ignored SIGHUP stays ignored (nohup asked for it); SIGUSR1/SIGUSR2 are ignored on purpose by
# slurm/srun_task.sh until train.py takes them over, so those are installed whatever their disposition
KEEP_IGNORED = (signal.SIGHUP,)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopSignals:
    """Install handlers that record the first stop signal (``signum``) instead of dying.

    A second SIGINT while a stop is pending restores the default handler, so a third Ctrl-C
    interrupts at once. Use as a context manager; the previous handlers come back on exit.
    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.signum: Optional[int] = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def install(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in self.signals:
            if s in KEEP_IGNORED and signal.getsignal(s) == signal.SIG_IGN:
                continue
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous = {}

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.restore()
        return False


class Lifecycle:
    """Per-step decisions every rank takes together: stop (a signal reached any rank) and
    time-based checkpoints (every ``save_interval_minutes`` by rank 0's clock; 0 = off).

    Distributed, the decision is pipelined by one step: ``poll`` after step k starts the MAX
    reduction of this rank's ``[signal, due]`` and acts on the result started after step k - 1.
    The reduction thus never waits on the collectives still running after an optimizer step
    (the engine's background weight gathers, queued before it on the same stream); every rank
    still takes the same decision at the same step, one step after the signal.
    """

    def __init__(
        self,
        signals: StopSignals,
        save_interval_minutes: float = 0.0,
        *,
        start_reduce_max: Optional[Callable[[list], Callable[[], list]]] = None,
        rank: int = 0,
        clock=time.monotonic,
    ):
        """``start_reduce_max(values)`` launches the element-wise MAX over all ranks (a collective
        every rank calls once per poll) and returns a function that waits for it and returns the
        reduced values; None for a single process (decisions then take effect at once)."""
        if save_interval_minutes < 0:
            raise ValueError(f"save_interval_minutes {save_interval_minutes} must be >= 0 (0: off)")
        self.signals = signals
        self.interval_s = 60.0 * float(save_interval_minutes)
        self.start_reduce_max = start_reduce_max
        self.rank = rank
        self.clock = clock
        self.last_save = clock()
        self.stop_signal: Optional[int] = None  # agreed: the signal that stops the run
        self._pending: Optional[Callable[[], list]] = None
        self._micro_pending: Optional[Callable[[], list]] = None

    def saved(self) -> None:
        """Restart the time-based interval (call after every checkpoint)."""
        self.last_save = self.clock()

    def poll(self) -> tuple[bool, bool]:
        """(stop, time-based save due), the same on every rank. Collective when distributed."""
        local_sig = self.signals.signum or 0
        due = 0
        if self.rank == 0 and self.interval_s > 0 and self.clock() - self.last_save >= self.interval_s:
            due = 1
            self.last_save = self.clock()  # requested: the interval restarts (and saved() again after it)
        if self.start_reduce_max is None:
            decided = [local_sig, due]
        else:
            pending, self._pending = self._pending, self.start_reduce_max([local_sig, due])
            decided = pending() if pending is not None else [0, 0]
        sig, due = (int(v) for v in decided)
        if sig and self.stop_signal is None:
            self.stop_signal = sig
        return bool(sig), bool(due)

    def poll_micro(self) -> bool:
        """Between two micro-batches of a step: whether every rank agreed to stop now (the partial
        step is then discarded). Pipelined by one micro-batch like :meth:`poll`; collective when
        distributed (every rank calls it before the same micro-batches)."""
        local_sig = self.signals.signum or 0
        if self.start_reduce_max is None:
            sig = local_sig
        else:
            pending, self._micro_pending = self._micro_pending, self.start_reduce_max([local_sig])
            sig = int(pending()[0]) if pending is not None else 0
        if sig and self.stop_signal is None:
            self.stop_signal = sig
        return bool(sig)

    def end_micro(self) -> None:
        """Wait for the micro-batch reduction still in flight (at the end of every step)."""
        if self._micro_pending is not None:
            self._micro_pending()
            self._micro_pending = None

    def agree_now(self) -> bool:
        """Whether a stop signal reached any rank (an immediate MAX reduction, not pipelined);
        collective when distributed. Before the first step: a signal that came during start-up."""
        local_sig = self.signals.signum or 0
        sig = int(self.start_reduce_max([local_sig])()[0]) if self.start_reduce_max is not None else local_sig
        if sig and self.stop_signal is None:
            self.stop_signal = sig
        return bool(sig)

    def close(self) -> None:
        """Wait for the reductions still in flight (every rank calls it once, after the loop)."""
        self.end_micro()
        if self._pending is not None:
            self._pending()
            self._pending = None

    @property
    def stop_name(self) -> Optional[str]:
        return signal_name(self.stop_signal) if self.stop_signal else None


def leave_rank(rc: int) -> None:
    """End a distributed rank's process without the interpreter's teardown.

    Left to the teardown, gloo's worker threads can still hold tensors when the interpreter is gone
    and the rank aborts ("terminate called without an active exception", SIGABRT, exit -6 after a
    successful run; seen in CI with the groups destroyed too). Every tool that ran as one rank of a
    job leaves through here once its files are closed: its process groups destroyed (if still
    alive), the atexit handlers run, the streams flushed, then ``os._exit(rc)``.
    """
    import atexit
    import os
    import sys

    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
