"""Stop signals inside a step and during start-up (lifecycle.Lifecycle.poll_micro / agree_now):
a step of a million micro-batches stops at the next micro-batch on every rank, discarding the
partial step; a signal that arrives while the run starts up stops it before its first step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from .test_lifecycle import PY, ROOT, _args, _port, _rank_env, cache  # noqa: F401


def _start_ignoring_usr1(args, tmp, world, tag):
    """Ranks started as srun_task.sh starts them: SIGUSR1 ignored until train.py takes it over."""
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
                preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),
            )
        )
    return procs


def _wait_for(path, text, procs, timeout=180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and text in path.read_text():
            return
        assert all(p.poll() is None for p in procs), "a rank exited early"
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s")


def _finish(procs, timeout=120):
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_a_signal_inside_a_huge_step_stops_at_the_next_micro_batch(cache, tmp_path):  # noqa: F811
    """gradient_accumulation_steps 16384 (the largest the config allows, 2**14; issue 29 tried 1e6,
    now refused by that bound): a step of many minutes; SIGUSR1 to rank 1 alone stops both ranks
    within seconds, exit 0; the partial step is discarded: the checkpoint is step 0's, data
    position 0, and no step was logged."""
    args = _args(
        cache,
        tmp_path,
        1,
        os.path.join(ROOT, "configs", "zero2.yml"),
        gradient_accumulation_steps=16384,
        train_micro_batch_size_per_gpu=1,
    )
    procs = _start_ignoring_usr1(args, tmp_path, 2, "a")
    _wait_for(tmp_path / "a.out0", "global batch", procs)  # the training loop has started
    time.sleep(2)
    t0 = time.monotonic()
    procs[1].send_signal(signal.SIGUSR1)
    _finish(procs)
    took = time.monotonic() - t0
    outs = [(tmp_path / f"a.out{r}").read_text() + (tmp_path / f"a.err{r}").read_text() for r in range(2)]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert took < 60, took
    assert "stopped by SIGUSR1 at step 0; checkpoint" in outs[0], outs[0]
    meta = json.loads((tmp_path / "ckpt" / "global_step0" / "meta.json").read_text())
    assert meta["step"] == 0 and meta["trainer"]["consumed_samples"] == 0
    path = tmp_path / "run" / "metrics.jsonl"
    assert not path.exists() or not [ln for ln in path.read_text().splitlines() if ln.strip()]


def test_a_signal_during_start_up_stops_before_training(cache, tmp_path):  # noqa: F811
    """SIGUSR1 while the run starts up (as Slurm's warning or `scancel --signal=USR1` can come):
    kept, not ignored; the run stops before its first step with one line and exit 0, saving
    nothing new (a resumed run's checkpoint stands)."""
    args = _args(cache, tmp_path, 100000, auto_resume="true")
    p = _start_ignoring_usr1(args, tmp_path, 1, "a")[0]
    try:
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < 120:
            p.send_signal(signal.SIGUSR1)  # ignored until train.py installs its handler, then kept
            time.sleep(0.3)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = (tmp_path / "a.out0").read_text(), (tmp_path / "a.err0").read_text()
    assert p.returncode == 0, out + err
    assert "stopped by SIGUSR1 before training started (step 0); no step trained; nothing saved" in out, out
    assert "Traceback" not in err
    assert not (tmp_path / "ckpt").exists() or not any(
        d.startswith("global_step") for d in os.listdir(tmp_path / "ckpt")
    )


def test_a_signal_during_a_long_evaluation_abandons_it_saves_and_stops(cache, tmp_path):  # noqa: F811
    """eval_iters 16384 (the largest the config allows, 2**14): an evaluation of many seconds after
    step 1; SIGUSR1 to rank 1 alone abandons it on both ranks at the same micro-batch, and the run
    saves step 1 and stops, exit 0, with no eval loss recorded (before, the evaluation ran to its
    end, and eval_iters had no bound: 1e8 ran for good)."""
    args = _args(
        cache, tmp_path, 2, eval_interval=1, eval_iters=16384, split="80,20,0", train_micro_batch_size_per_gpu=1
    )
    procs = _start_ignoring_usr1(args, tmp_path, 2, "e")
    _wait_for(tmp_path / "e.out0", "global batch", procs)  # the training loop has started
    time.sleep(4)  # step 1 takes well under a second; its evaluation many seconds
    t0 = time.monotonic()
    procs[1].send_signal(signal.SIGUSR1)
    _finish(procs)
    took = time.monotonic() - t0
    outs = [(tmp_path / f"e.out{r}").read_text() + (tmp_path / f"e.err{r}").read_text() for r in range(2)]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert took < 60, took
    assert "stopped by SIGUSR1 at step 1; checkpoint" in outs[0], outs[0]
    meta = json.loads((tmp_path / "ckpt" / "global_step1" / "meta.json").read_text())
    assert meta["step"] == 1
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert recs and not any("eval_loss" in r for r in recs), recs
