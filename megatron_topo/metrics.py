"""Training metrics: FLOPs per iteration, TFLOPS/GPU, MFU, peak memory, and the run's log files.

Every run writes ``{log_dir}/metrics.jsonl`` (one JSON object per line, ``{"step": N, ...}``) and
TensorBoard scalars (``{log_dir}/tensorboard`` unless told otherwise). ``tools/plot_metrics.py``
reads the JSONL back.

Keys the training loop logs (``training/trainer.py``) and the plotting tool looks for first: ``loss``,
``eval_loss``, ``lr``, ``grad_norm``, ``loss_scale``, ``step_time_s``, ``tokens_per_sec``,
``samples_per_sec``, ``tflops_per_gpu``, ``peak_mem_bytes``, ``consumed_samples``, the per-level
communication counters ``comm_bytes_{intra_gpu,intra_node,inter_node,control}`` (bytes per step)
and ``model_state_bytes_*``. ``step_time_s`` (and the rates derived from it) is wall clock per step
over the log window, from a step's start to the next one's, less evaluation, checkpoints and writing
the record: the end-of-step agreement and the log reduction (which waits for the device) are in
it, so asynchronous work a step leaves behind (post-step gathers, queued kernels) is counted.

Non-finite floats are written as the JSON *strings* ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``
(plain JSON has no token for them; ``json.dumps`` would emit invalid bare ``NaN``). Every line
is therefore valid strict JSON, the distinction between NaN and +-inf survives, and
:func:`read_metrics` turns the strings back into floats.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import resource
import sys
import warnings
from typing import Any, Iterable, Optional, Union

from .config.schema import ModelConfig
from .safe_files import NotJSON, RepeatedKey, excerpt, parse_json, why_not_a_file

# torch is imported lazily so that reading metrics (tools/plot_metrics.py) does not pay for it;
# a value can only be a tensor if torch is already loaded.


def _is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


METRICS_FILE = "metrics.jsonl"

_NONFINITE_OUT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_NONFINITE_IN = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# ------------------------------------------------------------------------------------ FLOPs
def flops_per_iteration(model_cfg: ModelConfig, global_batch_size: int, checkpoint_activations: bool) -> float:
    """Model FLOPs of one optimizer step: the model spec's forward count (GPT-NeoX:
    ``model.gpt_neox.gpt_flops``) times 4 passes with activation recompute, else 3."""
    from .model.spec import spec_for

    return spec_for(model_cfg).forward_flops(
        model_cfg, global_batch_size, passes=4.0 if checkpoint_activations else 3.0
    )


def tflops_per_gpu(flops_per_iter: float, iter_time_s: float, world_size: int) -> float:
    """Achieved TFLOPS per device (per rank: a GCD on Frontier) for one iteration."""
    if iter_time_s <= 0 or world_size < 1:
        return math.nan
    return flops_per_iter / (iter_time_s * world_size) / 1e12


def mfu(flops_per_iter: float, iter_time_s: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved TFLOPS/GPU over the device's advertised peak."""
    if peak_tflops <= 0:
        return math.nan
    return tflops_per_gpu(flops_per_iter, iter_time_s, world_size) / peak_tflops


# ----------------------------------------------------------------------------------- memory
def peak_memory_bytes(device: Union[str, "torch.device", None] = None) -> int:  # noqa: F821
    """Peak memory of this process: CUDA/ROCm max allocated bytes on a GPU device; on CPU the
    process's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) in bytes."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return int(rss if sys.platform == "darwin" else rss * 1024)


# ------------------------------------------------------------------------------ JSON values
def _plain(value: Any) -> Any:
    """A JSON-safe version of a metric value (tensors/numpy scalars -> Python, non-finite -> str)."""
    if _is_tensor(value):
        value = value.detach().item() if value.numel() == 1 else value.detach().cpu().tolist()
    elif hasattr(value, "tolist") and callable(value.tolist) and not isinstance(value, (str, bytes)):
        value = value.tolist()  # numpy scalar -> Python number, numpy array -> list
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isfinite(v):
            return v
        return _NONFINITE_OUT["nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _scalars(values: dict, prefix: str = "") -> Iterable[tuple[str, float]]:
    """(tag, number) for every numeric value; nested dicts become ``outer/inner`` tags."""
    for k, v in values.items():
        tag = f"{prefix}{k}"
        if _is_tensor(v) and v.numel() == 1:
            v = v.item()
        if isinstance(v, dict):
            yield from _scalars(v, tag + "/")
        elif isinstance(v, bool):
            yield tag, float(v)
        elif isinstance(v, numbers.Real):
            yield tag, float(v)


def _restore(value: Any) -> Any:
    if isinstance(value, str) and value in _NONFINITE_IN:
        return _NONFINITE_IN[value]
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


# ----------------------------------------------------------------------------------- writer
class MetricsWriter:
    """Appends ``{"step": step, **values}`` lines to ``{log_dir}/metrics.jsonl`` and writes every
    numeric value as a TensorBoard scalar (tag = key; nested dicts as ``key/sub``).

    Only rank 0 should write: pass ``enabled=False`` elsewhere and every call is a no-op (no
    directories, files or TensorBoard writer are created). Resuming a run appends to the existing
    file; a last line left unterminated by a crash is closed first so the next record stays on
    its own line. ``tensorboard=False`` (or TensorBoard missing) writes the JSONL only.

    ``fresh=True`` (a run that did not resume from a checkpoint) never appends to another run's
    records: an existing non-empty ``metrics.jsonl`` is first renamed to ``metrics.jsonl.N`` (the
    first unused N >= 1; ``self.moved_to`` names it), and so is the default TensorBoard folder.

    ``resume_step=N`` (a run resumed from the checkpoint of step N) keeps every step once: records
    of steps after N, written by a job that was killed after its last checkpoint, are moved to
    ``metrics.jsonl.superseded`` (appended, in file order; ``self.superseded`` counts them) and
    TensorBoard drops its events after step N (``purge_step``).
    """

    def __init__(
        self,
        log_dir: str,
        tensorboard_dir: Optional[str] = None,
        enabled: bool = True,
        *,
        tensorboard: bool = True,
        fresh: bool = False,
        resume_step: Optional[int] = None,
    ):
        self.enabled = enabled
        self.log_dir = log_dir
        self.tensorboard_dir = tensorboard_dir or os.path.join(log_dir, "tensorboard")
        self.path = os.path.join(log_dir, METRICS_FILE)
        self._file = None
        self._tb = None
        self.moved_to = None
        self.superseded = 0
        if not enabled:
            return
        os.makedirs(log_dir, exist_ok=True)
        if fresh and os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
            n = 1
            while os.path.exists(f"{self.path}.{n}"):
                n += 1
            os.replace(self.path, f"{self.path}.{n}")
            self.moved_to = f"{self.path}.{n}"
            if (
                tensorboard_dir is None
                and os.path.isdir(self.tensorboard_dir)
                and not os.path.exists(f"{self.tensorboard_dir}.{n}")
            ):
                os.replace(self.tensorboard_dir, f"{self.tensorboard_dir}.{n}")
        if resume_step is not None and not fresh:
            self.superseded = _move_superseded(self.path, int(resume_step))
        needs_newline = False
        if os.path.isfile(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._file = open(self.path, "a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")
            self._file.flush()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard not installed
                warnings.warn(f"TensorBoard unavailable ({e}); writing {self.path} only", stacklevel=2)
            else:
                os.makedirs(self.tensorboard_dir, exist_ok=True)
                self._tb = SummaryWriter(
                    log_dir=self.tensorboard_dir,
                    purge_step=(int(resume_step) + 1 if resume_step is not None and not fresh else None),
                )

    def log(self, step: int, values: dict) -> None:
        if not self.enabled:
            return
        if self._file is None:
            raise RuntimeError(f"MetricsWriter for {self.path} is closed")
        record = {"step": int(step)}
        for k, v in values.items():
            if k == "step":
                raise ValueError("metrics key 'step' is reserved; pass the step as the first argument")
            record[str(k)] = _plain(v)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for tag, v in _scalars(values):
                self._tb.add_scalar(tag, v, int(step))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_step(value) -> bool:
    """A record's step as MetricsWriter writes it: a JSON integer (not a float such as ``1e-400`` or
    ``5.0000000000000001``, which would read as another step, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _move_superseded(path: str, step: int) -> int:
    """Move the records of steps after ``step`` from ``path`` to ``path.superseded``; returns how many.

    Lines that are not records (a crash mid-write) stay where they are. The kept lines are written
    to a temporary file that replaces ``path`` (atomic), after the moved ones reached the side file.
    """
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return 0
    keep, moved = [], []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            try:
                rec = parse_json(line, unique_keys=True)
            except NotJSON:  # not a record (a crash mid-write, nesting too deep ...): it stays
                rec = None
            later = isinstance(rec, dict) and is_step(rec.get("step")) and rec["step"] > step
            (moved if later else keep).append(line if line.endswith("\n") else line + "\n")
    if not moved:
        return 0
    with open(f"{path}.superseded", "a", encoding="utf-8", errors="surrogateescape") as f:
        f.writelines(moved)
        f.flush()
        os.fsync(f.fileno())
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(moved)


def drop_superseded(records: list[dict]) -> tuple[list[dict], int]:
    """The records of one run's history: where a step is lower than one before it (a job resumed
    from an earlier checkpoint; files written before resumes moved such records aside), the earlier
    records of that step and later are dropped. Returns (records, how many were dropped)."""
    out: list[dict] = []
    dropped = 0
    for rec in records:
        s = rec.get("step")
        if out and isinstance(s, (int, float)) and not isinstance(s, bool):
            last = out[-1].get("step")
            if isinstance(last, (int, float)) and s < last:
                n = len(out)
                out = [r for r in out if not (isinstance(r.get("step"), (int, float)) and r["step"] >= s)]
                dropped += n - len(out)
        out.append(rec)
    return out, dropped


# ----------------------------------------------------------------------------------- reader
MAX_RECORD_CHARS = 1 << 20  # one of our records is a few hundred characters
SKIPS_NAMED = 5  # skipped lines named one by one; the rest are counted in one warning


def _capped_lines(f):
    """Lines of a text file read with a cap: a longer line is consumed in pieces and yields None."""
    while True:
        line = f.readline(MAX_RECORD_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_RECORD_CHARS and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = f.readline(MAX_RECORD_CHARS)
            yield None
            continue
        yield line


def metrics_path(path_or_run_dir: str) -> str:
    """``RUN_DIR/metrics.jsonl`` for a directory, the path itself otherwise."""
    if os.path.isdir(path_or_run_dir):
        return os.path.join(path_or_run_dir, METRICS_FILE)
    return path_or_run_dir


def read_metrics(path_or_run_dir: str, last_per_step: bool = False, keep_bad_steps: bool = False) -> list[dict]:
    """Records of a run's ``metrics.jsonl`` (a run directory or the file itself), in file order,
    with ``"NaN"``/``"Infinity"``/``"-Infinity"`` turned back into floats.

    A record whose step is not a JSON integer (:func:`is_step`: ``1e-400`` would read as step 0) is
    skipped with the same warning as a bad line, unless ``keep_bad_steps`` (plot_metrics refuses
    such a file in one line instead). A line that is not valid JSON (a crash mid-write), not a record, or longer than
    MAX_RECORD_CHARS (read with that cap, never whole) is skipped with a warning naming the file
    and line; past SKIPS_NAMED such lines, one more warning counts the rest.
    ``last_per_step=True`` returns one record per step, sorted by step, merging the records of a
    step in file order so later values win (an eval record may share a step with the training
    record), after dropping the records a resume superseded (:func:`drop_superseded`: a
    file written before resumes moved them aside repeats the steps after a checkpoint).
    Raises ``FileNotFoundError`` when there is no metrics file.
    """
    path = metrics_path(path_or_run_dir)
    if not os.path.isfile(path):
        why = why_not_a_file(path)
        raise FileNotFoundError(f"{path}: no such metrics file" if why == "file not found" else f"{path} {why}")
    out, skipped = [], []  # skipped: (line number, why)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(_capped_lines(f), 1):
            if line is None:
                skipped.append((lineno, f"a line longer than {MAX_RECORD_CHARS:,} characters, not a record"))
                continue
            line = line.strip()
            if not line:
                continue
            try:
                rec = parse_json(line, unique_keys=True)
            except NotJSON as e:
                c = e.cause
                if isinstance(c, RepeatedKey):  # {"step": 9, "step": 1}: which one is meant is unknown
                    why = f"a line that is not a record ({c})"
                elif isinstance(c, json.JSONDecodeError):
                    why = f"a line that is not valid JSON ({c.msg})"
                elif isinstance(c, RecursionError):
                    why = "a line nested too deeply to be a record"
                else:  # an integer of more than 4,300 digits (int_max_str_digits)
                    why = f"a line that is not a record ({str(c).split(':')[0][:80]})"
                skipped.append((lineno, why))
                continue
            if not isinstance(rec, dict) or "step" not in rec:
                skipped.append((lineno, "a record without a 'step' key"))
                continue
            if not keep_bad_steps and not is_step(rec["step"]):
                shown = excerpt(rec["step"]) if isinstance(rec["step"], str) else repr(rec["step"])[:40]
                skipped.append((lineno, f"a record whose step {shown} is not a JSON integer"))
                continue
            out.append(_restore(rec))
    for lineno, why in skipped[:SKIPS_NAMED]:
        warnings.warn(f"{path}:{lineno}: skipping {why}", stacklevel=2)
    if len(skipped) > SKIPS_NAMED:
        warnings.warn(f"{path}: skipping {len(skipped) - SKIPS_NAMED:,} more lines of these kinds", stacklevel=2)
    if last_per_step:
        out = drop_superseded(out)[0]
        by_step: dict = {}
        for rec in out:
            by_step.setdefault(rec["step"], {}).update(rec)
        out = [by_step[s] for s in sorted(by_step)]
    return out
