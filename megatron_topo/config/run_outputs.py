"""Every folder a training run writes, and three checks made on all of them before anything starts
(issue 29: a run never writes into a folder another run owns, nor over what it did not create).

:func:`run_outputs` lists each output of a run: the config key that names it (as ``--set`` names
it), its folder, what the run writes there and the names it writes directly inside the folder
(a checkpoint's ``latest``, log_dir's ``metrics.jsonl``, ...). Then, for every output:

* :func:`check_names` (two outputs of one run): a folder is never a name another output of the
  same run writes (``distributed.trace_collectives=o1/latest`` with ``save=o1``: the first save
  would fail). Two outputs may share a folder (save = log_dir, a resume of the same config works):
  their names differ.
* :func:`check_shapes`: a file (or a link to one) where the folder goes, or above it, is named with
  the key: ``tensorboard_dir cfg.yml exists and is not a directory; point tensorboard_dir at a
  directory``.
* :func:`check_other_runs`: the folder is not, and does not lie inside, another run's folder: a log
  folder of another run (its ``metrics.jsonl``, or a ``config.yml`` a run wrote) or a folder a
  running job holds locked (``.megatron_topo.lock``, live); this run's own save and log_dir do not
  count. (Checkpoint save and step folders and HF exports: safe_outputs.check_output_folder.)
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Optional

from ..error_lines import brief
from .options import ConfigError

LOCK = r"\.megatron_topo\.lock.*"


class Output(NamedTuple):
    key: str  # the key as --set names it ("log_dir" for the folders it implies)
    path: str
    what: str
    names: tuple  # ((regex, phrase), ...): names this output writes directly inside ``path``


def run_outputs(cfg) -> list[Output]:
    """Every output folder of a training run, with the names each writes there."""
    lg, c, d = cfg.logging, cfg.checkpoint, cfg.distributed
    out = []
    if c.save:
        out.append(
            Output(
                "save",
                c.save,
                "checkpoints",
                (
                    (r"latest(\.tmp\.[0-9]+)?", "the checkpoint pointer 'latest'"),
                    (r"(\.tmp_)?global_step[0-9]+(\.old)?", "a checkpoint step folder"),
                    (LOCK, "the run lock"),
                ),
            )
        )
    out.append(
        Output(
            "log_dir",
            lg.log_dir,
            "metrics.jsonl, config.yml and its lock",
            (
                (r"config\.yml(\.tmp\.[0-9]+)?", "the effective config config.yml"),
                (r"metrics\.jsonl(\.[0-9]+|\.superseded|\.tmp.*)?", "the metrics file"),
                (LOCK, "the run lock"),
            ),
        )
    )
    tb_key = "tensorboard_dir" if lg.tensorboard_dir else "log_dir"
    tb = lg.tensorboard_dir or os.path.join(lg.log_dir, "tensorboard")
    out.append(
        Output(tb_key, tb, "TensorBoard event files", ((r"events\.out\.tfevents\..*", "a TensorBoard event file"),))
    )
    if lg.profile:
        out.append(
            Output(tb_key, os.path.join(tb, "profile"), "profile traces", ((r"rank[0-9]+_steps.*", "a profile trace"),))
        )
    if lg.memory_profiling:
        mem_key = "memory_profiling_path" if lg.memory_profiling_path else tb_key
        mem = lg.memory_profiling_path or os.path.join(tb, "profile")
        out.append(Output(mem_key, mem, "memory snapshots", ((r"rank[0-9]+_steps.*", "a memory snapshot"),)))
    cache = cfg.data.data_cache_dir or "data_cache"  # data/build.py's default
    out.append(
        Output(
            "data_cache_dir",
            cache,
            "index caches",
            ((r"builtin_stdlib_.*", "the built-in corpus"),),  # index/: a folder (shared, as any)
        )
    )
    if d.trace_collectives:
        out.append(
            Output(
                "distributed.trace_collectives",
                d.trace_collectives,
                "rank_N.jsonl trace files",
                ((r"rank_[0-9]+\.jsonl.*", "a collective trace file"),),
            )
        )
    return out


def _show(o: Output) -> str:
    return f"{o.key} {o.path}"


def check_names(outputs: list[Output]) -> None:
    """No output folder is (or lies inside) a name that another output of the run writes."""
    for a in outputs:
        real_a = os.path.realpath(a.path)
        for b in outputs:
            if b is a:
                continue
            rel = os.path.relpath(real_a, os.path.realpath(b.path))
            if rel == "." or rel == ".." or rel.startswith(".." + os.sep):
                continue
            first = rel.split(os.sep)[0]
            for pattern, phrase in b.names:
                if not re.fullmatch(pattern, first):
                    continue
                at = "is" if first == rel else f"lies inside {os.path.join(b.path, first)},"
                raise ConfigError(
                    f"{_show(a)} {at} the name under which {_show(b)} writes {phrase}; the run would fail "
                    f"there (or write {a.what} into it): set {a.key} or {b.key} elsewhere "
                    f"(two outputs of one run may share a folder, not a name)"
                )


def check_shapes(outputs: list[Output]) -> None:
    """A file (or a link to one) where an output folder, or a folder above it, goes: one line with the key."""
    for o in outputs:
        path = o.path
        if os.path.islink(path) and not os.path.exists(path):
            try:
                target = brief(os.readlink(path))
            except OSError:
                target = "?"
            raise ConfigError(
                f"{_show(o)} is a symbolic link (to '{target}') that leads nowhere: its target is missing or a "
                f"loop of links; point {o.key} at a directory"
            )
        if os.path.lexists(path) and not os.path.isdir(path):
            raise ConfigError(f"{_show(o)} exists and is not a directory; point {o.key} at a directory")
        norm = os.path.abspath(path)  # x/../cfg.yml
        if not os.path.lexists(path) and os.path.lexists(norm) and not os.path.isdir(norm):
            raise ConfigError(
                f"{_show(o)} leads to {norm}, which exists and is not a directory; point {o.key} at a directory"
            )
        p = os.path.dirname(norm)
        while p and not os.path.lexists(p) and os.path.dirname(p) != p:
            p = os.path.dirname(p)
        if p and os.path.lexists(p) and not os.path.isdir(p):
            raise ConfigError(f"{_show(o)}: {p} is a file, not a directory; point {o.key} at a directory")


EFFECTIVE_HEADER = "# effective config written by megatron_topo (train.py); a later run with this log_dir replaces it\n"


def written_by_a_run(path: str) -> bool:
    """Whether ``path`` is an effective config an earlier run wrote (our header, or, from before the
    header, exactly the canonical dump of a config with a zero_topo block)."""
    import yaml

    from ..safe_files import MIB, read_small_text

    try:
        text = read_small_text(path, 4 * MIB, OSError)
    except OSError:
        return False
    if text.startswith(EFFECTIVE_HEADER):
        return True
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "zero_topo" in data and yaml.safe_dump(data, sort_keys=False) == text


def _has_run_header(path: str) -> bool:
    """Whether ``path`` starts with the header a run writes on its effective config. (A checkpoint's
    step folder keeps a header-less copy: the header alone marks a run's log folder.)"""
    try:
        with open(path, "rb") as f:
            return f.read(len(EFFECTIVE_HEADER)) == EFFECTIVE_HEADER.encode()
    except OSError:
        return False


def other_run_folder(folder: str, locks: bool = True, logs: bool = True) -> Optional[str]:
    """Why ``folder`` belongs to another run (a phrase), or None: a folder a running job holds
    locked (``locks``), another run's log folder (``logs``)."""
    from .. import runlock

    lock = os.path.join(folder, runlock.LOCK_NAME)
    if locks and os.path.lexists(lock):
        try:
            owner = runlock._read(lock)
        except runlock.LockError:
            owner = None  # not a lock of ours: the lock itself refuses it where a run locks
        if owner is not None and runlock.stale_reason(owner, lock) is None:
            return f"a folder of a running job ({runlock.describe(owner)}; lock {lock})"
    if not logs:
        return None
    if os.path.isfile(os.path.join(folder, "metrics.jsonl")):
        return "another run's log folder (it holds metrics.jsonl)"
    if os.path.isfile(os.path.join(folder, "config.yml")) and _has_run_header(os.path.join(folder, "config.yml")):
        return "another run's log folder (it holds the config.yml a run wrote)"
    return None


def check_other_runs(outputs: list[Output], save: Optional[str], log_dir: Optional[str]) -> None:
    """No output folder is, or lies inside, another run's folder (:func:`other_run_folder`). This
    run's ``save`` and ``log_dir`` hold its own locks; its log_dir is its own log folder, and so is a
    save folder that already holds checkpoints (the run continues that series: a resume that moves
    its log_dir elsewhere still saves there)."""
    from ..safe_outputs import artifact_kind

    own_locks = {os.path.realpath(f) for f in (save, log_dir) if f}
    own_logs = {os.path.realpath(log_dir)} if log_dir else set()
    if save and (artifact_kind(os.path.realpath(save)) or "").startswith("a checkpoint save folder"):
        own_logs.add(os.path.realpath(save))
    for o in outputs:
        real = os.path.realpath(o.path)
        p = real
        while True:
            why = other_run_folder(p, locks=p not in own_locks, logs=p not in own_logs)
            if why:
                at = "is" if p == real else "lies inside"
                raise ConfigError(
                    f"{_show(o)} {at} {p}, {why}; the run would write {o.what} into it: set {o.key} to a "
                    f"folder of its own"
                )
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
