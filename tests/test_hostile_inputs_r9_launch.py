"""Issue 29, probe 9's F2 and F12: an error that every rank of a job finds (a bad config key or value,
a missing config file, a topology that does not fit the world) is printed once per job, by rank 0,
and never hangs the job.

Before: train.py, gpu_check, measure_collectives and train.py --dry-run printed such a line once per
rank (under torchrun and under ranks started by hand), and the topology was checked only after
init_process_group: the ranks that got there first printed and left, a rank still connecting died
with a gloo ``connectFullMesh`` / ``DistNetworkError`` traceback, and others waited in gloo's connect
for good, ignoring SIGTERM (6 ranks with topology.gpus_per_node=4). Now every rank checks the config
(before any rank meets another) and the topology (after the rendezvous, where the ranks agreed on
their inputs, and before init_process_group), reaches the same verdict, and rank 0 alone prints it.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_topo.commands import gpu_check, measure_collectives
from megatron_topo.commands import train as train_cli

from .cli_cases import BASE_CFG, ROOT, call
from .dist_utils import free_port

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
    "MEGATRON_TOPO_FAULT",
)
BOUND_S = 30  # every rank has left by then (the acceptance bound of issue 29)


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    # a rank that did enter the rendezvous (the old code, with a topology error) gives up within 2 s
    assert "distributed: {backend: gloo, device: cpu}" in BASE_CFG
    short = "distributed: {backend: gloo, device: cpu, rendezvous_timeout_s: 2}"
    (tmp_path / "cfg.yml").write_text(BASE_CFG.replace("distributed: {backend: gloo, device: cpu}", short))
    return tmp_path


# (id, argv after the script, the start of the one line; {world}: the job's world size)
TRAIN_ERRORS = {
    "unknown-key": (["cfg.yml", "--set", "no_such_key=1"], "error: --set no_such_key=1: unknown key 'no_such_key'"),
    "bad-int": (["cfg.yml", "--set", "num_layers=abc"], "error: --set num_layers=abc: num_layers: expected an integer"),
    "bad-choice": (["cfg.yml", "--set", "precision=fp8"], "error: precision='fp8' is not valid"),
    "set-syntax": (["cfg.yml", "--set", "novalue"], "error: --set 'novalue': expected dotted.key=value"),
    "yaml-missing": (["nope.yml"], "error: config file not found: nope.yml"),
    "neg-iters": (["cfg.yml", "--set", "train_iters=-1"], "error: train_iters must lie in"),
    "heads": (["cfg.yml", "--set", "num_attention_heads=5"], "error: hidden_size "),
    "split": (["cfg.yml", "--set", "split=a,b"], "error: split='a,b' is not valid"),
    "gpn3": (
        ["cfg.yml", "--set", "topology.gpus_per_node=3"],
        "error: world size {world} is not a multiple of ranks per node 3",
    ),
    "gpn4": (
        ["cfg.yml", "--set", "topology.gpus_per_node=4"],
        "error: world size {world} is not a multiple of ranks per node 4",
    ),
    "gcds4": (
        ["cfg.yml", "--set", "topology.gcds_per_gpu=4"],
        "error: topology.gcds_per_gpu=4 does not divide the world size {world}",
    ),
    "gpn2-gcd2": (
        ["cfg.yml", "--set", "topology.gpus_per_node=2", "--set", "topology.gcds_per_gpu=2"],
        "error: world size {world} is not a multiple of ranks per node 4|error: topology.gcds_per_gpu=2 does not "
        "divide the world size {world}",
    ),
    "argparse": (["cfg.yml", "--rank", "1"], "error: --world-size and --rank go with --dry-run"),
}


def _starts(want, world):
    """The line's possible starts ('|' between them) for a world of ``world`` ranks."""
    return tuple(w.format(world=world) for w in want.split("|"))


def _rank_env(rank, world, port, launcher="by-hand"):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if launcher == "srun":
        env.update(SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_STEP_NUM_TASKS=str(world), SLURM_NTASKS=str(world))
    return env


def _wait_all(procs, what):
    """Wait for every process (its own session) up to BOUND_S; a process left is killed with its
    group and fails the test. Returns (exit codes, the job's combined stdout + stderr)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    hung = [i for i, p in enumerate(procs) if p.poll() is None]
    for p in procs:  # what is left of each session (a rank's children too): nothing may be
        try:
            os.killpg(p.pid, signal.SIGKILL)
            left = True
        except ProcessLookupError:
            left = False
        if left and p.pid not in [procs[i].pid for i in hung]:
            hung.append(procs.index(p))
    outs = [p.communicate() for p in procs]
    text = "".join(o + e for o, e in outs)
    assert not hung, f"{what}: processes {hung} still running after {BOUND_S} s (killed):\n{text[-3000:]}"
    return [p.returncode for p in procs], text


def _launch(argv_of_rank, world, launcher="by-hand", script="train.py", port=None):
    port = port or free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(ROOT, *script.split("/")), *argv_of_rank(r)],
            env=_rank_env(r, world, port, launcher),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for r in range(world)
    ]
    return _wait_all(procs, f"{world} ranks of {script}")


def _assert_once(rcs, text, want):
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(want), text[-3000:]
    assert "Traceback" not in text and "DistNetworkError" not in text and "connectFullMesh" not in text, text[-3000:]
    assert all(rc == 2 for rc in rcs), (rcs, text[-3000:])


@pytest.mark.parametrize(
    "world, case",
    [(2, "unknown-key"), (2, "gpn2-gcd2"), (4, "bad-int"), (4, "gpn3"), (6, "gpn4"), (6, "gcds4")],
    ids=lambda v: str(v),
)
def test_every_rank_finds_it_rank_0_says_it_once_and_all_leave(job_dir, world, case):
    """Ranks started by hand (RANK/WORLD_SIZE/MASTER_*): one line for the job, every rank exits 2
    within the bound, none left. Before: the line once per rank; with 6 ranks and gpus_per_node=4 a
    gloo traceback and ranks left waiting in init_process_group."""
    argv, want = TRAIN_ERRORS[case]
    rcs, text = _launch(lambda r: argv, world)
    _assert_once(rcs, text, _starts(want, world))


@pytest.mark.parametrize("world, case", [(2, "gpn3"), (4, "unknown-key")], ids=["2-gpn3", "4-unknown-key"])
def test_under_torchrun_it_is_one_line(job_dir, world, case):
    """torchrun (its agent serves the store and ends the job at the first failed rank): rank 0's
    line once, never cut (a quiet rank waits for the agent: cli.leave_to_rank_0); no rank's
    traceback (torchrun's own ChildFailedError summary aside, which names the ranks' exit codes)."""
    argv, want = TRAIN_ERRORS[case]
    env = _rank_env(0, 1, 0)
    for k in LAUNCH_VARS:
        env.pop(k, None)
    p = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world)]
        + [os.path.join(ROOT, "train.py"), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    (rc,), text = _wait_all([p], "torchrun")
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(_starts(want, world)), text[-3000:]
    assert rc != 0 and "DistNetworkError" not in text and "connectFullMesh" not in text, text[-3000:]
    assert "megatron_topo" not in text, text[-3000:]  # no frame of ours


@pytest.mark.parametrize(
    "tool, argv, want",
    [
        ("tools/gpu_check.py", ["cfg.yml", "--small", "--set", "no_such=1"], "error: --set no_such=1: unknown key"),
        (
            "tools/gpu_check.py",
            ["cfg.yml", "--small", "--set", "topology.gpus_per_node=3"],
            "error: world size 2 is not a multiple of ranks per node 3",
        ),
        ("tools/measure_collectives.py", ["--system", "nope.yml"], "error: config file not found: nope.yml"),
        ("tools/measure_collectives.py", ["--sizes-mb", "0"], "error: --sizes-mb '0': sizes must be positive"),
        ("train.py", ["cfg.yml", "--dry-run", "--set", "no_such_key=1"], "error: --set no_such_key=1: unknown key"),
    ],
    ids=["gpu_check-key", "gpu_check-topology", "measure-system", "measure-sizes", "dry-run-key"],
)
def test_every_multi_rank_tool_says_it_once(job_dir, tool, argv, want):
    """The other tools that run as the ranks of a job: the same rule, 2 ranks by hand."""
    rcs, text = _launch(lambda r: argv, 2, script=tool)
    _assert_once(rcs, text, want)


def test_gpu_check_spawn_says_it_once(job_dir):
    """gpu_check --spawn 3 starts its own ranks: rank 0 prints the line, the run exits 2."""
    p = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "cfg.yml", "--small", "--spawn", "3"]
        + ["--set", "topology.gpus_per_node=2"],
        env={**_rank_env(0, 1, 0), **{k: "" for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    (rc,), text = _wait_all([p], "gpu_check --spawn 3")
    _assert_once([rc], text, "error: world size 3 is not a multiple of ranks per node 2")


# ------------------------------------------------------------------ in-process: each rank's verdict
def _as_rank(monkeypatch, rank, world, launcher="by-hand"):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    env = _rank_env(rank, world, 1, launcher)  # port 1: a rank that tried to meet another would fail
    for k in LAUNCH_VARS:
        if k in env:
            monkeypatch.setenv(k, env[k])


ENTRIES = {
    "train": (train_cli.main, []),
    "dry-run": (train_cli.main, ["--dry-run"]),
    "gpu_check": (gpu_check.main, ["--small", "--no-dry-run"]),
}


@pytest.mark.parametrize("launcher", ["by-hand", "srun"])
@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("case", sorted(TRAIN_ERRORS))
def test_rank_1_is_silent_and_rank_0_says_it(job_dir, capfd, monkeypatch, entry, case, launcher):
    """Every error kind x every tool that takes a training config: rank 1 of 5 exits 2 without a
    word (before: it printed rank 0's line), rank 0 prints the one line; neither meets the other
    (the dry run checks the topology on its own, as every rank would)."""
    fn, extra = ENTRIES[entry]
    argv, want = TRAIN_ERRORS[case]
    if case == "argparse" and entry != "train":
        pytest.skip("--rank without --dry-run is train.py's own flag rule")
    if case.startswith("g") and entry != "dry-run":
        pytest.skip("a topology is checked after the rendezvous: the multi-process tests above")
    monkeypatch.setattr("megatron_topo.lifecycle.leave_rank", lambda rc: None)  # gpu_check: stay here
    for rank in (1, 0):
        _as_rank(monkeypatch, rank, 5, launcher)  # 5 ranks: no topology case fits
        assert call(fn, [*argv, *extra]) == 2, (entry, case, rank)
        err = capfd.readouterr().err
        if rank:
            assert err == "", (entry, case, err)
        else:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith(_starts(want, 5)), (entry, case, err)


@pytest.mark.parametrize("rank", [1, 0])
def test_measure_collectives_rank_1_is_silent(job_dir, capfd, monkeypatch, rank):
    _as_rank(monkeypatch, rank, 2)
    monkeypatch.setattr("megatron_topo.commands.measure_collectives_run.leave_rank", lambda rc: None)  # stay here
    for argv, want in (
        (["--system", "nope.yml"], "error: config file not found: nope.yml"),
        (["--system", "cfg.yml", "--ops", "bogus"], "error: --ops: 'bogus' is not valid"),
        (["--iters", "0"], "error: argument --iters"),
    ):
        assert call(measure_collectives.main, argv) == 2
        err = capfd.readouterr().err
        assert (err == "") if rank else err.startswith(want) and len(err.splitlines()) == 1, (argv, err)


def test_measure_collectives_bad_world_size_is_one_line(job_dir, capfd, monkeypatch):
    """Before: the line, then a JobWideError traceback from main's second look at WORLD_SIZE."""
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert call(measure_collectives.main, ["--out", "mc"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("error: launcher environment: WORLD_SIZE='abc'") and len(err.splitlines()) == 1, err


def test_control_a_rank_that_alone_cannot_reach_rank_0_says_so(job_dir, capfd, monkeypatch):
    """An error of one rank (its own variables, or rank 0 not answering) is still printed by that
    rank: only what every rank finds alike is left to rank 0."""
    _as_rank(monkeypatch, 1, 2)
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert call(train_cli.main, ["cfg.yml"]) == 2
    assert "LOCAL_RANK=5 is not a rank on this node" in capfd.readouterr().err
    _as_rank(monkeypatch, 1, 2)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nobody serves it
    assert call(train_cli.main, ["cfg.yml", "--set", "distributed.rendezvous_timeout_s=1"]) == 2
    assert "rank 1: rank 0's rendezvous store" in capfd.readouterr().err


def test_control_a_lone_process_prints_its_error(job_dir, capfd, monkeypatch):
    """No world (a lone process, or RANK=1 alone): the process prints its own line."""
    monkeypatch.setenv("RANK", "1")
    assert call(train_cli.main, ["cfg.yml", "--set", "no_such_key=1"]) == 2
    assert capfd.readouterr().err.startswith("error: --set no_such_key=1: unknown key")
