"""A distributed tool's bad argument is one line per job: under torchrun every rank parses the same
argv, and before, each of them printed the same `error:` line (4 lines on 4 ranks). A RANK left in
a plain shell's environment still prints (no launcher: the process is a job of its own)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.mark.parametrize(
    "tool, args, want",
    [
        ("tools/measure_collectives.py", ["--iters", "1000000"], "--iters: 1000000 must lie in [1, 100,000]"),
        ("train.py", ["configs/tiny.yml", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ],
)
def test_a_bad_argument_under_torchrun_is_one_line(tool, args, want):
    r = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node", "4", os.path.join(REPO, tool), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and want in lines[0], lines


@pytest.mark.parametrize(
    "env, prints",
    [
        ({"RANK": "3", "WORLD_SIZE": "8"}, True),  # left in a shell: no launcher
        ({"TORCHELASTIC_RUN_ID": "j", "RANK": "3", "WORLD_SIZE": "8"}, False),
        ({"TORCHELASTIC_RUN_ID": "j", "RANK": "0", "WORLD_SIZE": "8"}, True),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4"}, False),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"}, True),
        ({"TORCHELASTIC_RUN_ID": "j", "RANK": "9", "WORLD_SIZE": "8"}, True),  # not a rank of that job
        ({"TORCHELASTIC_RUN_ID": "j", "RANK": "\u00b2", "WORLD_SIZE": "8"}, True),  # '²': int() refuses it
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "\u0663", "SLURM_STEP_NUM_TASKS": "4"}, True),  # Arabic-Indic 3
    ],
)
def test_only_rank_0_of_a_launched_job_prints_the_argument_error(monkeypatch, capsys, env, prints):
    from megatron_topo.cli import OneLineParser

    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = OneLineParser(prog="t", job_tool=True)
    p.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (err.count("error: ") == 1) if prints else err == ""
    plain = OneLineParser(prog="t")  # a one-process tool always prints
    with pytest.raises(SystemExit):
        plain.parse_args(["--zzz"])
    assert capsys.readouterr().err.startswith("error: ")
