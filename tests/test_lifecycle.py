"""Walltime safety and run ownership: stop signals, time-based checkpoints, auto-resume, the
fresh-run refusal, and metrics.jsonl belonging to its run.

Process cases run ``train.py`` on a shrunken configs/tiny.yml as real processes (1 rank, or 2
gloo ranks started the way srun starts them) and send real signals.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from megatron_topo.lifecycle import Lifecycle, StopSignals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


# ------------------------------------------------------------------------------ units
def test_stop_signals_record_instead_of_dying():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # SIG_IGN under nohup
    with StopSignals() as sig:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert sig.signum == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal stays the one reported
        assert sig.signum == signal.SIGUSR1
    assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]  # the handlers it found come back
    assert signal.getsignal(signal.SIGINT) == before[signal.SIGINT]


def test_time_based_saves_follow_rank0_clock_and_restart_after_a_save():
    now = [0.0]
    sig = StopSignals()
    life = Lifecycle(sig, save_interval_minutes=0.5, clock=lambda: now[0])
    assert life.poll() == (False, False)
    now[0] = 29.9
    assert life.poll() == (False, False)
    now[0] = 30.0
    assert life.poll() == (False, True)
    assert life.poll() == (False, False)  # requested once per interval
    now[0] = 50.0
    life.saved()  # e.g. a checkpoint_factor save: the interval restarts
    now[0] = 79.0
    assert life.poll() == (False, False)
    other = Lifecycle(sig, save_interval_minutes=0.5, rank=1, clock=lambda: now[0] + 1000)
    assert other.poll() == (False, False)  # only rank 0's clock decides (then broadcast by the MAX)
    off = Lifecycle(sig, save_interval_minutes=0, clock=lambda: now[0] + 1e9)
    assert off.poll() == (False, False)
    sig.signum = signal.SIGTERM
    assert off.poll() == (True, False) and off.stop_name == "SIGTERM"
    with pytest.raises(ValueError):
        Lifecycle(sig, save_interval_minutes=-1)


def test_distributed_decisions_are_the_max_over_ranks_one_step_later():
    """Each poll launches the MAX of this rank's [signal, due] and acts on the previous one."""
    launched, results = [], iter([[0, 0], [signal.SIGUSR1, 1], [signal.SIGUSR1, 0]])

    def start(values):
        launched.append(list(values))
        out = next(results)
        return lambda: out

    sig = StopSignals()
    now = [0.0]
    life = Lifecycle(sig, save_interval_minutes=0.5, rank=1, clock=lambda: now[0], start_reduce_max=start)
    assert life.poll() == (False, False)  # nothing decided before the first reduction lands
    now[0] = 100.0  # rank 1's clock does not count
    assert life.poll() == (False, False)  # = the first reduction: [0, 0]
    assert life.poll() == (True, True) and life.stop_name == "SIGUSR1"  # another rank's signal and rank 0's save
    life.close()
    assert launched == [[0, 0], [0, 0], [0, 0]]


# ------------------------------------------------------------------------------ processes
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data_cache"))


def _args(cache, tmp, steps, *extra, **sets):
    base = {
        "train_iters": steps,
        "eval_interval": 0,
        "log_interval": 1,
        "progress_bar": "false",
        "data_cache_dir": cache,
        "builtin_corpus_bytes": 100000,
        "log_dir": str(tmp / "run"),
        "save": str(tmp / "ckpt"),
        "checkpoint_factor": 0,
        "num_layers": 2,
        "hidden_size": 64,
        "distributed.backend": "gloo",
        "distributed.device": "cpu",
        "distributed.collective_timeout_s": 60,
    }
    base.update(sets)
    out = [os.path.join(ROOT, "train.py"), os.path.join(ROOT, "configs", "tiny.yml"), *extra]
    for k, v in base.items():
        out += ["--set", f"{k}={'null' if v is None else v}"]
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(r: int, world: int, port: int) -> dict:
    """The environment of rank ``r`` of a local job (one process: no launcher variables)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if world > 1:
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return env


def _start(args, tmp, world=1, tag="a"):
    port = _port()
    procs = []
    for r in range(world):
        env = _rank_env(r, world, port)
        procs.append(
            subprocess.Popen(
                [PY, *args],
                env=env,
                cwd=str(tmp),
                stdout=open(tmp / f"{tag}.out{r}", "w"),
                stderr=open(tmp / f"{tag}.err{r}", "w"),
            )
        )
    return procs


def _run(args, tmp, tag="a"):
    p = _start(args, tmp, tag=tag)[0]
    p.wait(timeout=240)
    return p.returncode, (tmp / f"{tag}.out0").read_text(), (tmp / f"{tag}.err0").read_text()


def _records(tmp):
    path = tmp / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _wait_for_steps(tmp, n, procs, timeout=180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if len([r for r in _records(tmp) if "loss" in r]) >= n:
            return
        assert all(p.poll() is None for p in procs), "a rank exited before training reached the signal"
        time.sleep(0.1)
    raise AssertionError(f"no {n} logged steps in {timeout} s")


def _latest_step(tmp) -> int:
    name = (tmp / "ckpt" / "latest").read_text().strip()
    assert name.startswith("global_step")
    return int(name[len("global_step") :])


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGINT])
def test_signal_stops_after_the_step_saves_and_a_resumed_run_appends(cache, tmp_path, sig):
    """A signal mid-run: exit 0, one line naming the signal, step and checkpoint; `latest` is that
    step; no traceback. The auto-resumed run continues from it and appends to metrics.jsonl."""
    p = _start(_args(cache, tmp_path, 100000), tmp_path)[0]
    _wait_for_steps(tmp_path, 2, [p])
    p.send_signal(sig)
    p.wait(timeout=120)
    out, err = (tmp_path / "a.out0").read_text(), (tmp_path / "a.err0").read_text()
    assert p.returncode == 0, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    stopped = [line for line in out.splitlines() if line.startswith("stopped by")]
    assert len(stopped) == 1, out
    n = _latest_step(tmp_path)
    assert 2 <= n < 100000
    assert stopped[0] == (
        f"stopped by {signal.Signals(sig).name} at step {n}; checkpoint {tmp_path / 'ckpt' / f'global_step{n}'}"
    )
    before = _records(tmp_path)
    assert before[-1]["step"] == n  # the partial logging window was flushed at the stop

    rc, out, err = _run(_args(cache, tmp_path, n + 2, auto_resume="true"), tmp_path, tag="b")
    assert rc == 0, out + err
    assert f"resumed from {tmp_path / 'ckpt' / f'global_step{n}'} at step {n}" in out
    after = _records(tmp_path)
    assert after[: len(before)] == before  # appended, not moved aside
    assert [r["step"] for r in after[len(before) :]] == [n + 1, n + 2]
    assert not (tmp_path / "run" / "metrics.jsonl.1").exists()
    assert _latest_step(tmp_path) == n + 2


def test_two_ranks_agree_on_a_signal_only_one_of_them_got(cache, tmp_path):
    """SIGTERM to rank 1 alone: both ranks stop after the same step and save one checkpoint."""
    procs = _start(_args(cache, tmp_path, 100000, os.path.join(ROOT, "configs", "zero2.yml")), tmp_path, world=2)
    try:
        _wait_for_steps(tmp_path, 2, procs)
        procs[1].send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    outs = [(tmp_path / f"a.out{r}").read_text() + (tmp_path / f"a.err{r}").read_text() for r in range(2)]
    assert [p.returncode for p in procs] == [0, 0], outs
    n = _latest_step(tmp_path)
    assert f"stopped by SIGTERM at step {n}; checkpoint" in outs[0]
    meta = json.loads((tmp_path / "ckpt" / f"global_step{n}" / "meta.json").read_text())
    assert meta["step"] == n and meta["world_size"] == 2
    assert sorted(f for f in os.listdir(tmp_path / "ckpt" / f"global_step{n}") if f.endswith(".pt"))


def test_time_based_checkpoints(cache, tmp_path):
    """save_interval_minutes tiny: a checkpoint after every step although checkpoint_factor is 0."""
    rc, out, err = _run(_args(cache, tmp_path, 4, save_interval_minutes=1e-6, keep_last=10), tmp_path)
    assert rc == 0, out + err
    steps = sorted(d for d in os.listdir(tmp_path / "ckpt") if d.startswith("global_step"))
    assert steps == [f"global_step{i}" for i in (1, 2, 3, 4)], steps


def test_fresh_run_into_a_used_save_folder_stops_and_touches_nothing(cache, tmp_path):
    rc, out, err = _run(_args(cache, tmp_path, 3, auto_resume="true"), tmp_path)
    assert rc == 0, out + err
    assert f"no checkpoint in {tmp_path / 'ckpt'}: starting fresh" in out
    meta = tmp_path / "ckpt" / "global_step3" / "meta.json"
    before = meta.stat().st_mtime_ns
    rc, out, err = _run(_args(cache, tmp_path, 3, auto_resume="true"), tmp_path, tag="again")
    assert rc == 0 and "done: step 3 (train_iters reached before this run: nothing to train)" in out, out + err
    assert meta.stat().st_mtime_ns == before  # nothing trained: the checkpoint is not written again
    snapshot = {
        p: os.stat(os.path.join(d, p)).st_mtime_ns for d in (tmp_path / "ckpt", tmp_path / "run") for p in os.listdir(d)
    }

    rc, out, err = _run(_args(cache, tmp_path, 5), tmp_path, tag="b")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needed in (
        str(tmp_path / "ckpt"),
        "latest step 3",
        f"--set load={tmp_path / 'ckpt'}",
        "--set auto_resume=true",
        "--set save=",
    ):
        assert needed in lines[0], (needed, lines[0])
    assert snapshot == {
        p: os.stat(os.path.join(d, p)).st_mtime_ns for d in (tmp_path / "ckpt", tmp_path / "run") for p in os.listdir(d)
    }

    # an explicit load wins over auto_resume's folder; a fresh run elsewhere keeps the old metrics aside
    rc, out, err = _run(
        _args(cache, tmp_path, 4, save=str(tmp_path / "other"), load=str(tmp_path / "ckpt"), auto_resume="true"),
        tmp_path,
        tag="c",
    )
    assert rc == 0 and "at step 3" in out, out + err
    rc, out, err = _run(_args(cache, tmp_path, 2, save=str(tmp_path / "third")), tmp_path, tag="d")
    assert rc == 0, out + err
    old = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl.1").read_text().splitlines()]
    assert [r["step"] for r in old] == [1, 2, 3, 4]  # the first run's records and the resumed ones
    assert [r["step"] for r in _records(tmp_path)] == [1, 2]
    assert "moved to" in out and "metrics.jsonl.1" in out


def test_auto_resume_of_a_missing_load_is_still_an_error(cache, tmp_path):
    rc, out, err = _run(_args(cache, tmp_path, 2, load=str(tmp_path / "nope"), auto_resume="true"), tmp_path)
    assert rc == 2 and err.strip() == f"error: checkpoint path does not exist: {tmp_path / 'nope'}", err
