"""Hostile inputs, round 4 (issue 29), the distributed and size families: ranks that disagree on
their inputs (world size, config, save folder) stop at the rendezvous with one line printed once
per job; a rendezvous waits at most ``distributed.rendezvous_timeout_s``; launcher variables and
the tools' numbers that scale work are bounded; SIGHUP stops training like SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_topo.commands import generate, gpu_check, plot_metrics
from megatron_topo.commands import train as train_cli
from megatron_topo.lifecycle import StopSignals

from .cli_cases import build_hostile_world, call, one_error_line, scratch  # noqa: F401
from .test_lifecycle import PY, ROOT, _port, _rank_env

TRAIN = os.path.join(ROOT, "train.py")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_hostile_world(tmp_path_factory.mktemp("hostile4d"))


@pytest.fixture
def w(world, tmp_path, monkeypatch):
    return scratch(world, tmp_path, monkeypatch)


def _job(cwd, per_rank, world=2, timeout=40):
    """Start ``len(per_rank)`` train.py processes in ``cwd`` (rank r: ``per_rank[r]`` = (extra env,
    extra args)); returns (exit codes, stderr texts, seconds). A rank still running after
    ``timeout`` s is killed (exit -9)."""
    port = _port()
    procs = []
    t0 = time.monotonic()
    for r, (env_extra, extra) in enumerate(per_rank):
        env = _rank_env(r, world, port)
        env.update(env_extra)
        procs.append(
            subprocess.Popen(
                [PY, TRAIN, "cfg.yml", "--set", "train_iters=1", *extra],
                cwd=str(cwd),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        outs.append(err)
    return [p.returncode for p in procs], outs, time.monotonic() - t0


def _error_lines(errs):
    lines = [ln for e in errs for ln in e.splitlines() if ln.strip()]
    assert not any("Traceback" in ln for ln in lines), lines
    return lines


# ------------------------------------------------------------------ ranks that disagree


@pytest.mark.parametrize(
    "rank1, named",
    [
        (({"WORLD_SIZE": "3"}, []), "WORLD_SIZE is 2 on rank 0 but 3 on rank 1"),
        (({}, ["--set", "hidden_size=64"]), "model.hidden_size is 32 on rank 0 but 64 on rank 1"),
        (({}, ["--set", "seed=7"]), "train.seed is 1234 on rank 0 but 7 on rank 1"),
        (({}, ["--set", "save=s1"]), 'checkpoint.save is null on rank 0 but "s1" on rank 1'),
        (({"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}, []), "LOCAL_WORLD_SIZE is 2 on rank 0 but 1 on rank 1"),
    ],
    ids=["world-size", "hidden-size", "seed", "save", "local-world-size"],
)
def test_ranks_that_disagree_stop_at_the_rendezvous_with_one_line(w, rank1, named):
    """Before: the world-size mismatch hung both ranks; hidden_size aborted in gloo's C++ (exit
    250, 35 lines); seed / save gave misleading lines (index cache, disk space) on every rank."""
    rcs, errs, took = _job(w, [({}, []), rank1])
    lines = _error_lines(errs)
    assert rcs == [2, 2], (rcs, errs)
    assert len(lines) == 1 and lines[0].startswith("error: the ranks' inputs differ: "), lines
    assert named in lines[0], lines[0]
    assert took < 30, took
    assert not (w / "s1").exists() and not (w / "log").exists()  # nothing written


def test_a_rank_that_never_joins_is_named_after_the_rendezvous_timeout(w):
    """Rank 0 alone in a world of 2 (its peer failed, or two processes were both rank 0): before,
    it waited for good; now ``distributed.rendezvous_timeout_s`` bounds the wait, one line."""
    rcs, errs, took = _job(w, [({}, ["--set", "distributed.rendezvous_timeout_s=3"])])
    lines = _error_lines(errs)
    assert rcs == [2], errs
    assert lines == [
        "error: rank(s) 1 of 2 did not join within 3 s (distributed.rendezvous_timeout_s); did they start, "
        "and with the same MASTER_ADDR/MASTER_PORT?"
    ], lines
    assert took < 20, took


def test_a_rank_whose_rank0_never_comes_gives_up_after_the_rendezvous_timeout(w):
    """Rank 1 alone: rank 0's store never answers; one line after the timeout."""
    port = _port()
    env = _rank_env(1, 2, port)
    p = subprocess.run(
        [PY, TRAIN, "cfg.yml", "--set", "distributed.rendezvous_timeout_s=3"],
        cwd=str(w),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = _error_lines([p.stderr])
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "rank 1: rank 0's rendezvous store at 127.0.0.1:" in lines[0] and "within 3 s" in lines[0], lines


def test_a_stop_signal_ends_the_rendezvous_wait(w):
    """SIGTERM while rank 0 waits for its peers (a scheduler cancelling a job that never formed):
    before, it was kept as a stop request while the rendezvous went on waiting (``timeout``'s
    SIGTERM did not end it); now it ends the wait, one line, exit 128 + 15."""
    env = _rank_env(0, 2, _port())
    p = subprocess.Popen([PY, TRAIN, "cfg.yml"], cwd=str(w), env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # imports and config: the rank is in the rendezvous by now (the default wait is 300 s)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    lines = _error_lines([err])
    assert p.returncode == 143, err
    assert lines == [
        "error: stopped by SIGTERM on rank 0 while waiting for rank(s) 1 to join; no step trained, nothing saved"
    ], lines


@pytest.mark.parametrize(
    "env, line",
    [
        (
            {"WORLD_SIZE": str(2**70), "RANK": "0"},
            "error: launcher environment: WORLD_SIZE=1180591620717411303424 must lie in 1..1,048,576 (2**20)",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": str(2**70)},
            "error: launcher environment: RANK=1180591620717411303424 is outside WORLD_SIZE=2; valid ranks 0..1",
        ),
        (
            {"WORLD_SIZE": "9" * 5000, "RANK": "0"},
            "error: launcher environment: WORLD_SIZE='999999999999999999999999...' (5,000 characters) is not an "
            "integer of at most 24 digits (WORLD_SIZE, RANK, LOCAL_RANK must be integers)",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"},
            "error: launcher environment: LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2; valid: 1..2 (the ranks on "
            "this node)",
        ),
    ],
    ids=["world-2pow70", "rank-2pow70", "world-5000-digits", "local-world-above-world"],
)
def test_launcher_variables_out_of_bounds_are_one_line(w, monkeypatch, capfd, env, line):
    """Before: WORLD_SIZE=2**70 was a TypeError traceback from TCPStore."""
    for k, v in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port())}.items():
        monkeypatch.setenv(k, v)
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
    assert one_error_line(capfd) == line


# ------------------------------------------------------------------ sizes that never finish


@pytest.mark.parametrize("n", [2**30, 2**17 + 1, 0])
def test_dry_run_world_size_is_bounded(w, capfd, n):
    """Before: --world-size 2**30 (and 2**20 on the 20B config) ran for minutes."""
    t0 = time.monotonic()
    assert call(train_cli.main, ["cfg.yml", "--dry-run", "--world-size", str(n)]) == 2
    assert one_error_line(capfd).startswith(f"error: --world-size {n} must lie in 1..131,072 (2**17")
    assert time.monotonic() - t0 < 10


def test_generate_max_new_tokens_is_bounded_by_the_context(w, capfd):
    """Before: 1,048,576 new tokens on a seq_length-16 model ran for hours; now at most 64
    contexts' worth (1024 here), one line, and 1024 itself is accepted."""
    argv = ["--checkpoint", "ck", "--prompt-ids", "1", "--max-new-tokens"]
    assert call(generate.main, argv + ["1048576"]) == 2
    assert one_error_line(capfd) == (
        "error: --max-new-tokens 1,048,576 is more than this model generates in one run: at most 1,024 "
        "(64 x seq_length 16; every token is one forward pass over the context)"
    )
    assert call(generate.main, argv + ["1025"]) == 2
    capfd.readouterr()
    generate.check_max_new(1024, 16)  # the bound itself passes


def test_plot_texts_are_bounded_and_plain(w, capfd):
    """Before: a 200k-character --title ran > 30 s; a label '$x^$' was a mathtext traceback."""
    (w / "mr").mkdir()
    (w / "mr" / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": {4 - i / 10}}}\n' for i in range(1, 5)))
    before = sorted(os.listdir(w))
    t0 = time.monotonic()
    assert call(plot_metrics.main, ["mr", "--out", "o.png", "--title", "T" * 200_000]) == 2
    assert one_error_line(capfd) == (
        "error: --title 'TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT...' (200,000 characters) is too long: at most 200 "
        "characters"
    )
    assert call(plot_metrics.main, ["mr", "--out", "o.png", "--labels", "L" * 201]) == 2
    assert "--labels" in one_error_line(capfd)
    assert call(plot_metrics.main, ["mr", "--out", "o.png", "--metrics", *["loss"] * 17]) == 2
    assert one_error_line(capfd) == "error: --metrics: 17 keys; at most 16 (one panel each)"
    assert time.monotonic() - t0 < 10
    assert sorted(os.listdir(w)) == before
    assert call(plot_metrics.main, ["mr", "--out", "t.png", "--labels", "$x^$", "--title", "$\\foo{$"]) == 0
    assert (w / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smoothing_time_does_not_grow_with_the_window():
    vals = [float(i % 7) for i in range(200_000)]
    t0 = time.monotonic()
    out = plot_metrics.smooth(vals, 10**12)
    assert time.monotonic() - t0 < 5
    assert out[-1] == pytest.approx(sum(vals) / len(vals))
    assert plot_metrics.smooth([1.0, 2.0, 3.0, float("nan"), 4.0, 5.0], 2)[4:] == [3.5, 4.5]


@pytest.mark.parametrize(
    "flag, value", [("--spawn", "100000"), ("--layers", "0"), ("--timeout", "nan"), ("--max-delay-ms", "1e12")]
)
def test_gpu_check_numbers_are_bounded(capfd, flag, value):
    """Before: --spawn 100000 started 100,000 processes."""
    with pytest.raises(SystemExit) as e:
        gpu_check.parse_args(["cfg.yml", flag, value])
    assert e.value.code == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: {flag} ") and ": must lie in " in line, line


def test_tool_world_sizes_are_bounded(tmp_path):
    out = subprocess.run(
        [PY, os.path.join(ROOT, "tools", "check_neox_configs.py"), str(tmp_path), "--world-size", str(2**30)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stderr.startswith("error: --world-size 1073741824: must lie in 1..131,072")
    out = subprocess.run(
        [PY, os.path.join(ROOT, "tools", "prepare_data.py"), "cfg.yml", "--world-size", str(2**30)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert out.returncode == 2 and out.stderr.startswith("error: --world-size 1073741824: expected the run's number")


# ------------------------------------------------------------------ SIGHUP


def test_sighup_is_a_stop_signal_unless_ignored():
    """SIGHUP (a closed terminal or ssh session) is kept like SIGTERM; under nohup (ignored when
    the process started) it stays ignored."""
    old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with StopSignals() as sig:
            assert signal.getsignal(signal.SIGHUP) == sig._handle
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert sig.signum == signal.SIGHUP
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with StopSignals() as sig:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_sighup_stops_training_saves_and_exits_0(w):
    """Before: SIGHUP killed train.py at once (exit 129, no line, no checkpoint)."""
    env = _rank_env(0, 1, 0)
    argv = [PY, TRAIN, "cfg.yml", "--set", "train_iters=100000", "--set", "gradient_accumulation_steps=64"]
    with open(w / "h.out", "w") as out, open(w / "h.err", "w") as err:
        p = subprocess.Popen(argv + ["--set", "save=sv"], cwd=str(w), env=env, stdout=out, stderr=err)
    try:
        t0 = time.monotonic()
        while "global batch" not in (w / "h.out").read_text():
            assert p.poll() is None and time.monotonic() - t0 < 60, (w / "h.err").read_text()
            time.sleep(0.1)
        time.sleep(1)
        p.send_signal(signal.SIGHUP)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = (w / "h.out").read_text(), (w / "h.err").read_text()
    assert p.returncode == 0, out + err
    assert "stopped by SIGHUP at step" in out and "; checkpoint sv/global_step" in out, out
    assert any(d.startswith("global_step") for d in os.listdir(w / "sv"))
    assert "Traceback" not in err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
