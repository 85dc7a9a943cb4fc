"""Hostile inputs, probe 9 (issue 29), the emulation/benchmark/Slurm-task families:

* F5: rate and latency values of emulate_cluster and bench_sharding: an empty or blank value meant
  "no limit" (an unset shell variable turned shaping off), a space inside the number was dropped
  (``2 00mbit`` read as 200mbit), ``--latency ''`` meant no delay; also --subnet's ``\\d`` took
  other scripts' digits. Now refused naming the flag; ``unshaped``/``none``/``off``/``0`` stay the
  explicit "no limit";
* F7: bench_convergence quoted torchrun's separator line instead of the ranks' error, and accepted
  --ranks its configs cannot run; now the flags are checked against the variants' configs before
  anything starts, and a child's own ``error:`` line is quoted (error_lines.child_error: also
  bench_sharding's failed rows and gpu_check's dry-run row);
* D1: slurm/srun_task.sh outside srun or with malformed SLURM_* stopped with bash's "unbound
  variable" (and evaluated the value as arithmetic); now one ``slurm: error:`` line naming the variable.

No emulated cluster is built here: every refusal happens before one would be (asserted by replacing
the cluster and subprocess entry points with ones that fail the test).
"""

import os
import subprocess
import types

import pytest

from megatron_topo.analysis.emulation import RateError
from megatron_topo.analysis.emulation.rates import parse_latency_pair, parse_rate
from megatron_topo.commands import bench_convergence as BC
from megatron_topo.commands import bench_sharding as BS
from megatron_topo.commands import emulate_cluster as EC

from .cli_cases import call, one_error_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = ["--nodes", "1", "--gpus-per-node", "1", "--gcds-per-gpu", "1"]
BLANKS = {"empty": "", "space": " ", "tab": "\t", "spaces": "   "}
SPACED = {"inside": "2 00mbit", "decimal": "1. 5gbit", "exponent": "5 e8bit", "bytes": "2 5MB/s"}
NON_ASCII = {"arabic": "٢٠٠mbit", "fullwidth": "２00mbit", "nbsp": "200mbit\u00a0", "devanagari": "२mbit"}


@pytest.fixture
def no_cluster(monkeypatch):
    """emulate_cluster's and bench_sharding's cluster: building one fails the test."""

    def refuse(*a, **k):
        raise AssertionError("an emulated cluster was started")

    monkeypatch.setattr(EC, "Cluster", refuse)
    monkeypatch.setattr("megatron_topo.commands.bench_sharding_run.check_privileges", refuse)


# ------------------------------------------------------------------------------ F5: the parsers
@pytest.mark.parametrize("text", list(BLANKS.values()) + list(SPACED.values()) + list(NON_ASCII.values()))
def test_a_blank_spaced_or_non_ascii_rate_is_refused_naming_the_flag(text):
    with pytest.raises(RateError, match=r"^--inter-node '.*'.*; expected a rate such as 200mbit"):
        parse_rate(text, "--inter-node")


@pytest.mark.parametrize("text", ["", " ", "\t", "5 0us", "50us,", ",10us", "٥us", "1 0ms,2ms", "50us, "])
def test_a_blank_spaced_or_non_ascii_latency_is_refused_naming_the_flag(text):
    with pytest.raises(RateError, match=r"^--latency"):
        parse_latency_pair(text, "--latency")


def test_the_explicit_spellings_still_mean_what_they_say():
    assert [parse_rate(x) for x in ("unshaped", "none", "off", "0", " UNSHAPED ")] == [None] * 5
    assert parse_rate("200mbit") == parse_rate("200 mbit") == parse_rate(" 25 MB/s ") == 200_000_000
    assert parse_rate("5e8bit") == 500_000_000 and parse_rate(None) is None
    assert parse_latency_pair("50us,10us") == (50.0, 10.0) and parse_latency_pair("1 ms") == (1000.0, 0.0)
    assert parse_latency_pair("0") == (0.0, 0.0) and parse_latency_pair(None) == (0.0, 0.0)
    with pytest.raises(RateError, match="exceeds 60 s"):
        parse_latency_pair("9" * 400)


# ------------------------------------------------------------------------------ F5: the tools
@pytest.mark.parametrize("flag", ["--inter-node", "--intra-node", "--intra-gpu"])
@pytest.mark.parametrize("kind", ["empty", "space", "tab", "inside"])
def test_emulate_cluster_refuses_the_rate_before_building_anything(flag, kind, no_cluster, capfd):
    text = {**BLANKS, **SPACED}[kind]
    assert call(EC.main, [*SHAPE, flag, text, "--", "true"]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: {flag} '") and "expected a rate such as 200mbit" in line, line


def test_emulate_cluster_refuses_a_blank_rate_also_with_unshaped(no_cluster, capfd):
    assert call(EC.main, [*SHAPE, "--unshaped", "--inter-node", "", "--", "true"]) == 2
    assert one_error_line(capfd).startswith("error: --inter-node '' is empty")


@pytest.mark.parametrize("text", ["", " ", "\t", "50us,", "5 0us"])
def test_emulate_cluster_refuses_a_blank_latency(text, no_cluster, capfd):
    assert call(EC.main, [*SHAPE, "--latency", text, "--", "true"]) == 2
    assert one_error_line(capfd).startswith("error: --latency"), text


@pytest.mark.parametrize("subnet", ["10.٣", "10.999", "10.256", "192.١٦٨", "10.２"])
def test_emulate_cluster_subnet_is_ascii_and_an_octet(subnet, no_cluster, capfd):
    assert call(EC.main, [*SHAPE, "--subnet", subnet, "--", "true"]) == 2
    assert one_error_line(capfd).startswith(f"error: --subnet '{subnet}' must be the first two octets")


@pytest.mark.parametrize("flag", ["--inter-node", "--intra-node", "--intra-gpu"])
@pytest.mark.parametrize("kind", ["empty", "space", "tab", "inside", "fullwidth"])
def test_bench_sharding_refuses_the_rate_also_in_a_dry_run(flag, kind, tmp_path, no_cluster, capfd):
    text = {**BLANKS, **SPACED, **NON_ASCII}[kind]
    out = tmp_path / "bs"
    assert call(BS.main, ["--dry-run", "--out", str(out), flag, text]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: {flag} '") and "expected a rate such as" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model-set", "hidden_size=abc"], "hidden_size: expected an integer, got str 'abc'"),
        (["--model", "nope.yml"], "config file not found: nope.yml"),
        (["--strategies", "topo", "--model-set", "num_attention_heads=3"], "num_attention_heads"),
    ],
)
def test_bench_sharding_checks_every_runs_config_before_building_a_cluster(argv, needle, tmp_path, no_cluster, capfd):
    """F7's family: a run its ranks would refuse is refused before any cluster, also in a dry run."""
    out = tmp_path / "bs"
    assert call(BS.main, ["--dry-run", "--out", str(out), *argv]) == 2
    line = one_error_line(capfd)
    assert line.startswith("error: [main] ") and "would be refused by its ranks" in line and needle in line, line
    assert not out.exists()


# ------------------------------------------------------------------------------ F7: bench_convergence
TORCHRUN_STDERR = """\
W1127 22:01:02.123000 4242 torch/distributed/run.py:766] *****************************************
error: world size 2 is not a multiple of ranks per node 4 (topology.gpus_per_node=2 x topology.gcds_per_gpu=2)
E1127 22:01:04.000000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 2)
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_22:01:04
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 4243)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.fixture
def no_children(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a variant's run was started")

    monkeypatch.setattr(BC, "subprocess", types.SimpleNamespace(run=refuse))


@pytest.mark.parametrize("ranks", ["1", "2", "3", " 3", "6", "10", "63"])
def test_bench_convergence_refuses_ranks_its_configs_cannot_run(ranks, tmp_path, no_children, capfd):
    out = tmp_path / "bc"
    assert call(BC.main, ["--ranks", ranks, "--steps", "30", "--out", str(out)]) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: --ranks {int(ranks)} cannot run variant exact: "), line
    assert "valid --ranks: 4, 8, 12" in line and "... 64" in line, line
    assert not out.exists()  # nothing claimed, nothing started


def test_bench_convergence_refuses_steps_past_the_config_bound(tmp_path, no_children, capfd):
    assert call(BC.main, ["--steps", str(1 << 41), "--out", str(tmp_path / "bc")]) == 2
    assert "train_iters must lie in" in one_error_line(capfd)


def test_bench_convergence_quotes_the_ranks_error_not_torchruns_separator(tmp_path, monkeypatch):
    done = subprocess.CompletedProcess([], 1, "", TORCHRUN_STDERR)
    monkeypatch.setattr(BC, "subprocess", types.SimpleNamespace(run=lambda *a, **k: done))
    with pytest.raises(SystemExit) as e:
        BC.run(str(tmp_path), "exact", 30, 4)
    assert str(e.value) == (
        "error: variant exact failed (exit 1): world size 2 is not a multiple of ranks per node 4 "
        "(topology.gpus_per_node=2 x topology.gcds_per_gpu=2)"
    )


def test_child_error_finds_the_cause():
    from megatron_topo.error_lines import child_error

    assert child_error(TORCHRUN_STDERR).startswith("world size 2 is not a multiple")
    # emulate_cluster's rank prefixes (bench_sharding's launch.log), torchrun's --tee prefixes
    assert child_error("[r0] step 1\n[r1] error: lost rank 0\n[r0] error: x\n") == "lost rank 0"
    assert child_error("[rank3]: error: bad key\n") == "bad key"
    # no error line: the exception of a traceback, never the summary's rules
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    assert child_error(tb + TORCHRUN_STDERR.split("Traceback")[1]) == "ValueError: boom"
    assert child_error("=" * 60 + "\n", "no output") == "no output"
    assert child_error("") == "no error line"


# ------------------------------------------------------------------------------ D1: srun_task.sh
SRUN_TASK = os.path.join(ROOT, "slurm", "srun_task.sh")


def _task(env, tmp_path):
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    r = subprocess.run(
        ["bash", SRUN_TASK, "sh", "-c", 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE"'],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    return r.returncode, r.stdout, [ln for ln in r.stderr.splitlines() if ln.strip()]


GOOD = {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NNODES": "2"}


@pytest.mark.parametrize(
    "change, name",
    [
        ({"SLURM_NTASKS": None}, "SLURM_NTASKS is not set"),
        ({"SLURM_PROCID": None}, "SLURM_PROCID is not set"),
        ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
        ({"SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc' is not a number of tasks"),
        ({"SLURM_NTASKS": ""}, "SLURM_NTASKS='' is not a number of tasks"),
        ({"SLURM_NTASKS": "٣"}, "SLURM_NTASKS='"),  # '٣' or '??' (the locale's printable characters)
        ({"SLURM_NTASKS": "010"}, "SLURM_NTASKS='010' is not a number of tasks"),
        ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 is not a number of tasks (at least 1"),
        ({"SLURM_NTASKS": "4\nx"}, "SLURM_NTASKS='4?x' is not a number of tasks"),
        ({"SLURM_NNODES": "abc"}, "SLURM_NNODES='abc' is not a number of nodes"),
        ({"SLURM_NNODES": "a[$(touch pwned)]"}, "SLURM_NNODES='a[$(touch pwned)]' is not a number of nodes"),
        ({"SLURM_NTASKS_PER_NODE": "x(x2)"}, "SLURM_NTASKS_PER_NODE='x' is not a number of tasks per node"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is outside SLURM_NTASKS=4 tasks (valid 0..3)"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is not a task rank"),
    ],
)
def test_srun_task_refuses_missing_or_malformed_slurm_variables(change, name, tmp_path):
    env = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    rc, out, err = _task(env, tmp_path)
    assert rc == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith(f"slurm: error: {name}"), err
    assert not os.path.exists(tmp_path / "pwned")  # the value is never evaluated


def test_srun_task_outside_srun_is_one_line(tmp_path):
    rc, out, err = _task({}, tmp_path)
    assert rc == 2 and err == [
        "slurm: error: SLURM_NTASKS is not set: srun_task.sh runs once per task under srun "
        "(srun ... slurm/srun_task.sh python train.py ...)"
    ]


def test_srun_task_job_wide_error_from_task_0_only_and_valid_values_exported(tmp_path):
    rc, out, err = _task({**GOOD, "SLURM_NTASKS": "abc", "SLURM_PROCID": "1"}, tmp_path)
    assert rc == 2 and err == []  # task 0 says it, once per job
    assert _task({**GOOD, "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}, tmp_path)[:2] == (0, "3 4 1 2\n")
    per_node = {**GOOD, "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_PROCID": "9"}
    assert _task(per_node, tmp_path)[:2] == (0, "9 16 0 8\n")


# ------------------------------------------------------------------------------ D1: the batch scripts
from .test_slurm import fake_slurm  # noqa: E402, F401  (the fake sbatch/srun/scontrol of test_slurm.py)


@pytest.mark.parametrize(
    "how, needle",
    [
        ({"sbatch_args": ("--nodes=abc",)}, "slurm: error: SLURM_NNODES='abc' is not a number in ASCII digits 0-9"),
        ({"extra_env": {"FAKE_JOB_ID": "a[$(touch pwned)]"}}, "slurm: error: SLURM_JOB_ID='a[$(touch pwned)]' is not"),
        ({"extra_env": {"FAKE_JOB_ID": "٣"}}, "slurm: error: SLURM_JOB_ID='"),
    ],
)
def test_batch_script_refuses_malformed_slurm_counts(how, needle, fake_slurm, tmp_path):  # noqa: F811
    r = fake_slurm["submit"]("frontier_20b.sh", cwd=str(tmp_path), **how)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert "unbound variable" not in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(os.path.join(fake_slurm["log"], "srun_args"))  # nothing launched
    assert not (tmp_path / "pwned").exists() and not os.path.exists(os.path.join(fake_slurm["log"], "spool", "pwned"))


# ------------------------------------------------------------------------------ F5's family: sizes with a unit
@pytest.mark.parametrize("text", ["", " ", "\t", "5GB\u00a0", "\u00a05GB", "٥GB", "５GB", "5\u2007GB", "5 00MB"])
def test_convert_to_hf_max_shard_size_refuses_blank_non_ascii_and_spaced(text):
    from megatron_topo.model.hf import parse_size

    with pytest.raises(ValueError, match=r"is empty; expected a size|not written in ASCII|is not a size"):
        parse_size(text)
    assert parse_size(" 500 MiB ") == 500 * 2**20  # spaces around, and between number and unit, are fine
