"""GPT-NeoX's profiling keys, done with PyTorch's own tools (docs/profiling.md).

The window: ``profile_step_start`` and ``profile_step_stop`` count the steps done before a step, as
GPT-NeoX's ``iteration`` does, so the window [start, stop) profiles the steps metrics.jsonl numbers
``start + 1 .. stop`` (GPT-NeoX's defaults 10 and 12: steps 11 and 12). Every rank profiles the
same steps and no collective is added.

* ``profile: true``: a ``torch.profiler.profile`` (CPU activity, + CUDA on a CUDA/ROCm device; no
  shapes or stacks) records the window's steps, each inside a ``step N`` range (forward, backward
  and optimizer-step ranges inside it), and each rank writes its Chrome/Perfetto trace
  ``{tensorboard_dir}/profile/rank{R}_steps{a}-{b}.pt.trace.json`` (``tensorboard_dir`` defaults to
  ``{log_dir}/tensorboard``; TensorBoard's profiler plugin and https://ui.perfetto.dev read it). On a
  CUDA/ROCm device the same ranges are NVTX ranges, and the window is bracketed by
  cudaProfilerStart/Stop, for ``nsys profile --capture-range=cudaProfilerApi`` (on CPU: no NVTX).
* ``profile_backward: true`` (with profile, on a CUDA/ROCm device): an NVTX range per autograd node
  of each backward in the window, named as the node (``MmBackward0``...), from hooks on the graph's
  nodes (PyTorch runs one profiler per thread, so ``emit_nvtx`` cannot run under the trace). On CPU
  it is refused: the trace already shows every backward op.
* ``memory_profiling: true`` (on a CUDA/ROCm device; refused on CPU, which has no allocator
  history): CUDA memory history (``torch.cuda.memory._record_memory_history``) over the window,
  dumped per rank as ``{memory_profiling_path}/rank{R}_steps{a}-{b}.mem_snapshot.pickle``
  (https://pytorch.org/memory_viz reads it; the folder defaults to the trace folder).

A file is never written over anything: the finished temporary file is hard-linked to its name (an
existing name gets ``.1``, ``.2`` ... before the suffix), so a trace appears whole or not at all.
"""

from __future__ import annotations

import errno
import os
from typing import Callable, Optional

import torch

from .. import atomic
from ..config import Config, ConfigError
from ..config.checks import profile_window
from ..safe_outputs import check_output_folder, checkpoint_step_above

TRACE_SUFFIX = ".pt.trace.json"
SNAPSHOT_SUFFIX = ".mem_snapshot.pickle"
MEMORY_ENTRIES = 100_000  # allocation events kept by the CUDA memory history


def trace_dir(cfg: Config) -> str:
    lg = cfg.logging
    return os.path.join(lg.tensorboard_dir or os.path.join(lg.log_dir, "tensorboard"), "profile")


def memory_dir(cfg: Config) -> str:
    return cfg.logging.memory_profiling_path or trace_dir(cfg)


def file_name(rank: int, first: int, last: int, suffix: str) -> str:
    """``rank{R}_steps{first}-{last}{suffix}``: the steps numbered as metrics.jsonl numbers them."""
    return f"rank{rank}_steps{first}-{last}{suffix}"


def check(cfg: Config, device: torch.device) -> None:
    """Before the run builds anything (every rank, the same verdict): what the device cannot do,
    and output folders that cannot be written or lie inside a checkpoint."""
    lg = cfg.logging
    gpu = device.type == "cuda"
    if lg.memory_profiling and not gpu:
        raise ConfigError(
            f"memory_profiling records the CUDA allocator's history (torch.cuda.memory._record_memory_history) "
            f"and this run's device is {device.type}, which has none; drop memory_profiling (profile: true "
            f"traces the steps on CPU) or run on a GPU"
        )
    if lg.profile and lg.profile_backward and not gpu:
        raise ConfigError(
            f"profile_backward emits an NVTX range per backward op for nsys, which needs a CUDA/ROCm device, "
            f"and this run's device is {device.type}; drop profile_backward (profile: true's trace already "
            f"shows every backward op)"
        )
    tb_key = "tensorboard_dir" if lg.tensorboard_dir else "log_dir"  # the key that names the folder
    own = (cfg.checkpoint.save,) if cfg.checkpoint.save else ()
    if cfg.distributed.trace_collectives:  # the collective trace: a folder of its own, as log_dir
        from ..zero_topo.trace import check_folder_owner

        check_folder_owner(cfg.distributed.trace_collectives, cfg.checkpoint.save, lg.log_dir, ConfigError)
    if lg.profile:
        _check_folder(tb_key, trace_dir(cfg), "profile traces", own)
    if lg.memory_profiling:
        _check_folder(
            "memory_profiling_path" if lg.memory_profiling_path else tb_key,
            memory_dir(cfg),
            "memory snapshots",
            own,
            named=bool(lg.memory_profiling_path),
        )


def _check_folder(key: str, path: str, what: str, own: tuple = (), named: bool = False) -> None:
    step = checkpoint_step_above(path)
    if step is not None:
        raise ConfigError(
            f"{key}: the {what} folder {path} lies inside the checkpoint folder {step}; set {key} elsewhere"
        )
    check_output_folder(key, path, ConfigError, own=own, derived=[] if named else [(path, what)], what=what)
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise ConfigError(f"{key}: the {what} go to {path}, but {p} is not a folder; set {key} elsewhere")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}: the {what} go to {path}, but {p} cannot be written (permission denied); set {key} elsewhere"
        )


def publish(tmp: str, path: str, suffix: str) -> str:
    """Give the finished file ``tmp`` the name ``path`` without replacing anything: ``path``, else
    ``{stem}.1{suffix}``, ``.2`` ... (a hard link, or where the filesystem has none, a name claimed
    with O_EXCL and renamed over). Returns the name taken."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    stem = path[: -len(suffix)]
    for n in range(10_000):
        target = path if n == 0 else f"{stem}.{n}{suffix}"
        try:
            os.link(tmp, target)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                continue
            os.replace(tmp, target)
        else:
            os.remove(tmp)
        atomic.fsync_dir(os.path.dirname(os.path.abspath(target)))
        return target
    raise OSError(errno.EEXIST, "no free name", path)


def backward_ranges(root: torch.Tensor, push: Callable[[str], None], pop: Callable[[], None]) -> int:
    """Put a range (``push(name)`` before, ``pop()`` after) around every autograd node of the graph
    behind ``root`` (hooks on the nodes; they go with the graph). Returns the number of nodes."""
    seen, todo = set(), [root.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = fn.name()
        fn.register_prehook(lambda grads, name=name: push(name))
        fn.register_hook(lambda grad_in, grad_out: pop())
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return len(seen)


class _Nvtx:
    """NVTX ranges on a CUDA/ROCm device; nothing elsewhere."""

    def __init__(self, on: bool):
        self.on = on

    def push(self, name: str) -> None:
        if self.on:
            torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        if self.on:
            torch.cuda.nvtx.range_pop()


class StepProfiler:
    """The profiling of one run's window (see the module's text). :func:`install` wires it into a
    Trainer; :meth:`close` ends a window the run left early (a stop signal) and writes what it has."""

    def __init__(self, cfg: Config, rank: int, device: torch.device, log: Callable[[str], None] = print):
        lg = cfg.logging
        self.rank, self.log = rank, log
        self.gpu = device.type == "cuda"
        self.trace, self.memory = lg.profile, lg.memory_profiling and self.gpu
        self.backward_nvtx = lg.profile and lg.profile_backward and self.gpu
        self.start, self.stop = profile_window(lg)
        self.trace_dir, self.memory_dir = trace_dir(cfg), memory_dir(cfg)
        self.nvtx = _Nvtx(self.gpu and lg.profile)  # roctx ranges on ROCm
        self.capture = self.gpu and lg.profile and torch.version.hip is None  # cudaProfilerStart/Stop: CUDA only
        self.written: list[str] = []
        self._prof = None
        self._first: Optional[int] = None  # metrics number of the window's first step run here
        self._last: Optional[int] = None
        self._ranges: list = []  # open record_function ranges of the current step

    def in_window(self, done: int) -> bool:
        return self.start <= done < self.stop

    # ---- the ranges of a step
    def _open(self, name: str) -> None:
        self.nvtx.push(name)
        rf = torch.profiler.record_function(name) if self._prof is not None else None
        if rf is not None:
            rf.__enter__()
        self._ranges.append(rf)

    def _shut(self) -> None:
        rf = self._ranges.pop()
        if rf is not None:
            rf.__exit__(None, None, None)
        self.nvtx.pop()

    # ---- the window
    def _begin(self, step: int) -> None:
        if self._first is not None:
            return
        self._first = step
        if self.trace:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.gpu:
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=acts)
            self._prof.start()
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_ENTRIES)
        if self.capture:
            torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi

    def close(self) -> None:
        """End the window (after its last step, or early when the run stops inside it) and write
        this rank's files."""
        if self._first is None:
            return
        first, last = self._first, self._last
        self._first = self._last = None
        while self._ranges:
            self._shut()
        if self.capture:
            torch.cuda.profiler.stop()
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()
        if last is None:  # stopped inside the window's first step: no whole step to show
            if self.memory:
                torch.cuda.memory._record_memory_history(enabled=None)
            self.log(f"profile: the run stopped inside step {first}, the window's first: nothing written")
            return
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        if prof is not None:
            path = os.path.join(self.trace_dir, file_name(self.rank, first, last, TRACE_SUFFIX))
            self._write(path, TRACE_SUFFIX, prof.export_chrome_trace, steps)
        if self.memory:
            path = os.path.join(self.memory_dir, file_name(self.rank, first, last, SNAPSHOT_SUFFIX))
            try:
                self._write(path, SNAPSHOT_SUFFIX, torch.cuda.memory._dump_snapshot, steps)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        if self.written:
            self.log(f"profile: {steps} written: {', '.join(self.written)} (and the same per rank)")

    def _write(self, path: str, suffix: str, writer: Callable[[str], None], steps: str) -> None:
        """Write one file; a failure (the disk filled, the folder's permissions changed since the
        start) is one line from the rank it hit, and training goes on."""
        tmp = atomic.temp_name(path)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writer(tmp)
            self.written.append(publish(tmp, path, suffix))
        except OSError as e:
            print(
                f"profile: rank {self.rank} could not write {path} ({steps}): {e.strerror or e}; training goes on",
                flush=True,
            )
        finally:
            atomic.remove_quietly(tmp)

    # ---- the wrappers install() puts on a Trainer
    def step(self, done: int, inner: Callable[[], Optional[dict]]) -> Optional[dict]:
        if not self.in_window(done):
            return inner()
        self._begin(done + 1)
        self._open(f"step {done + 1}")
        try:
            stats = inner()
        finally:
            while self._ranges:  # the step's range and its optimizer-step range
                self._shut()
        if stats is None:  # stopped between micro-batches: the window ends with the last whole step
            self.close()
            return None
        self._last = done + 1
        if done + 1 >= self.stop:
            self.close()
        return stats

    def forward(self, inner):
        def loss(x, y):
            if self._first is None:
                return inner(x, y)
            self._open("forward")
            try:
                return inner(x, y)
            finally:
                self._shut()

        return loss

    def backward(self, inner):
        def run(loss, m, accum):
            if self._first is None:
                return inner(loss, m, accum)
            if self.backward_nvtx:
                backward_ranges(loss, self.nvtx.push, self.nvtx.pop)
            self._open("backward")
            try:
                inner(loss, m, accum)
            finally:
                self._shut()
            if m == accum - 1:
                self._open("optimizer step")  # shut at the end of the step

        return run


def install(trainer) -> Optional[StepProfiler]:
    """Wrap the trainer's ``train_step``, ``_loss`` and ``_backward`` (instance attributes) with the
    run's profiling; None (nothing wrapped) when neither profile nor memory_profiling is set."""
    cfg, rt = trainer.cfg, trainer.rt
    if not (cfg.logging.profile or cfg.logging.memory_profiling):
        return None
    prof = StepProfiler(cfg, rt.rank, rt.device, trainer.log)
    done = trainer.state.step
    if done >= prof.stop:
        trainer.log(
            f"note: the profile window (steps {prof.start + 1}-{prof.stop}) lies before this run's first step "
            f"{done + 1} (resumed): nothing is profiled"
        )
    step, loss, backward = trainer.train_step, trainer._loss, trainer._backward
    trainer.train_step = lambda: prof.step(trainer.state.step, step)
    trainer._loss = prof.forward(loss)
    trainer._backward = prof.backward(backward)
    return prof
