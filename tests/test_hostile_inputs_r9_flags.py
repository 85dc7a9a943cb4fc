"""Issue 29, probe 9's flag findings (F1, F9, F10) and debatable groups D2, D4, D6.

* F1: flags declared ``type=int``/``type=float`` read other scripts' digits (``--world-size ３`` ran
  with 3; ``--vocab-size ٢00`` was refused quoting 200, never written). Every number flag of every
  tool now goes through ``cli.number``/``cli.bounded`` (ASCII digits 0-9); a walk over every
  ``add_argument`` in the package asserts no plain int/float type is left.
* F9: ``bench_kernels/bench_model --json ''`` ran, wrote nothing and said nothing. Every path flag of
  every tool refuses an empty or blank value naming the flag (``cli.path_arg``).
* F10: Ctrl-C printed a KeyboardInterrupt traceback in most tools. Every entry point (tools/*.py,
  train.py, ``python -m``) goes through ``cli.run``: one line, exit 130, nothing half-written.
* D2: a config whose top level is not a mapping gave a second, consequential "... are required" line.
* D4: MEGATRON_TOPO_LOCK_LEASE_S='٣' was read as 3 (also MEGATRON_TOPO_FAULT's numbers).
* D6: check_neox_configs printed a file name holding ESC raw into its stdout table.
"""

from __future__ import annotations

import ast
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_topo import cli
from megatron_topo.commands import bench_convergence as BC
from megatron_topo.commands import bench_data as BD
from megatron_topo.commands import bench_kernels as BK
from megatron_topo.commands import bench_model as BM
from megatron_topo.commands import bench_sharding as BS
from megatron_topo.commands import check_neox_configs as CNC
from megatron_topo.commands import consolidate_checkpoint as CC
from megatron_topo.commands import convert_to_hf as CH
from megatron_topo.commands import emulate_cluster as EC
from megatron_topo.commands import generate as GEN
from megatron_topo.commands import gpu_check as GC
from megatron_topo.commands import inspect_data as ID
from megatron_topo.commands import measure_collectives as MC
from megatron_topo.commands import plan as PLAN
from megatron_topo.commands import plot_metrics as PM
from megatron_topo.commands import predict_perf as PP
from megatron_topo.commands import prepare_data as PD
from megatron_topo.commands import preprocess_data as PRE
from megatron_topo.commands import train as train_cli
from megatron_topo.commands import train_tokenizer as TT
from megatron_topo.zero_topo import trace as TRACE

from .cli_cases import BASE_CFG, build_hostile_world, call, one_error_line, scratch, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "megatron_topo")
MODEL = os.path.join(ROOT, "configs", "tiny.yml")
SYSTEM = os.path.join(ROOT, "configs", "frontier.yml")
CHAR = "CharLevelTokenizer"
DIGITS = {"arabic": "٣", "fullwidth": "３", "devanagari": "३", "thai": "๓"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world plus nc/ (one small NeoX yml), mr/metrics.jsonl and text/in.jsonl."""
    d = build_hostile_world(tmp_path_factory.mktemp("r9flags"))
    (d / "nc").mkdir()
    (d / "nc" / "a.yml").write_text(BASE_CFG)
    (d / "mr").mkdir()
    (d / "mr" / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": {4 - i / 10}}}\n' for i in range(1, 5)))
    (d / "text").mkdir()
    (d / "text" / "in.jsonl").write_text("".join(f'{{"text": "hello world {i} and more text"}}\n' for i in range(40)))
    return d


@pytest.fixture
def w(world, tmp_path, monkeypatch):
    return scratch(world, tmp_path, monkeypatch)


# ---------------------------------------------------------------- F1: every number flag is ASCII


def _add_argument_calls():
    for path in sorted(glob.glob(os.path.join(PKG, "**", "*.py"), recursive=True)):
        tree = ast.parse(open(path).read())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument":
                yield os.path.relpath(path, ROOT), n


def test_no_flag_of_any_tool_is_parsed_with_plain_int_or_float():
    calls = list(_add_argument_calls())
    assert len(calls) > 200  # the walk sees every tool's parser
    plain = [
        f"{path}:{n.lineno}"
        for path, n in calls
        for k in n.keywords
        if k.arg == "type" and isinstance(k.value, ast.Name) and k.value.id in ("int", "float")
    ]
    assert plain == [], f"flags parsed with int()/float(), which read '٣' and '３' as digits: {plain}"


F1_CASES = {  # name: (entry, argv with {} for the digit, flag)
    "cnc-ws": (CNC.main, ["nc", "--world-size", "{}"], "--world-size"),
    "cnc-vocab": (CNC.main, ["nc", "--vocab-size", "{}00"], "--vocab-size"),
    "gc-layers": (GC.main, ["cfg.yml", "--small", "--layers", "{}"], "--layers"),
    "gc-timeout": (GC.main, ["cfg.yml", "--small", "--timeout", "{}0"], "--timeout"),
    "gc-delay": (GC.main, ["cfg.yml", "--small", "--max-delay-ms", "{}"], "--max-delay-ms"),
    "gc-spawn": (GC.main, ["cfg.yml", "--small", "--spawn", "{}"], "--spawn"),
    "train-ws": (train_cli.main, ["cfg.yml", "--dry-run", "--world-size", "{}"], "--world-size"),
    "train-rank": (train_cli.main, ["cfg.yml", "--dry-run", "--world-size", "4", "--rank", "{}"], "--rank"),
    "prep-ws": (PD.main, ["cfg.yml", "--world-size", "{}"], "--world-size"),
    "plot-smooth": (PM.main, ["mr", "--out", "p.png", "--smooth", "{}"], "--smooth"),
    "tt-vocab": (
        TT.main,
        ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "{}00", "--output", "t.json"],
        "--vocab-size",
    ),
    "bk-block": (
        BK.main,
        ["--block-size", "{}", "--repeats", "1", "--rounds", "1", "--json", "bk.json"],
        "--block-size",
    ),
}


@pytest.mark.parametrize("script", sorted(DIGITS))
@pytest.mark.parametrize("case", sorted(F1_CASES))
def test_number_flags_refuse_other_scripts_digits(case, script, w, capfd):
    entry, argv, flag = F1_CASES[case]
    digit = DIGITS[script]
    argv = [a.format(digit) for a in argv]
    before = snapshot(w, skip=("cache",))
    assert call(entry, argv) == 2
    line = one_error_line(capfd)
    value = next(a for a in argv if digit in a)
    assert line.startswith(f"error: argument {flag}: '{value}' is not "), line
    assert "in ASCII digits 0-9" in line, line
    assert snapshot(w, skip=("cache",)) == before


@pytest.mark.parametrize(
    "entry, argv, want",
    [  # the bounds the tools checked before keep their wording
        (
            TT.main,
            ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "200", "--output", "t.json"],
            "error: --vocab-size 200: must lie in [",
        ),
        (CNC.main, ["nc", "--world-size", "0"], "error: --world-size 0: must lie in 1.."),
        (GC.main, ["cfg.yml", "--small", "--layers", "0"], "error: --layers 0: must lie in 1..4096"),
        (GC.main, ["cfg.yml", "--small", "--timeout", "nan"], "error: --timeout nan: must lie in (0, 86400]"),
        (PD.main, ["cfg.yml", "--world-size", "0"], "error: --world-size 0: expected the run's number of ranks"),
        (PM.main, ["mr", "--out", "p.png", "--smooth", "0"], "error: --smooth: must be >= 1, got 0"),
    ],
)
def test_number_flags_keep_their_bounds_wording(entry, argv, want, w, capfd):
    assert call(entry, argv) != 0
    assert one_error_line(capfd).startswith(want)


def test_check_neox_configs_ascii_world_size_still_runs(w, capfd):
    assert call(CNC.main, ["nc", "--world-size", "3"]) == 0
    assert "1 of 1 files pass (dry run, unchanged, vocab_size=50304, world size 3)" in capfd.readouterr().out


def test_subnet_and_shard_size_are_ascii():
    from megatron_topo.analysis.emulation.cluster_spec import ClusterSpec, EmulationError
    from megatron_topo.model.hf import parse_size

    assert ClusterSpec(nodes=1, gpus_per_node=1, gcds_per_gpu=1, subnet="10.213").subnet == "10.213"
    for bad in ("10.٢١٣", "10.２", "10.256", "10.999"):
        with pytest.raises(EmulationError, match="private /16"):
            ClusterSpec(nodes=1, gpus_per_node=1, gcds_per_gpu=1, subnet=bad)
    assert parse_size(" 5 GB ") == 5 * 10**9
    for bad in ("5\u00a0GB", "5GB\u2007", "\u30005GB"):
        with pytest.raises(ValueError, match="is not a size|not written in ASCII"):
            parse_size(bad)


# ---------------------------------------------------------------- F9: every path flag refuses ''

# a path flag: an option or positional naming a file or folder the tool reads or writes
PATH_NAMES = {
    "--json",
    "--out",
    "--output",
    "--checkpoint",
    "--config",
    "--model",
    "--system",
    "--vocab-file",
    "--merge-file",
    "--input",
    "--plot",
    "--emulated",
    "--stats-json",
    "--cpu-fit",
    "--pool",
    "--tokenizer-model",
    "--hf-cache-dir",
    "--output-prefix",
    "configs",
    "folder",
    "runs",
    "prefix",
    "dir",
}
OWN_CHECK = {  # path flags refusing '' with their own earlier wording (tested below), and fsdp_baseline's (helper fsdp)
    ("megatron_topo/commands/preprocess_data.py", "--output-prefix"),
    ("megatron_topo/commands/fsdp_baseline.py", "configs"),
    ("megatron_topo/commands/fsdp_train.py", "configs"),
}


def test_every_path_flag_refuses_an_empty_value_by_type():
    missing = []
    for path, n in _add_argument_calls():
        names = {a.value for a in n.args if isinstance(a, ast.Constant)}
        if not names & PATH_NAMES or (path, min(names & PATH_NAMES)) in OWN_CHECK:
            continue
        if any(k.arg == "action" for k in n.keywords):  # plan --json, predict_perf --json: a switch, no value
            continue
        kind = next((k.value for k in n.keywords if k.arg == "type"), None)
        if not (isinstance(kind, ast.Name) and kind.id == "path_arg"):
            missing.append(f"{path}:{n.lineno} {sorted(names)}")
    assert missing == []


EMPTY_CASES = {  # name: (entry, argv with {} for the value, flag as named in the line)
    "bk-json": (BK.main, ["--json", "{}", "--repeats", "1", "--rounds", "1", "--warmup", "0"], "--json"),
    "bm-json": (BM.main, ["--json", "{}", "--steps", "1", "--repeats", "1", "--warmup", "0"], "--json"),
    "bm-config": (BM.main, ["--config", "{}"], "--config"),
    "bd-json": (BD.main, ["--json", "{}"], "--json"),
    "bd-input": (BD.main, ["--input", "{}"], "--input"),
    "bs-out": (BS.main, ["--dry-run", "--out", "{}"], "--out"),
    "bs-model": (BS.main, ["--dry-run", "--model", "{}"], "--model"),
    "bc-out": (BC.main, ["--out", "{}"], "--out"),
    "cnc-folder": (CNC.main, ["{}"], "folder"),
    "cc-ck": (CC.main, ["--checkpoint", "{}", "--output", "o.pt"], "--checkpoint"),
    "cc-out": (CC.main, ["--checkpoint", "ck", "--output", "{}"], "--output"),
    "ch-out": (CH.main, ["--checkpoint", "ck", "--output", "{}"], "--output"),
    "ch-vocab": (CH.main, ["--checkpoint", "ck", "--output", "hfo", "--vocab-file", "{}"], "--vocab-file"),
    "ec-stats": (EC.main, ["--nodes", "1", "--stats-json", "{}", "--", "true"], "--stats-json"),
    "gen-ck": (GEN.main, ["--checkpoint", "{}", "--prompt-ids", "1"], "--checkpoint"),
    "gen-cfg": (GEN.main, ["{}", "--prompt-ids", "1"], "CONFIG.yml"),
    "gc-cfg": (GC.main, ["{}", "--small"], "configs"),
    "id-prefix": (ID.main, ["{}"], "prefix"),
    "mc-out": (MC.main, ["--out", "{}"], "--out"),
    "mc-system": (MC.main, ["--system", "{}"], "--system"),
    "plan-model": (PLAN.main, ["--model", "{}", "--system", SYSTEM, "--nodes", "1"], "--model"),
    "plan-system": (PLAN.main, ["--model", MODEL, "--system", "{}", "--nodes", "1"], "--system"),
    "pm-runs": (PM.main, ["{}", "--out", "p.png"], "RUN_DIR"),
    "pm-out": (PM.main, ["mr", "--out", "{}"], "--out"),
    "pp-plot": (PP.main, ["--model", MODEL, "--system", SYSTEM, "--gcds", "8", "--plot", "{}"], "--plot"),
    "pp-emulated": (PP.main, ["--emulated", "{}"], "--emulated"),
    "pd-cfg": (PD.main, ["{}", "--world-size", "1"], "configs"),
    "pre-vocab": (
        PRE.main,
        ["--input", "text/in.jsonl", "--output-prefix", "x", "--tokenizer-type", "HFTokenizer", "--vocab-file", "{}"],
        "--vocab-file",
    ),
    "pre-out": (
        PRE.main,
        ["--input", "text/in.jsonl", "--output-prefix", "{}", "--tokenizer-type", CHAR],
        "--output-prefix",
    ),
    "pre-input": (PRE.main, ["--input", "{}", "--output-prefix", "x", "--tokenizer-type", CHAR], "--input"),
    "train-cfg": (train_cli.main, ["{}", "--dry-run"], "configs"),
    "tt-out": (
        TT.main,
        ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "300", "--output", "{}"],
        "--output",
    ),
    "tt-in": (
        TT.main,
        ["--input", "{}", "--model-type", "bpe", "--vocab-size", "300", "--output", "t.json"],
        "--input",
    ),
    "trace-dir": (TRACE.main, ["{}"], "dir"),
}


@pytest.mark.parametrize("value", ["", " "])
@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_empty_path_flags_are_one_line(case, value, w, capfd):
    entry, argv, flag = EMPTY_CASES[case]
    argv = [a.format(value) for a in argv]
    before = snapshot(w, skip=("cache",))
    assert call(entry, argv) not in (0, None)
    line = one_error_line(capfd)
    assert flag in line and ("empty" in line or "blank" in line), line
    assert snapshot(w, skip=("cache",)) == before


# ---------------------------------------------------------------- F10: Ctrl-C is one line everywhere


def test_every_command_main_is_interruptible():
    """tools/NAME.py, train.py and the megatron-topo-NAME entry points all call commands.NAME.main."""
    import importlib

    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        targets = sorted(tomllib.load(f)["project"]["scripts"].values())
    assert len(targets) >= 22
    plain = []
    for target in targets:
        module, func = target.split(":")
        if module == "megatron_topo.commands.fsdp_baseline":  # helper fsdp handles its Ctrl-C (probe 9 F3/F4)
            continue
        if not getattr(getattr(importlib.import_module(module), func), "interruptible", False):
            plain.append(target)
    assert TRACE.main.interruptible  # python -m megatron_topo.zero_topo.trace
    assert plain == []


def test_interruptible_turns_keyboard_interrupt_into_one_line(capfd, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)

    def main(argv):
        raise KeyboardInterrupt

    assert cli.interruptible(main)(["x"]) == 130
    assert one_error_line(capfd) == "error: interrupted; nothing written"
    # a rank other than 0 of a launched job says nothing: rank 0 says it once for the job
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.interruptible(main)(None) == 130
    assert capfd.readouterr().err == ""
    assert cli.interruptible(lambda argv: 7)() == 7


CTRLC = {  # the tools probe 9 found printing a traceback (ctrlc9-*): argv that runs for many seconds
    "consolidate_checkpoint": ["--checkpoint", "ck", "--output", "o.pt"],
    "convert_to_hf": ["--checkpoint", "ck", "--output", "hf2"],
    "generate": ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "1024"],
    "plan": ["--model", os.path.join(ROOT, "configs", "20B.yml"), "--system", SYSTEM, "--nodes", "4096"],
    "predict_perf": [
        "--model",
        os.path.join(ROOT, "configs", "20B.yml"),
        "--system",
        SYSTEM,
        "--gcds",
        "8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768",
    ],
    "bench_model": [
        "--steps",
        "200",
        "--repeats",
        "30",
        "--warmup",
        "0",
        "--num-layers",
        "1",
        "--hidden-size",
        "16",
        "--num-attention-heads",
        "2",
        "--seq-length",
        "8",
        "--vocab-size",
        "64",
        "--batch",
        "1",
        "--json",
        "bm.json",
    ],
    "bench_kernels": [
        "--repeats",
        "100",
        "--rounds",
        "5",
        "--warmup",
        "0",
        "--backends",
        "reference",
        "--json",
        "bk.json",
    ],
    "fp16_gradient_error": ["--worlds", "8", "64", "384"],
    "gpu_check": ["cfg.yml", "--small"],
    "check_neox_configs": ["nc", "--world-size", "1"],
    "prepare_data": ["cfg.yml", "--world-size", "1", "--set", "data_cache_dir=c9", "--set", "train_iters=100000"],
}


def _default_sigint():  # a test runner may ignore SIGINT (probe 9's background runners did): a terminal's default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _torch_loaded(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


# Ctrl-C while main loads torch (these modules load it inside main): consolidate_checkpoint, predict_perf and
# prepare_data work for a fraction of a second on this world, so a later Ctrl-C finds them done
IN_MAIN_IMPORTS = (
    "check_neox_configs",
    "consolidate_checkpoint",
    "convert_to_hf",
    "generate",
    "gpu_check",
    "prepare_data",
)
WORK_IN_CI = ("bench_kernels", "generate", "plan")  # Ctrl-C in the middle of the work; -m slow: the others below
WORK_SLOW = ("bench_model", "check_neox_configs", "convert_to_hf", "fp16_gradient_error", "gpu_check")
CTRLC_RUNS = (
    [(t, "imports") for t in IN_MAIN_IMPORTS]
    + [(t, "work") for t in WORK_IN_CI]
    + [pytest.param(t, "work", marks=pytest.mark.slow) for t in WORK_SLOW]
)
WORK_S = {"generate": 0.8}  # seconds into the work (after the imports) the Ctrl-C comes; default 2.5


@pytest.mark.parametrize("tool, during", CTRLC_RUNS)
def test_ctrl_c_is_one_line_exit_130_nothing_written(tool, during, w):
    before = snapshot(w, skip=("cache",))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    p = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", f"{tool}.py"), *CTRLC[tool]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )
    try:
        end = time.monotonic() + 60
        while not _torch_loaded(p.pid) and p.poll() is None and time.monotonic() < end:
            time.sleep(0.02)  # the tool is inside its imports (torch's library mapped, its modules still loading)
        if during == "work":
            time.sleep(WORK_S.get(tool, 2.5))
        assert p.poll() is None, f"{tool} ended before the Ctrl-C: {p.communicate()}"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    lines = [x for x in err.splitlines() if x.strip()]
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert lines[-1:] == ["error: interrupted; nothing written"], err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    after = snapshot(w, skip=("cache",))
    new = sorted(set(after) - set(before))
    assert not [f for f in new if not f.startswith(("c9/", "runs/"))], new  # prepare_data's cache: whole files only
    assert {k: after[k] for k in before} == before


# ---------------------------------------------------------------- D2, D4, D6


@pytest.mark.parametrize("text, kind", [("- 1\n- 2\n", "list"), ("just a string\n", "str"), ("42\n", "int")])
def test_config_top_level_not_a_mapping_is_one_line(text, kind, w, capfd):
    (w / "x.yml").write_text(text)
    assert call(train_cli.main, ["x.yml", "--dry-run"]) == 2
    assert one_error_line(capfd) == f"error: x.yml: the top level must be a mapping of keys, got {kind}"
    assert call(PD.main, ["x.yml", "--world-size", "1"]) != 0
    assert "the top level must be a mapping" in one_error_line(capfd)


@pytest.mark.parametrize("value", ["٣", "３", "3\u00a0", "\u20073"])
def test_lock_lease_variable_is_ascii(value, monkeypatch):
    from megatron_topo import runlock

    monkeypatch.setenv(runlock.LEASE_ENV, value)
    lease, problem = runlock._lease_from_env()
    assert lease == 300.0 and problem and runlock.LEASE_ENV in problem
    monkeypatch.setenv(runlock.LEASE_ENV, " 3 ")
    assert runlock._lease_from_env() == (3.0, None)


def test_fault_variable_numbers_are_ascii():
    from megatron_topo.config import ConfigError
    from megatron_topo.training import fault_injection as F

    assert F.parse("kill:rank=1:step=3")[0].step == 3
    for bad in ("kill:rank=1:step=٣", "nan:step=3:unit=２", "kill:rank=١:step=3"):
        with pytest.raises(ConfigError, match="is not an integer"):
            F.parse(bad)


def test_local_world_size_in_other_digits_is_not_read(monkeypatch):
    from megatron_topo import preflight

    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    for v in ("²", "٣"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", v)
        assert preflight.ranks_on_this_host() == 1  # '²' was a ValueError traceback, '٣' read as 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert preflight.ranks_on_this_host() == 3


def test_check_neox_configs_escapes_file_names_in_its_table(w, capfd):
    (w / "nc" / "a.yml").rename(w / "nc" / "a\x1b[2J|b.yml")
    (w / "nc" / "c\u2028d.yml").write_text("- 1\n")
    assert call(CNC.main, ["nc", "--world-size", "1"]) == 0
    out = capfd.readouterr().out
    assert "\x1b" not in out and "\u2028" not in out
    assert "| `a\\x1b[2J\\|b.yml` | passes |  |" in out, out
    assert "| `c\\u2028d.yml` | refused |" in out, out


def test_wrote_lines_escape_the_path(w, capfd):
    name = "o\x1b[2J.pt"
    assert call(CC.main, ["--checkpoint", "ck", "--output", name]) == 0
    out = capfd.readouterr().out
    assert "\x1b" not in out and "wrote o\\x1b[2J.pt" in out, out
