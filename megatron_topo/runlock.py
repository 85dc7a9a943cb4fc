"""One owner per run folder.

A training run takes a lock in its ``save`` folder and in its ``log_dir`` before it writes
anything there: ``{folder}/.megatron_topo.lock``, a small JSON record naming the host, the Slurm
job id (if any), the process id and the process's start time. A second run (or Slurm job) on the
same folder stops with one line naming the owner, before it touches anything. The lock is removed
when the run exits (also after an error or a stop signal).

A lock left behind by a run that was killed (SIGKILL, node failure, a Slurm job that ran out of
time) is detected as stale, without guessing, by the first of these that applies:

* same host: the owner process is gone, or its pid now belongs to another process (its start
  time in ``/proc/<pid>/stat`` differs);
* another host, owner inside a Slurm job other than ours and ``squeue`` available: the job is no
  longer pending or running;
* otherwise a lease: the owner rewrites the lock's modification time every ``LEASE_S / 4``
  seconds while it runs, and a lock not refreshed for ``LEASE_S`` seconds is stale.

A lock file that does not hold a valid record (not JSON, no host, a pid outside 1..2**22) is judged
by its lease alone, with a line naming the bad field while the lease runs; something other than a
regular file at the lock's name (a FIFO, a folder, a symbolic link, a device) was not made by a run:
one line, nothing opened (the record is read without blocking, at most 64 KiB) or removed.

A stale lock is taken over with one line naming the previous owner. Creating the lock is atomic
(``os.link`` of a complete file: no reader ever sees a half-written record, also on Lustre and
NFS); taking over renames the stale file away first (only one contender's rename succeeds) and
checks that what it renamed is the record it judged stale.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import threading
import time
from typing import Callable, Optional

from . import safe_files
from .error_lines import brief
from .pids import pid_alive, valid_pid

LOCK_NAME = ".megatron_topo.lock"
LEASE_ENV = "MEGATRON_TOPO_LOCK_LEASE_S"


def _lease_from_env() -> tuple[float, Optional[str]]:
    """The lease in seconds ($MEGATRON_TOPO_LOCK_LEASE_S, default 300) and, for a value that is not
    a number of seconds from 1 to a week, the error line ``acquire`` gives (300 s meanwhile)."""
    raw = os.environ.get(LEASE_ENV, "300")
    try:
        if not raw.strip(" \t\r\n").isascii():  # ASCII digits only: float() also reads '٣' and '３'
            raise ValueError(raw)
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not 1 <= v <= 604800:
        return 300.0, f"{LEASE_ENV}={brief(raw)} is not valid; use a number of seconds from 1 to 604800 (a week)"
    return v, None


LEASE_S, _LEASE_PROBLEM = _lease_from_env()
RECORD_CAP = 64 * 1024  # a lock record is a few hundred bytes; a larger file is not one
_JOB_ID = re.compile(r"[0-9A-Za-z_.+-]{1,64}")
_SLURM_LIVE = {
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
}


class LockError(RuntimeError):
    """The folder belongs to another live run; one line for the user."""


def _proc_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (clock ticks since boot, /proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _job_id() -> Optional[str]:
    return os.environ.get("SLURM_JOB_ID") or None


def _slurm_job_state(job: str) -> Optional[str]:
    """The job's state from squeue ('' when Slurm no longer lists it), None when squeue cannot tell."""
    try:
        r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode == 0:
        return r.stdout.strip().splitlines()[0].strip() if r.stdout.strip() else ""
    if "invalid job id" in (r.stderr or "").lower():
        return ""  # finished long enough ago to be forgotten
    return None


def record_problem(owner: dict) -> Optional[str]:
    """Why ``owner`` (a lock file's JSON) is not a lock record a run of ours writes, or None."""
    if not owner:
        return "not a JSON record"
    if not isinstance(owner.get("host"), str) or not owner["host"] or len(owner["host"]) > 255:
        return f"host {_show(owner.get('host'))}"
    if not valid_pid(owner.get("pid")):
        return f"pid {_show(owner.get('pid'))} (a process id is an integer from 1 to 4,194,304)"
    job = owner.get("job")
    if job is not None and not (isinstance(job, str) and _JOB_ID.fullmatch(job)):
        return f"Slurm job {_show(job)}"
    return None


def _show(v) -> str:
    return "missing" if v is None else safe_files.excerpt(v) if isinstance(v, str) else brief(repr(v))


def _field(owner: dict, key: str) -> str:
    v = owner.get(key)
    return "?" if v is None else brief(v) if isinstance(v, str) else _show(v)


def describe(owner: dict) -> str:
    job = f"Slurm job {_field(owner, 'job')}, " if owner.get("job") else ""
    return f"{job}host {_field(owner, 'host')}, pid {_field(owner, 'pid')}, since {_field(owner, 'started')}"


def stale_reason(owner: dict, lock_path: str, now: Optional[float] = None) -> Optional[str]:
    """Why the lock of ``owner`` is stale, or None while its owner may still run."""
    host, pid = owner.get("host"), owner.get("pid")
    if host == socket.gethostname() and valid_pid(pid):
        if not pid_alive(pid):
            return f"process {pid} on {host} has exited"
        start = _proc_start(pid)
        if owner.get("pid_start") and start and start != owner["pid_start"]:
            return f"process {pid} on {host} has exited (its pid now belongs to another process)"
        return None
    job = owner.get("job")
    if isinstance(job, str) and _JOB_ID.fullmatch(job) and job != _job_id():
        state = _slurm_job_state(str(job))
        if state is not None:
            if state in _SLURM_LIVE:
                return None
            return f"Slurm job {job} has ended ({state.lower() or 'no longer listed'})"
    try:
        age = (now or time.time()) - os.stat(lock_path).st_mtime
    except OSError:
        return "the lock vanished"
    if age > LEASE_S:
        return f"its lease expired ({age:.0f} s since its owner last renewed it; lease {LEASE_S:.0f} s)"
    return None


class _Unreadable(Exception):
    pass


def _read(path: str) -> Optional[dict]:
    """The lock record at ``path``: None when there is none, {} when it cannot be read as one (judged
    by its lease, like a remote owner). Never blocks: a FIFO, device, folder or symbolic link at the
    lock's name is no lock of ours and raises LockError (nothing is opened or removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else safe_files._kind(st.st_mode)
        raise LockError(
            f"{path} is {kind}, not a lock file of megatron_topo; it was not made by a run: "
            f"remove it, or point the run at another folder"
        )
    try:
        data = safe_files.read_small(path, RECORD_CAP, _Unreadable)
        rec = json.loads(data.decode("utf-8", "replace"))
    except FileNotFoundError:
        return None
    except (_Unreadable, OSError, ValueError, RecursionError):
        return {}  # unreadable or not ours: judged by its lease (mtime) like a remote owner
    return rec if isinstance(rec, dict) else {}


def _read_own(path: str) -> dict:
    """The record at a lock path this run holds ({} when it is gone or replaced by something else)."""
    try:
        return _read(path) or {}
    except LockError:
        return {}


class RunLock:
    """The locks of one run; ``acquire`` each folder, ``release`` at exit (idempotent)."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.held: list[tuple[str, str]] = []  # (lock path, our token)
        self.created: list[str] = []  # folders acquire made, deepest first: removed at release when empty
        self.me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start": _proc_start(os.getpid()),
            "job": _job_id(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "token": f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}",
        }
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None

    def acquire(self, folder: str, what: str) -> None:
        """Lock ``folder`` (created if missing) for this run or raise LockError naming the owner."""
        if _LEASE_PROBLEM:
            raise LockError(_LEASE_PROBLEM)
        given, folder = folder, os.path.abspath(folder)
        path = os.path.join(folder, LOCK_NAME)
        if any(p == path for p, _ in self.held):
            return
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise LockError(f"{what} {given} exists and is not a directory; point {what.split('.')[-1]} at a directory")
        missing, up = [], folder
        while not os.path.lexists(up) and os.path.dirname(up) != up:
            missing.append(up)
            up = os.path.dirname(up)
        os.makedirs(folder, exist_ok=True)
        self.created[:0] = missing
        tmp = f"{path}.{self.me['host']}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.me, f)
        try:
            for _ in range(3):
                try:
                    os.link(tmp, path)
                    self.held.append((path, self.me["token"]))
                    self._start_renewer()
                    return
                except FileExistsError:
                    pass
                owner = _read(path)
                if owner is None:
                    continue  # released meanwhile: try again
                reason = stale_reason(owner, path)
                bad = record_problem(owner)
                if reason is None and bad is not None:
                    raise LockError(
                        f"{what} {folder}: the lock {path} does not hold a valid lock record ({bad}); it counts "
                        f"as held until its lease expires ({LEASE_S:.0f} s after its last change): remove it "
                        f"if no run uses this folder, or use another folder"
                    )
                if reason is None:
                    raise LockError(
                        f"{what} {folder} belongs to a running job ({describe(owner)}; lock {path}); "
                        f"wait for it to end, stop it, or use another folder"
                    )
                aside = f"{path}.stale-{self.me['host']}-{os.getpid()}"
                try:
                    os.rename(path, aside)
                except FileNotFoundError:
                    continue  # another run took it over first: look again
                if _read_own(aside) != owner:  # renamed a fresh lock taken between our read and rename
                    try:
                        os.link(aside, path)
                    except FileExistsError:
                        pass
                    os.unlink(aside)
                    continue
                os.unlink(aside)
                self.log(
                    f"{what} {folder}: taking over the lock of an earlier job that is gone "
                    f"({describe(owner)}: {reason})"
                )
            raise LockError(f"{what} {folder}: could not take the lock {path} (other runs keep taking it)")
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _start_renewer(self) -> None:
        if self._renewer is not None:
            return

        def renew():
            while not self._stop.wait(LEASE_S / 4):
                for path, token in list(self.held):
                    if _read_own(path).get("token") == token:
                        try:
                            os.utime(path)
                        except OSError:
                            pass

        self._renewer = threading.Thread(target=renew, name="megatron_topo-lock-lease", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Remove the locks this run holds (only where the lock is still ours)."""
        self._stop.set()
        for path, token in self.held:
            if _read_own(path).get("token") == token:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self.held = []
        # a run that stopped before writing anything (a refused config, a failed preflight) leaves
        # no folder behind: the ones the lock made are removed when they hold nothing else
        for d in self.created:
            try:
                os.rmdir(d)
            except OSError:
                pass
        self.created = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def run_folders(cfg) -> list[tuple[str, str]]:
    """(folder, what) of a run that get a lock: checkpoint.save and logging.log_dir (one when the same)."""
    out, seen = [], set()
    for folder, what in ((cfg.checkpoint.save, "checkpoint.save"), (cfg.logging.log_dir, "log_dir")):
        if folder and os.path.realpath(folder) not in seen:
            seen.add(os.path.realpath(folder))
            out.append((folder, what))
    return out
