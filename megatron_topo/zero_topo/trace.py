"""The collective trace (``distributed.trace_collectives: DIR``): every rank appends one JSON line
per collective to ``DIR/rank_{r}.jsonl`` as the collective is issued, before it can block:

    {"seq": 0, "op": "all_gather", "group": [0, 1], "bytes": 4096, "dtype": "bfloat16"}

``seq`` counts this rank's collectives from 0; ``group`` is the ranks of the communicator (sorted);
``bytes`` is the whole buffer the collective moves (S in docs/design.md §4.8: an all-gather's
output, a reduce-scatter's input, an all-to-all's or all-reduce's buffer); ``dtype`` is its element
type. Each line is flushed to the operating system as it is written, so after a hang (or a kill)
the files show the last collective every rank issued, like NCCL's flight recorder. ``DIR`` is a
folder of its own or the run's log_dir: one that is or lies inside a checkpoint, an HF export or
another run's log folder is refused (:func:`check_folder_owner`), as log_dir is.

NCCL and RCCL require that ranks sharing communicators issue their collectives in one consistent
order; the engine issues the same sequence on every rank by construction (docs/design.md §4.7).
:func:`compare_traces` checks that from the files: every rank's sequence of (op, group size,
bytes, dtype) is the same, and the members of each group issued the same collectives on it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
from typing import IO, Optional, Sequence

import torch

from ..cli import interruptible
from ..error_lines import brief, clean

FILE = "rank_{rank}.jsonl"
_NAME = re.compile(r"rank_([0-9]+)\.jsonl$")


def check_dir(path: str, key: str = "distributed.trace_collectives") -> Optional[str]:
    """The reason ``path`` cannot hold the trace files (None when it can): it must be a directory,
    or not exist yet under a writable directory. A symbolic link that leads nowhere (dangling, a
    loop) and a path whose ``..`` lands on a file (``tr/../cfg.yml``) are named as such, before
    anything is created."""
    if os.path.islink(path) and not os.path.exists(path):
        try:
            target = brief(os.readlink(path))
        except OSError:
            target = "?"
        return (
            f"{key} {path} is a symbolic link (to '{target}') that leads nowhere: its target is missing "
            f"or a loop of links; point it at a directory"
        )
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{key} {path} exists and is not a directory; point it at a directory"
    norm = os.path.abspath(path)  # tr/../cfg.yml: the folders would be made before the file is met
    if not os.path.lexists(path) and os.path.lexists(norm) and not os.path.isdir(norm):
        return f"{key} {path} leads to {norm}, which exists and is not a directory; point it at a directory"
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"{key} {path}: {parent} is a file, not a directory"
    probe = path if os.path.isdir(path) else parent
    if probe and not os.access(probe, os.W_OK | os.X_OK):
        return f"{key} {path}: {probe} is not writable; point it at a writable directory"
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if not _NAME.fullmatch(name):
                continue
            st = os.lstat(os.path.join(path, name))
            if not stat.S_ISREG(st.st_mode):
                from ..safe_files import _kind

                kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
                return (
                    f"{key} {path}: {name} is {kind}, not a trace file of an earlier run; the run "
                    f"writes a new rank_N.jsonl in its place: remove {name} or point {key} elsewhere"
                )
    return None


def check_folder_owner(
    path: str, own_save: Optional[str], log_dir: Optional[str], err, key: str = "distributed.trace_collectives"
) -> None:
    """Raise ``err`` when the trace folder ``path`` is or lies inside a folder that another artifact
    owns (a checkpoint step or save folder other than the run's own ``own_save``, a HuggingFace model
    folder: as log_dir and tensorboard_dir are checked), or inside another run's log folder (one
    holding a metrics.jsonl that is not this run's ``log_dir``)."""
    from ..safe_outputs import check_output_folder, log_folder_above

    check_output_folder(  # (whether rank_N.jsonl can be made there: checked below, in its own words)
        key, path, err, own=[own_save] if own_save else [], what="rank_N.jsonl trace files", writable=False
    )
    p = log_folder_above(path, skip=log_dir)
    if p is not None:
        at = "is" if p == os.path.realpath(path) else "lies inside"
        raise err(
            f"{key} {path} {at} {p}, another run's log folder (it holds metrics.jsonl); the run would "
            f"write its rank_N.jsonl trace files into it: set {key} to a folder of its own"
        )


class CollectiveTrace:
    """Appends this rank's collectives to ``DIR/rank_{rank}.jsonl``: a new file per process, made
    under a fresh name of its own (a random suffix, O_EXCL, O_NOFOLLOW: a file already there under
    that name is never touched, another name is drawn) and renamed onto rank_N.jsonl. An earlier
    trace there is replaced, never written into: a link is not followed, and a file hard-linked
    elsewhere keeps its bytes under its other name. Nothing this process did not create is removed."""

    def __init__(self, directory: str, rank: int) -> None:
        import secrets

        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, FILE.format(rank=rank))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        for attempt in range(100):
            tmp = f"{self.path}.{os.getpid()}.{secrets.token_hex(8)}.new"
            try:
                fd = os.open(tmp, flags, 0o644)
                break
            except FileExistsError:  # someone's file under that name: left alone, another name drawn
                if attempt == 99:
                    raise
        try:
            os.replace(tmp, self.path)
        except OSError:
            os.close(fd)
            os.unlink(tmp)
            raise
        self._file: Optional[IO[str]] = os.fdopen(fd, "w", encoding="utf-8")
        self.seq = 0

    def record(self, op: str, ranks: Sequence[int], nbytes: int, dtype: torch.dtype) -> None:
        if self._file is None:
            return
        line = {
            "seq": self.seq,
            "op": op,
            "group": list(ranks),
            "bytes": int(nbytes),
            "dtype": str(dtype).removeprefix("torch."),
        }
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()  # to the OS now: the line survives a hang or a kill of this process
        self.seq += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


MAX_LINE_BYTES = 16 << 20  # a record is ~100 bytes plus its group: 2**20 ranks take ~8 MB


class TraceError(ValueError):
    """A trace folder or file that cannot be read as traces (one line, naming the file)."""


def _problem(rec) -> Optional[str]:
    """Why ``rec`` is not a trace record (None when it is one)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    names = {int: "an integer", str: "a string", list: "a list"}
    for key, kind in (("seq", int), ("op", str), ("group", list), ("bytes", int), ("dtype", str)):
        v = rec.get(key)
        if not isinstance(v, kind) or isinstance(v, bool):
            return f"its {key!r} is {'missing' if key not in rec else repr(v)[:40]}, not {names[kind]}"
    if not rec["group"] or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rec["group"]):
        return "its 'group' is not a non-empty list of rank numbers"
    if rec["bytes"] < 0 or rec["seq"] < 0:
        return "a negative 'seq' or 'bytes'"
    return None


def _read_trace(path: str) -> list[dict]:
    """The records of one ``rank_N.jsonl``: opened without blocking (a FIFO or device is refused,
    never waited on), lines read with a cap; a torn last line (a process killed mid-write) is
    dropped, any other line that is not a record is a :class:`TraceError` naming it."""
    from ..safe_files import _kind

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise TraceError(f"{path} is {_kind(mode)}, not a trace file; refusing to read it")
    records: list[dict] = []
    bad: Optional[str] = None
    ended = True  # whether the last line read ended with a newline
    with os.fdopen(fd, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if bad is not None:  # a bad line followed by more: not a torn last line
                raise TraceError(f"{path}: line {n - 1} is not a trace record ({bad})")
            if len(raw) > MAX_LINE_BYTES:  # no write a process was killed in is this long: not read on
                raise TraceError(f"{path}: line {n} is longer than {MAX_LINE_BYTES:,} bytes, not a trace record")
            ended = raw.endswith(b"\n")
            try:
                rec = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                bad = f"not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}"
                continue
            except (ValueError, RecursionError):
                bad = "not JSON"
                continue
            bad = _problem(rec)
            if bad is None:
                records.append(rec)
    if bad is not None and ended:  # a whole line, not one a killed process left half written
        raise TraceError(f"{path}: its last line is not a trace record ({bad})")
    return records


def load_traces(directory: str) -> dict[int, list[dict]]:
    """Every ``rank_{r}.jsonl`` under ``directory``, by rank (a torn last line is dropped). A rank
    file that is not a regular file, or holds a line that is not a record, is a :class:`TraceError`."""
    out: dict[int, list[dict]] = {}
    for path in glob.glob(os.path.join(glob.escape(directory), "rank_*.jsonl")):
        m = _NAME.search(path)
        if not m:
            continue
        out[int(m.group(1))] = _read_trace(path)
    return dict(sorted(out.items()))


def _key(rec: dict) -> tuple:
    return rec["op"], len(rec["group"]), rec["bytes"], rec["dtype"]


def _show(rec: dict) -> str:
    return f"#{rec['seq']} {rec['op']} over {len(rec['group'])} ranks {rec['group']}, {rec['bytes']} B {rec['dtype']}"


def compare_traces(traces: dict[int, list[dict]], world_size: Optional[int] = None) -> list[str]:
    """Problems (one line each; [] when consistent) of the per-rank traces of one job: a missing
    rank (with ``world_size``), ranks whose sequences of (op, group size, bytes, dtype) differ, and
    groups whose members issued different collectives on them (or in a different order)."""
    problems: list[str] = []
    if world_size is not None:
        missing = sorted(set(range(world_size)) - set(traces))
        if missing:
            problems.append(f"no trace from rank(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if not traces:
        return problems or ["no traces"]
    ref_rank = min(traces)
    ref = traces[ref_rank]
    for r, recs in traces.items():
        if r == ref_rank:
            continue
        for i, (a, b) in enumerate(zip(ref, recs)):
            if _key(a) != _key(b):
                problems.append(f"rank {r} differs from rank {ref_rank} at collective {i}: {_show(b)} vs {_show(a)}")
                break
        else:
            if len(ref) != len(recs):
                problems.append(f"rank {r} issued {len(recs)} collectives, rank {ref_rank} {len(ref)}")
    # each group: its members' subsequences on it must agree (the order NCCL/RCCL need)
    on_group: dict[tuple, dict[int, list[dict]]] = {}
    for r, recs in traces.items():
        for rec in recs:
            g = tuple(rec["group"])
            if r not in g:
                problems.append(f"rank {r} issued a collective on group {list(g)}, which it is not in: {_show(rec)}")
                continue
            on_group.setdefault(g, {}).setdefault(r, []).append(rec)
    for g, per_rank in sorted(on_group.items()):
        members = [r for r in g if r in traces]
        seqs = {r: per_rank.get(r, []) for r in members}
        first = members[0]
        for r in members[1:]:
            a, b = seqs[first], seqs[r]
            for i, (x, y) in enumerate(zip(a, b)):
                if _key(x) != _key(y):
                    problems.append(
                        f"group {list(g)}: its collective {i} is {_show(y)} on rank {r} but {_show(x)} on rank {first}"
                    )
                    break
            else:
                if len(a) != len(b):
                    problems.append(
                        f"group {list(g)}: rank {r} issued {len(b)} collectives on it, rank {first} {len(a)}"
                    )
    return problems


@interruptible
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m megatron_topo.zero_topo.trace DIR [--world-size W]``: compare a job's traces;
    prints each problem (exit 1) or one line saying they agree (exit 0)."""
    import sys

    from ..cli import OneLineParser, bounded, path_arg
    from ..topology import MAX_WORLD_SIZE

    ap = OneLineParser(
        prog="python -m megatron_topo.zero_topo.trace",
        description="Compare the collective traces (distributed.trace_collectives) of one job.",
    )
    ap.add_argument("dir", type=path_arg)
    ap.add_argument(
        "--world-size", type=bounded(int, 1, MAX_WORLD_SIZE), default=None, help="report ranks with no trace"
    )
    a = ap.parse_args(argv)
    if not os.path.isdir(a.dir):
        print(clean(f"error: {a.dir} is not a directory"), file=sys.stderr)
        return 2
    try:
        traces = load_traces(a.dir)
    except TraceError as e:
        print(clean(f"error: {e}"), file=sys.stderr)
        return 2
    if not traces:
        print(clean(f"error: {a.dir} holds no rank_N.jsonl trace files"), file=sys.stderr)
        return 2
    problems = compare_traces(traces, a.world_size)
    for p in problems:
        print(p)
    if problems:
        return 1
    counts = sorted({len(t) for t in traces.values()})
    groups = {tuple(r["group"]) for t in traces.values() for r in t}
    print(f"{len(traces)} ranks issued the same {counts[0]} collectives in the same order over {len(groups)} groups")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
