"""Command-line helpers shared by train.py and tools/*.py: bad arguments are one line."""

from __future__ import annotations

import argparse
import math
import os
import sys

from .error_lines import LINE_CAP, clean, emit, problem_lines


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr,
    ``error: MESSAGE (usage: ...)``, with exit code 2 (not the usage block plus the error).

    ``usage_line`` replaces the generated usage in that line (``--help`` is unchanged);
    ``error_status`` replaces the exit code. ``job_tool``: a tool that runs as the ranks of a job
    (train, gpu_check, measure_collectives, fsdp_baseline): only rank 0 prints the line, the other
    ranks exit with the same status (:func:`other_rank_of_job`: also ranks started by hand).
    """

    def __init__(self, *args, usage_line: str | None = None, error_status: int = 2, job_tool: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.usage_line, self.error_status, self.job_tool = usage_line, error_status, job_tool

    def error(self, message):
        if self.job_tool and other_rank_of_job():  # each rank parses the same argv: rank 0 says it, once per job
            self.exit(leave_to_rank_0(self.error_status))
        usage = self.usage_line or " ".join(self.format_usage().split())[len("usage: ") :]
        head = clean(f"error: {message}")
        room = LINE_CAP - 1 - len(head) - len(" (usage: )")  # under the cap, as the tests assert
        if len(usage) > room:  # the message stays whole; a long usage is shortened (--help has it all)
            usage = usage[: max(room - len(" ... see --help"), 0)].rstrip() + " ... see --help"
        self.exit(self.error_status, clean(f"{head} (usage: {usage})") + "\n")


def _other_rank() -> bool:
    """Whether this process is a rank other than 0 of a job that a launcher started: torchrun
    (TORCHELASTIC_RUN_ID, RANK) or an srun step of several tasks (SLURM_STEP_ID, SLURM_PROCID). Every
    rank parses the same argv, so its argument error is rank 0's too. A RANK merely left in the
    environment of a shell (no launcher's variable) does not count: that process prints its line."""
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        r, n = env.get("RANK", ""), env.get("WORLD_SIZE", "")
    elif env.get("SLURM_STEP_ID"):
        r, n = env.get("SLURM_PROCID", ""), env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", ""))
    else:
        return False
    return _rank_above_0(r, n)


def _rank_above_0(rank: str, world: str) -> bool:
    """Whether the texts of a rank and a world size (ASCII digits only: '²' is a digit to
    str.isdigit but not to int()) make a rank 1..world-1."""
    ok = all(t.isascii() and t.isdigit() for t in (rank, world))
    return ok and 0 < int(rank) < int(world)


def other_rank_of_job() -> bool:
    """For an error about a job-wide launcher variable (``e.job_wide``: MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE ..., given to every rank with the same value): whether this process is a rank other than
    0 of a job whose rank 0 reads the same variables and prints the line. A rank >0 of a launched job
    (:func:`_other_rank`), or a process whose own variables make it rank 1..WORLD_SIZE-1 of a world of
    several ranks meeting at MASTER_ADDR:MASTER_PORT (ranks started by hand): such a process cannot run
    without its rank 0. Without all four variables, the process prints its line."""
    if _other_rank():
        return True
    env = os.environ
    r, n = env.get("RANK", ""), env.get("WORLD_SIZE", "")
    has_master = bool(env.get("MASTER_ADDR") and env.get("MASTER_PORT"))
    return has_master and _rank_above_0(r, n)


LINGER_S = 20.0  # how long a quiet rank waits for its launcher to end it after rank 0's line
_LAUNCHERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch", b"slurmstepd")


def leave_to_rank_0(status: int) -> int:
    """``status``, for a rank other than 0 that leaves an error every rank found to rank 0 (it prints
    nothing). Under a launcher that ends the whole job when its first rank fails (torchrun's agent, an
    srun step with --kill-on-bad-exit: this process's parent), a quiet rank that left first would get
    rank 0 killed before it printed its line: such a rank waits, at most LINGER_S, for the launcher
    to end it once rank 0 has failed; a stop signal ends the wait at once (default action)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read(4096)
    except OSError:
        return status
    if not any(name in parent for name in _LAUNCHERS):
        return status
    import signal
    import sys
    import time

    sys.stdout.flush()
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    except ValueError:  # not the main thread: leave at once
        return status
    time.sleep(LINGER_S)
    return status


def fail(e: BaseException, path: str = "", status: int = 2) -> int:
    """Print the one ``error:`` line for an expected failure of a tool and return its exit status:
    an OSError as ``PATH: reason`` (``path`` when the error names no file), anything else as its
    message; escaped and capped (error_lines.clean): a line separator in a user's value inside the
    message is escaped, never split at. Only a config file's several problems (``problems``) are
    several lines, one ``error:`` line each. An error about a job-wide launcher variable
    (``job_wide``) is printed by rank 0 of the job only (:func:`other_rank_of_job`)."""
    if getattr(e, "job_wide", False) and other_rank_of_job():
        return leave_to_rank_0(status)
    if isinstance(e, OSError):
        lines = [f"{e.filename or path}: {e.strerror or e}"]
    else:
        lines = problem_lines(e)
    for line in lines:
        emit("error", line)
    return status


def path_arg(text: str) -> str:
    """An argparse ``type=`` for a file or folder path: an empty or blank value (``--json ''``, an
    unset shell variable) is refused naming the flag, never read as "no file", the current folder or
    a file called " "."""
    from .error_lines import brief

    if not str(text).strip():
        raise argparse.ArgumentTypeError(f"'{brief(text, 40)}' is {'blank' if text else 'empty'}; give a path")
    return text


INTERRUPTED = "error: interrupted; nothing written"  # as preprocess_data and bench_data said first
INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped


def interruptible(main=None, *, preload: tuple = ()):
    """The wrapper of every command's ``main`` (tools/*.py, train.py and the ``megatron-topo-*``
    entry points all call it): Ctrl-C (KeyboardInterrupt, also while ``main``'s own imports run) is
    one line, :data:`INTERRUPTED`, and exit status 130, no traceback; a rank other than 0 of a job
    says nothing (the whole job got the Ctrl-C; rank 0 says it). The tools' outputs are written
    under temporary names and renamed (atomic.py), so an interrupted tool leaves nothing half-written.

    ``@interruptible(preload=("torch",))``: the packages the command will import (numpy, torch,
    matplotlib) are imported first, under :class:`held_interrupt`: a Ctrl-C inside their compiled
    setup would otherwise be lost (the tool runs on) or become an ImportError traceback."""
    import functools

    if main is None:
        return lambda m: interruptible(m, preload=preload)

    @functools.wraps(main)
    def run(argv=None) -> int:
        try:
            if preload:
                import importlib

                with held_interrupt():  # a Ctrl-C meanwhile is raised when the imports are done
                    for name in preload:
                        importlib.import_module(name)
            return main(argv)
        except KeyboardInterrupt:
            if not other_rank_of_job():
                try:
                    print(INTERRUPTED, file=sys.stderr, flush=True)
                except (KeyboardInterrupt, OSError):  # a second Ctrl-C, a closed terminal: the status says it
                    pass
            return INTERRUPTED_STATUS

    run.interruptible = True
    return run


def light_entry(implementation: str):
    """``main, __getattr__`` of a command module that imports nothing heavy: ``main`` is
    :func:`interruptible` and imports ``implementation`` (the tool, with its torch imports) under
    :class:`held_interrupt` before running its ``main``; the module's other names (its helpers, for
    tests) are the implementation's. A dunder is not (the import system asks for ``__path__`` and
    others: they must import nothing)."""
    import importlib

    def main(argv=None) -> int:
        return importlib.import_module(implementation).main(argv)

    main.__name__ = main.__qualname__ = "main"

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {implementation.removesuffix('_run')!r} has no attribute {name!r}")
        return getattr(importlib.import_module(implementation), name)

    return interruptible(main, preload=(implementation,)), __getattr__


class held_interrupt:
    """``with held_interrupt(): import torch ...``: a Ctrl-C (SIGINT) during the block is held and raised
    as KeyboardInterrupt when the block ends (so :func:`interruptible` prints its one line). Importing
    numpy and torch is not safe to interrupt: a KeyboardInterrupt inside their C-extension setup is lost
    (the tool then runs on) or becomes ``ImportError: cannot load module more than once per process``.
    SIGINT is blocked in this (the main) thread for the block only; elsewhere, a no-op."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        return self

    def __exit__(self, *exc):
        import signal

        if self.old is not None:  # a SIGINT held meanwhile is delivered now: KeyboardInterrupt
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
        return False


def _interval(lo, hi, lo_open: bool, hi_open: bool) -> str:
    show = lambda v: f"{v:,}" if isinstance(v, int) else f"{v:g}"  # noqa: E731
    if hi is None:
        return f"{'>' if lo_open else '>='} {show(lo)}"
    return f"in {'(' if lo_open else '['}{show(lo)}, {show(hi)}{')' if hi_open else ']'}"


# a size flag's unit in bytes: a positive size (lower bound 0 excluded) below one byte is refused
BYTE_UNITS = {"B": 1, "KB": 1e3, "KiB": 1024, "MB": 1e6, "MiB": 2**20, "GB": 1e9, "GiB": 2**30}


def bounded(kind, lo, hi=None, *, lo_open: bool = False, hi_open: bool = False, unit: str = "", why: str = ""):
    """An argparse ``type=`` for a number of ``kind`` (int or float) in [lo, hi] (``lo_open`` /
    ``hi_open``: the bound itself excluded; ``hi`` None: no upper bound, only for a benchmark's
    --steps/--repeats/--rounds, docs/reliability.md). A value outside, a non-finite float or a
    non-number is the parser's one ``error:`` line: ``argument --mb: 1e+09 must lie in (0, 65536]
    MB (...why)``. Each item of an ``nargs`` list is checked. A size (``unit`` in
    :data:`BYTE_UNITS`) that must be positive must also be at least one byte (5e-324 MiB is 0 bytes)."""
    from .error_lines import brief

    span = _interval(lo, hi, lo_open, hi_open)
    rule = f"must {'be' if hi is None else 'lie'} {span}{' ' + unit if unit else ''}{f' ({why})' if why else ''}"

    def parse(text: str):
        try:
            v = number(kind)(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e}; it {rule}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{brief(text, 40)} is not finite; it {rule}")
        low = v <= lo if lo_open else v < lo
        high = hi is not None and (v >= hi if hi_open else v > hi)
        if low or high:
            raise argparse.ArgumentTypeError(f"{brief(text, 40)} {rule}")
        if lo_open and lo == 0 and unit in BYTE_UNITS and v * BYTE_UNITS[unit] < 1:  # 5e-324 MiB: 0 bytes
            raise argparse.ArgumentTypeError(f"{brief(text, 40)} {unit} is less than one byte; it {rule}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def number(kind):
    """An argparse ``type=`` for an ``int`` or ``float`` written in ASCII (``٣``, ``１`` or a no-break
    space, which int()/float() read, are refused, as in config values); a finite literal past float's
    range (``1e400``) is refused quoting it, never read as inf."""
    from .error_lines import brief

    name = "an integer" if kind is int else "a number"

    def parse(text: str):
        if not ascii_number(text):
            raise argparse.ArgumentTypeError(f"'{brief(text, 40)}' is not {name} in ASCII digits 0-9")
        try:
            v = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"'{brief(text, 40)}' is not {name}") from None
        if kind is float and math.isinf(v) and "inf" not in text.lower():
            raise argparse.ArgumentTypeError(f"{brief(text, 40)} is beyond the largest float (about 1.8e308)")
        return v

    parse.__name__ = kind.__name__
    return parse


def schema_bounded(section, key: str, why: str = ""):
    """:func:`bounded` with the bounds the config schema declares for ``key`` of the dataclass
    ``section`` (e.g. ``ModelConfig``, ``hidden_size``): a flag means what the config key means."""
    import dataclasses

    f = {x.name: x for x in dataclasses.fields(section)}[key]
    meta = f.metadata
    lo, lo_open = (meta["ge"], False) if meta.get("ge") is not None else (meta.get("gt"), True)
    hi, hi_open = (meta["le"], False) if meta.get("le") is not None else (meta.get("lt"), True)
    assert hi is not None, f"{section.__name__}.{key} declares no upper bound"
    kind = float if "float" in str(f.type) else int
    return bounded(kind, lo, hi, lo_open=lo_open, hi_open=hi_open, why=why or f"as the config key {key}")


def comma_items(
    text: str, name: str, expect: str, *, error=ValueError, seps: str = ",", strip: bool = True
) -> list[str]:
    """The items of the comma-separated value ``text`` of the flag, key or variable ``name``,
    stripped of spaces. An empty value, or an empty item (``8,,16``, ``,8``, ``8,``: a value
    left out, never silently skipped) is ``error`` with one line naming ``name``, the value,
    the item's position and ``expect`` (what is valid, e.g. ``comma-separated integers, e.g. 8,16``).
    ``seps``: the characters that separate items (``split`` also takes ``949/50/1``); ``strip``
    False: the items as written (file names), only the emptiness check ignores spaces."""
    from .error_lines import brief

    items, why = split_items(text, seps)
    if why:
        raise error(f"{name} '{brief(text, 40)}'{'' if why == 'is empty' else ':'} {why}; expected {expect}")
    if strip:
        return items
    raw = str(text)
    for c in seps[1:]:
        raw = raw.replace(c, seps[0])
    return raw.split(seps[0])


def split_items(text: str, seps: str = ",") -> tuple[list[str], str]:
    """``text`` split at ``seps`` into stripped items, and why it is not a list of items ("" when it
    is): ``is empty`` or ``item 2 of 3 is empty`` (:func:`comma_items`'s rule)."""
    s = str(text)
    for c in seps[1:]:
        s = s.replace(c, seps[0])
    items = [x.strip() for x in s.split(seps[0])]
    if items == [""]:
        return items, "is empty"
    empty = [n for n, x in enumerate(items, 1) if x == ""]
    return items, f"item {empty[0]} of {len(items)} is empty" if empty else ""


def ascii_number(text: str) -> bool:
    """Whether ``text`` (spaces around it aside) is written in ASCII only: numbers in config values
    and tool flags are ASCII digits (``٣``, ``１``, a no-break space are refused, not read as 3, 1)."""
    return str(text).strip(" \t\r\n").isascii()
