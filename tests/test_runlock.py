"""One owner per run folder (megatron_topo.runlock): the lock record, stale locks (a dead process
on this host, a reused pid, an ended Slurm job, an expired lease), and two training runs started
on one folder: the second stops with one line naming the owner, before it touches anything."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from megatron_topo import runlock

from .test_lifecycle import _args, _latest_step, _records, _run, _start, _wait_for_steps, cache  # noqa: F401

PY = sys.executable


def _record(folder, **over):
    rec = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": runlock._proc_start(os.getpid()),
        "job": None,
        "started": "earlier",
        "token": "someone-else",
    }
    rec.update(over)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, runlock.LOCK_NAME), "w") as f:
        json.dump(rec, f)
    return rec


def _dead_pid() -> int:
    p = subprocess.Popen([PY, "-c", "pass"])
    p.wait()
    return p.pid


def test_lock_names_its_owner_and_is_released(tmp_path):
    lines = []
    a = runlock.RunLock(log=lines.append)
    a.acquire(str(tmp_path / "ck"), "checkpoint.save")
    rec = json.loads((tmp_path / "ck" / runlock.LOCK_NAME).read_text())
    assert rec["host"] == socket.gethostname() and rec["pid"] == os.getpid()
    b = runlock.RunLock(log=lines.append)
    with pytest.raises(runlock.LockError) as e:
        b.acquire(str(tmp_path / "ck"), "checkpoint.save")
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and socket.gethostname() in msg and str(tmp_path / "ck") in msg
    assert "\n" not in msg
    b.release()  # holds nothing: the owner's lock stays
    assert (tmp_path / "ck" / runlock.LOCK_NAME).exists()
    a.release()
    assert not (tmp_path / "ck").exists() and lines == []  # the folder the lock made, empty: removed
    (tmp_path / "kept").mkdir()
    c = runlock.RunLock(log=lines.append)
    c.acquire(str(tmp_path / "kept" / "a" / "b"), "log_dir")
    (tmp_path / "kept" / "a" / "out.txt").write_text("written by the run")
    c.release()  # b was empty: removed; a holds the run's file: kept; kept was not made by the lock
    assert sorted(os.listdir(tmp_path / "kept" / "a")) == ["out.txt"]


@pytest.mark.parametrize("case", ["dead_pid", "reused_pid", "ended_job", "expired_lease"])
def test_a_stale_lock_is_taken_over_with_a_line(tmp_path, monkeypatch, case):
    folder = str(tmp_path / "ck")
    if case == "dead_pid":
        old = _record(folder, pid=_dead_pid())
    elif case == "reused_pid":  # our own live pid, but started at another time: another process
        old = _record(folder, pid_start="1")
    elif case == "ended_job":  # another host's lock from Slurm job 4242, which squeue no longer lists
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "squeue").write_text(
            "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
        )
        (bin_dir / "squeue").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        old = _record(folder, host="elsewhere", pid=1, job="4242")
    else:  # another host, no job: its lease ran out
        old = _record(folder, host="elsewhere", pid=1)
        t = time.time() - runlock.LEASE_S - 5
        os.utime(os.path.join(folder, runlock.LOCK_NAME), (t, t))
    lines = []
    lk = runlock.RunLock(log=lines.append)
    lk.acquire(folder, "checkpoint.save")
    assert json.loads((tmp_path / "ck" / runlock.LOCK_NAME).read_text())["token"] == lk.me["token"]
    assert len(lines) == 1 and "taking over the lock" in lines[0] and f"pid {old['pid']}" in lines[0], lines
    lk.release()
    assert os.listdir(folder) == []


@pytest.mark.parametrize("case", ["live_job", "fresh_lease"])
def test_a_live_remote_owner_is_not_taken_over(tmp_path, monkeypatch, case):
    folder = str(tmp_path / "ck")
    if case == "live_job":
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "squeue").write_text("#!/bin/sh\necho RUNNING\n")
        (bin_dir / "squeue").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        _record(folder, host="elsewhere", pid=1, job="4242")
        t = time.time() - runlock.LEASE_S - 5  # the job state wins over an old mtime
        os.utime(os.path.join(folder, runlock.LOCK_NAME), (t, t))
    else:
        _record(folder, host="elsewhere", pid=1)
    before = (tmp_path / "ck" / runlock.LOCK_NAME).read_bytes()
    with pytest.raises(runlock.LockError, match="belongs to a running job"):
        runlock.RunLock().acquire(folder, "checkpoint.save")
    assert (tmp_path / "ck" / runlock.LOCK_NAME).read_bytes() == before


def test_two_runs_on_one_folder_the_second_refuses_in_one_line(cache, tmp_path):  # noqa: F811
    """Run A trains; run B (2 ranks) on the same save folder stops with one line (once, not per rank)
    naming A's host and pid, exit 2, touching nothing; A is untouched and finishes its stop and save.
    A SIGKILLed run's lock is stale: the next run takes it over with a line and resumes."""
    a = _start(_args(cache, tmp_path, 100000), tmp_path)[0]
    try:
        _wait_for_steps(tmp_path, 2, [a])
        snapshot = {
            p: os.stat(os.path.join(d, p)).st_mtime_ns
            for d in (tmp_path / "run",)
            for p in os.listdir(d)
            if p not in ("metrics.jsonl", runlock.LOCK_NAME)
        }  # A itself writes these
        procs = _start(_args(cache, tmp_path, 5, auto_resume="true"), tmp_path, world=2, tag="b")
        for p in procs:
            p.wait(timeout=240)
        errs = [(tmp_path / f"b.err{r}").read_text() for r in range(2)]
        outs = [(tmp_path / f"b.out{r}").read_text() for r in range(2)]
        assert [p.returncode for p in procs] == [2, 2], outs + errs
        lines = [ln for e in errs for ln in e.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), errs
        assert (
            f"pid {a.pid}" in lines[0] and socket.gethostname() in lines[0] and "belongs to a running job" in lines[0]
        )
        assert "Traceback" not in "".join(errs)
        assert a.poll() is None  # A still trains
        assert {p: os.stat(os.path.join(tmp_path / "run", p)).st_mtime_ns for p in snapshot} == snapshot
        a.send_signal(signal.SIGUSR1)
        a.wait(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0
    n = _latest_step(tmp_path)
    assert f"stopped by SIGUSR1 at step {n}" in (tmp_path / "a.out0").read_text()
    assert not (tmp_path / "ckpt" / runlock.LOCK_NAME).exists() and not (tmp_path / "run" / runlock.LOCK_NAME).exists()

    # a killed run leaves its lock; the next run finds its owner gone and takes it over
    k = _start(_args(cache, tmp_path, 100000, auto_resume="true"), tmp_path, tag="k")[0]
    try:
        _wait_for_steps(tmp_path, len(_records(tmp_path)) + 1, [k])
    finally:
        k.kill()
        k.wait()
    assert json.loads((tmp_path / "ckpt" / runlock.LOCK_NAME).read_text())["pid"] == k.pid
    rc, out, err = _run(_args(cache, tmp_path, n + 1, auto_resume="true"), tmp_path, tag="c")
    assert rc == 0, out + err
    assert f"process {k.pid} on {socket.gethostname()} has exited" in out and "taking over the lock" in out
    assert f"done: step {n + 1}" in out
    assert [r["step"] for r in _records(tmp_path) if "loss" in r] == list(range(1, n + 2))  # every step once


def test_a_bad_or_busy_rendezvous_port_is_one_line(tmp_path):
    """MASTER_PORT out of range, or taken by another job on the node: one line, exit 2, no traceback."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    try:
        for port, expect in (
            ("99999", "MASTER_PORT='99999' is not a port number (valid: 1..65535"),
            (str(busy.getsockname()[1]), f"MASTER_PORT {busy.getsockname()[1]} on 127.0.0.1 is already in use"),
        ):
            env = dict(
                os.environ,
                RANK="0",
                WORLD_SIZE="2",
                LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                OMP_NUM_THREADS="1",
            )
            r = subprocess.run(
                [
                    PY,
                    os.path.join(root, "train.py"),
                    os.path.join(root, "configs", "tiny.yml"),
                    "--set",
                    f"log_dir={tmp_path / 'run'}",
                    "--set",
                    "save=null",
                    "--set",
                    "distributed.device=cpu",
                    "--set",
                    "distributed.collective_timeout_s=20",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=200,
                cwd=tmp_path,
            )
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {expect}"), r.stderr
    finally:
        busy.close()


def test_save_holding_another_runs_checkpoints_is_refused_also_with_load_elsewhere(cache, tmp_path):  # noqa: F811
    """load=A save=B where B holds another run's checkpoints: one line, exit 2; B untouched (main at
    1d0c977 deleted B's step and moved B's latest to this run's)."""
    for name in ("A", "B"):
        rc, out, err = _run(
            _args(cache, tmp_path, 2, save=str(tmp_path / name), log_dir=str(tmp_path / f"run{name}")),
            tmp_path,
            tag=name,
        )
        assert rc == 0, out + err
    before = {p: (tmp_path / "B" / p).stat().st_mtime_ns for p in os.listdir(tmp_path / "B")}
    rc, out, err = _run(
        _args(cache, tmp_path, 4, load=str(tmp_path / "A"), save=str(tmp_path / "B"), log_dir=str(tmp_path / "runC")),
        tmp_path,
        tag="c",
    )
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, out + err
    assert lines[0] == (
        f"error: checkpoint.save {tmp_path / 'B'} already holds checkpoints (latest step 2) and this "
        f"run resumes from load={tmp_path / 'A'}; saving there would mix two runs: save elsewhere with "
        f"--set save=DIR, or continue the run in {tmp_path / 'B'} with --set load={tmp_path / 'B'}"
    )
    assert {p: (tmp_path / "B" / p).stat().st_mtime_ns for p in os.listdir(tmp_path / "B")} == before
