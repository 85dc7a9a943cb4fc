"""Issue 29, "an output never replaces what the run did not create", for the benchmark and
measurement tools (megatron_topo.tool_outputs): bench_data / bench_kernels / bench_model ``--json``,
emulate_cluster ``--stats-json``, measure_collectives / bench_sharding / bench_convergence ``--out``.

Before: ``bench_data --json`` wrote with a plain open (a symbolic link's target overwritten, a FIFO
blocked forever, ``--json configs/tiny.yml`` overwritten); the others wrote atomically but over any
file (``--json README.md`` replaced the README) and into any folder; ``bench_convergence --out runs``
deleted the user's ``runs/topo/metrics.jsonl``; its ``--reuse`` was a traceback on a corrupt line.
Now every case below is one ``error:`` line, exit 2, before any benchmark work, and every file that
was there is unchanged; a rerun over the tool's own earlier output (or one written before the
``"tool"`` field) still just works. No emulated cluster is built and nothing is trained: the
cluster and the training subprocess are replaced by stubs that fail the test if reached.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import threading
import time
import types

import pytest

from megatron_topo.commands import bench_convergence as BC
from megatron_topo.commands import emulate_cluster as EC
from megatron_topo.commands import measure_collectives as MC
from megatron_topo.tool_outputs import MARKER, OutputError, check_file, is_own, write_result

from .cli_cases import call, one_error_line
from .tool_loader import load_tool

PRECIOUS = '{"mine": "a file of the user, JSON like the results"}\n'
TINY_MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16"]
TINY_MODEL += ["--vocab-size", "64", "--batch", "1", "--steps", "1", "--repeats", "1", "--warmup", "0"]
ARGV = {  # each tool's cheapest real arguments (what the old code ran before writing), the output last
    "bench_data": ["--mb", "0.01", "--workers", "1", "--tokenizer-type", "ByteLevel", "--json"],
    "bench_kernels": ["--sizes-mib", "0.1", "--repeats", "1", "--rounds", "1", "--warmup", "0", "--json"],
    "bench_model": [*TINY_MODEL, "--json"],
    "emulate_cluster": ["--stats-json"],  # + "-- true"
    "measure_collectives": ["--sizes-mb", "1", "--iters", "1", "--warmup", "0", "--out"],  # a folder
}


def argv_for(tool: str, path: str) -> list:
    return [*ARGV[tool], path] + (["--", "true"] if tool == "emulate_cluster" else [])


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A working folder with a user's files, a checkpoint, an HF export and a run's log folder; the
    emulated cluster and bench_convergence's training replaced by stubs that must not be reached."""
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "user.json").write_text(PRECIOUS)
    (tmp_path / "README.md").write_text("# the user's readme\n")
    (tmp_path / "ck" / "global_step2").mkdir(parents=True)
    (tmp_path / "ck" / "global_step2" / "meta.json").write_text('{"step": 2}\n')
    (tmp_path / "ck" / "latest").write_text("global_step2\n")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt_neox"}\n')
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / "runs" / "topo").mkdir(parents=True)
    (tmp_path / "runs" / "topo" / "metrics.jsonl").write_text('{"step": 10, "loss": 3.5}\n')

    def no_cluster(*a, **k):
        raise AssertionError("the emulated cluster was about to be built")

    def no_training(cmd, **k):  # a failed run: the old code had removed the variant's metrics first
        return subprocess.CompletedProcess(cmd, 1, "", "stub: bench_convergence was about to train")

    monkeypatch.setattr(EC, "Cluster", no_cluster)
    monkeypatch.setattr(BC, "subprocess", types.SimpleNamespace(run=no_training))
    return tmp_path


def snapshot(root) -> dict:
    """Every entry under ``root``: its kind and content (a link's target; a FIFO is never opened)."""
    out = {}
    for dp, dirs, fs in os.walk(root):
        for n in dirs + fs:
            p = os.path.join(dp, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                v = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                v = ("file", hashlib.sha256(open(p, "rb").read()).hexdigest())
            else:
                v = (stat.S_IFMT(st.st_mode),)
            out[os.path.relpath(p, root)] = v
    return out


def run_tool(tool, argv, fifo=None, timeout=30):
    """``tools/TOOL.py``'s main(argv) in this thread (its signal handlers need the main one); with
    ``fifo``, a watchdog opens and drains the FIFO's read end after ``timeout`` s, so a writer
    blocked on it is released and the test fails instead of hanging."""
    mod = load_tool(tool)
    done, hung = threading.Event(), []

    def watchdog():
        if done.wait(timeout):
            return
        hung.append(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while not done.is_set():
                try:
                    if not os.read(fd, 1 << 16):
                        time.sleep(0.05)
                except BlockingIOError:
                    time.sleep(0.05)
        finally:
            os.close(fd)

    if fifo:
        threading.Thread(target=watchdog, daemon=True).start()
    try:
        rc = call(mod.main, argv)
    finally:
        done.set()
    assert not hung, f"{tool} {argv}: blocked writing into the FIFO {fifo} for {timeout} s"
    return rc


def refused(capfd, tool, argv, root, *needles, fifo=None):
    """``tool`` refuses ``argv``: exit 2, one error: line holding ``needles``, nothing under
    ``root`` written, replaced or removed."""
    before = snapshot(root)
    capfd.readouterr()
    rc = run_tool(tool, argv, fifo=fifo)
    after = snapshot(root)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    err = capfd.readouterr().err
    assert rc == 2 and not changed, f"exit {rc}; changed: {changed}; stderr: {err[-300:]!r}"
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    assert "Traceback" not in err and len(lines[0]) < 600
    return lines[0]


# ---------------------------------------------------------------- an output file: --json, --stats-json
FILE_TOOLS = ["bench_data", "bench_kernels", "bench_model", "emulate_cluster", "measure_collectives"]


def _place(tool, root, make):
    """The output argument for ``tool`` with ``make(path)`` applied to the file it would write."""
    if tool == "measure_collectives":
        (root / "mc").mkdir()
        make(root / "mc" / "collectives.json")
        return "mc", "mc/collectives.json"
    make(root / "out.json")
    return "out.json", "out.json"


CASES = {
    "symlink": (lambda p: os.symlink(os.path.abspath("user.json"), p), "is a symbolic link"),
    "fifo": (lambda p: os.mkfifo(p), "is a FIFO"),
    "folder": (lambda p: (os.mkdir(p), open(os.path.join(p, "keep.txt"), "w").close()), "is a directory"),
    "user-file": (lambda p: open(p, "w").write(PRECIOUS), "is not an earlier output of"),
    "empty-file": (lambda p: open(p, "w").close(), "an empty file"),
    "other-tool": (lambda p: write_result(str(p), {"rows": []}, "bench_other"), "JSON object of 'bench_other'"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tool", FILE_TOOLS)
def test_an_output_file_that_is_not_the_tools_own_is_refused(tool, case, world, capfd):
    make, needle = CASES[case]
    arg, path = _place(tool, world, make)
    refused(capfd, tool, argv_for(tool, arg), world, path, needle, fifo=path if case == "fifo" else None)
    assert (world / "user.json").read_text() == PRECIOUS


PLACES = {
    "checkpoint-step": ("ck/global_step2", "checkpoint"),
    "checkpoint-save": ("ck", "checkpoint save folder"),
    "hf-export": ("hf", "HuggingFace model folder"),
    "run-log-folder": ("runs/topo", "another run's log folder"),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("tool", FILE_TOOLS)
def test_an_output_inside_another_artifact_is_refused(tool, place, world, capfd):
    folder, needle = PLACES[place]
    arg = folder if tool == "measure_collectives" else f"{folder}/out.json"
    refused(capfd, tool, argv_for(tool, arg), world, arg, needle)


def test_a_users_readme_or_config_is_not_replaced(world, capfd):
    """The brief's examples: --json README.md, and a tool's own input as its output."""
    refused(capfd, "bench_kernels", argv_for("bench_kernels", "README.md"), world, "README.md", "not JSON")
    (world / "c.yml").write_text("num_layers: 1\n")
    argv = ["--config", "c.yml", *argv_for("bench_model", "c.yml")]
    refused(capfd, "bench_model", argv, world, "c.yml", "an input of this run")
    argv = ["--input", "user.json", *argv_for("bench_data", "user.json")]
    refused(capfd, "bench_data", argv, world, "user.json", "an input of this run")


@pytest.mark.parametrize("tool", ["bench_data", "bench_kernels"])
def test_a_rerun_replaces_the_tools_own_earlier_result(tool, world, capfd):
    """Control: a result of the format before the "tool" field, then the tool's own: replaced."""
    legacy = {"bench_data": BC_LEGACY_DATA, "bench_kernels": LEGACY_KERNELS}[tool]
    (world / "out.json").write_text(json.dumps(legacy))
    for _ in range(2):
        assert run_tool(tool, argv_for(tool, "out.json")) == 0
        got = json.loads((world / "out.json").read_text())
        assert got["tool"] == tool and got != legacy
        assert not os.path.islink(world / "out.json")
    assert [n for n in os.listdir(world) if ".tmp" in n] == []  # no temporary left behind
    assert (world / "user.json").read_text() == PRECIOUS


BC_LEGACY_DATA = {"cpu_count": 2, "input": "x", "repeat": 1, "rows": [], "python": "3.11"}
LEGACY_KERNELS = {"device": "cpu", "metric": "logical fp32 bytes / median seconds", "copy": [], "results": []}


@pytest.mark.parametrize(
    "tool,legacy",
    [
        ("bench_model", {"model": {}, "tokens_per_s": {}, "ratio_ours_over_plain": 1.0, "target": 0.95}),
        ("emulate_cluster", {"spec": {}, "command": ["true"], "returncodes": [0], "packages": {}}),
    ],
)
def test_the_check_accepts_the_tools_own_result(tool, legacy, tmp_path):
    """Control for the tools whose real run is expensive (a model, an emulated cluster): the check
    they run first accepts their own result, new or written before the "tool" field, and a missing
    file; it refuses the same JSON written by another tool."""
    mod = load_tool(tool)
    legacy_path = str(tmp_path / "legacy.json")
    with open(legacy_path, "w") as f:
        json.dump(legacy, f)
    own = str(tmp_path / "own.json")
    write_result(own, {"x": 1}, tool)
    for p in (legacy_path, own, str(tmp_path / "new.json")):
        check_file(p, "--json", tool, mod_legacy(tool))
    write_result(own, legacy, "bench_other")
    with pytest.raises(OutputError, match="not an earlier output"):
        check_file(own, "--json", tool, mod_legacy(tool))
    assert mod is not None


def mod_legacy(tool):
    from megatron_topo.commands import bench_model, emulate_cluster

    return {"bench_model": bench_model.LEGACY, "emulate_cluster": emulate_cluster.LEGACY}[tool]


def test_measure_collectives_rerun_over_its_own_result_passes_the_check(world, capfd):
    """Control: an earlier collectives.json (ours, or before the "tool" field) passes the check;
    the one-rank run then stops where it always did (no process group), the file unchanged."""
    os.mkdir("mc")
    MC.write_json({"world_size": 2, "backend": "gloo", "rows": [], "fit": {}}, "mc")
    assert is_own("mc/collectives.json", "measure_collectives")
    for legacy in (False, True):
        if legacy:
            (world / "mc" / "collectives.json").write_text(
                '{"world_size": 2, "backend": "gloo", "rows": [], "fit": {}}'
            )
        before = snapshot(world)
        capfd.readouterr()
        rc = run_tool("measure_collectives", argv_for("measure_collectives", "mc"))
        line = one_error_line(capfd)
        assert rc == 2 and "one rank only" in line, line
        assert snapshot(world) == before


# ---------------------------------------------------------------- an output folder: bench_sharding
def _earlier_round(d):
    """What an earlier bench_sharding round leaves in ``d`` (its reports, its claim)."""
    from megatron_topo.analysis.bench.report import write_reports
    from megatron_topo.tool_outputs import claim_folder

    claim_folder(str(d), "bench_sharding")
    rows = [{"series": "main", "strategy": "ddp", "nodes": 2, "ok": False, "error": "stub"}]
    meta = {"machine": {}, "model_set": [], "steps": 8, "warmup": 2, "repeats": 1}
    write_reports(str(d), rows, meta)


SHARDING = {
    "users-folder": (lambda w: (w / "mine").mkdir() or (w / "mine" / "notes.txt").write_text("x"), "mine", "notes.txt"),
    "repo-like": (lambda w: None, ".", "README.md"),
    "run-log-folder": (lambda w: None, "runs/topo", "another run's log folder"),
    "checkpoint": (lambda w: None, "ck", "checkpoint save folder"),
    "hf-export": (lambda w: None, "hf/sub", "HuggingFace model folder"),
    "a-file": (lambda w: None, "user.json", "is not a folder"),
}


@pytest.mark.parametrize("case", list(SHARDING))
@pytest.mark.parametrize("mode", ["dry-run", "pool"])
def test_bench_sharding_refuses_a_folder_that_is_not_its_own(case, mode, world, capfd):
    make, out, needle = SHARDING[case]
    make(world)
    if mode == "pool":
        os.mkdir("round1")
        _earlier_round(world / "round1")
        argv = ["--pool", "round1", "--out", out]
    else:
        argv = ["--dry-run", "--strategies", "ddp", "--out", out]
    refused(capfd, "bench_sharding", argv, world, out, needle)


OWN_FOLDER = {
    "runs-link": (lambda d: os.symlink(os.path.abspath("ck"), d / "runs"), "runs is a symbolic link"),
    "report-link": (
        lambda d: (d / "results.md").unlink() or os.symlink(os.path.abspath("README.md"), d / "results.md"),
        "symbolic link",
    ),
    "report-fifo": (lambda d: (d / "results.md").unlink() or os.mkfifo(d / "results.md"), "is a FIFO"),
    "report-folder": (lambda d: (d / "results.md").unlink() or (d / "results.md").mkdir(), "is a directory"),
}


@pytest.mark.parametrize("case", list(OWN_FOLDER))
def test_bench_sharding_refuses_links_and_fifos_in_its_own_folder(case, world, capfd):
    os.mkdir("bs")
    _earlier_round(world / "bs")
    make, needle = OWN_FOLDER[case]
    make(world / "bs")
    refused(capfd, "bench_sharding", ["--dry-run", "--strategies", "ddp", "--out", "bs"], world, "bs", needle)


def test_bench_sharding_pools_into_its_own_or_a_new_folder_never_into_a_round(world, capfd):
    """Control: pooling into a new folder, then again into it (its own), works; pooling into one
    of the pooled rounds (its results.json is an input) is refused; a dry run over an earlier --out
    (also one from before the "tool" field) is accepted and writes nothing."""
    for r in ("round1", "round2"):
        os.mkdir(r)
        _earlier_round(world / r)
    for _ in range(2):
        assert run_tool("bench_sharding", ["--pool", "round1", "round2", "--out", "pooled"]) == 1  # rows not ok
        assert json.loads((world / "pooled" / "meta.json").read_text())["tool"] == "bench_sharding"
        assert json.loads((world / "pooled" / MARKER).read_text())["tool"] == "bench_sharding"
    refused(capfd, "bench_sharding", ["--pool", "round1", "round2", "--out", "round1"], world, "an input of this run")
    os.remove(world / "round2" / MARKER)
    meta = json.loads((world / "round2" / "meta.json").read_text())
    del meta["tool"]
    (world / "round2" / "meta.json").write_text(json.dumps(meta))  # an --out written before "tool"
    for out in ("round1", "round2", "brand_new"):
        before = snapshot(world)
        assert run_tool("bench_sharding", ["--dry-run", "--strategies", "ddp", "--out", out]) == 0
        assert snapshot(world) == before


# ---------------------------------------------------------------- an output folder: bench_convergence
def test_bench_convergence_out_runs_keeps_the_users_run(world, capfd):
    """The brief's example: --out runs removed runs/topo/metrics.jsonl before training topo."""
    refused(capfd, "bench_convergence", ["--out", "runs", "--variants", "topo", "--steps", "30"], world, "runs")
    assert (world / "runs" / "topo" / "metrics.jsonl").read_text() == '{"step": 10, "loss": 3.5}\n'


CONVERGENCE = {
    "variant-link": (
        lambda w: (w / "bc").mkdir() or os.symlink(os.path.abspath("runs/topo"), w / "bc" / "topo"),
        "bc",
        "symbolic link",
    ),
    "run-log-folder": (lambda w: None, "runs/topo", "another run's log folder"),
    "checkpoint": (lambda w: None, "ck/global_step2", "checkpoint"),
    "a-file": (lambda w: None, "user.json", "is not a folder"),
    "users-folder": (lambda w: (w / "bc").mkdir() or (w / "bc" / "notes.txt").write_text("x"), "bc", "notes.txt"),
}


@pytest.mark.parametrize("case", list(CONVERGENCE))
def test_bench_convergence_refuses_a_folder_that_is_not_its_own(case, world, capfd):
    make, out, needle = CONVERGENCE[case]
    make(world)
    refused(capfd, "bench_convergence", ["--out", out, "--variants", "topo", "--steps", "30"], world, out, needle)
    assert (world / "runs" / "topo" / "metrics.jsonl").read_text() == '{"step": 10, "loss": 3.5}\n'


def _fake_training(calls):
    """A stand-in for train.py under torchrun: writes log_dir/metrics.jsonl of train_iters steps."""

    def run(cmd, **kw):
        sets = dict(cmd[i + 1].split("=", 1) for i, x in enumerate(cmd) if x == "--set")
        steps, log = int(sets["train_iters"]), sets["log_dir"]
        os.makedirs(log, exist_ok=True)
        with open(os.path.join(log, "metrics.jsonl"), "w") as f:
            for s in range(10, steps + 1, 10):
                f.write(json.dumps({"step": s, "loss": 5.0 - s / 100}) + "\n")
        calls.append(log)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_bench_convergence_reruns_in_its_own_folder_and_reuse_tolerates_a_corrupt_line(world, capfd, monkeypatch):
    """Control: a new folder is claimed; a rerun over it replaces the variants' metrics and the
    results; --reuse reads a metrics file with a corrupt line (a warning, not a traceback)."""
    calls = []
    monkeypatch.setattr(BC, "subprocess", types.SimpleNamespace(run=_fake_training(calls)))
    argv = ["--out", "bc", "--variants", "exact", "topo", "--steps", "30"]
    for _ in range(2):
        assert run_tool("bench_convergence", argv) == 0
        res = json.loads((world / "bc" / "results.json").read_text())
        assert res["tool"] == "bench_convergence" and sorted(res["final_loss"]) == ["exact", "topo"]
        assert (world / "bc" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(calls) == 4
    with open(world / "bc" / "topo" / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "loss": 4.7\n{"step": 30, "loss": 4.7}\n')  # a torn line, then the record again
    capfd.readouterr()
    assert run_tool("bench_convergence", [*argv, "--reuse"]) == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "not valid JSON" in err and err.count("warning:") == 1, err
    assert len(calls) == 4  # both variants reused
    (world / "bc" / MARKER).unlink()
    assert run_tool("bench_convergence", [*argv, "--reuse"]) == 0  # an --out recognised by its results.json
    assert (world / "runs" / "topo" / "metrics.jsonl").read_text() == '{"step": 10, "loss": 3.5}\n'


# ---------------------------------------------------------------- fsdp_baseline's log_dir (bench_sharding's FSDP2 rows)
@pytest.fixture
def fsdp_world(world):
    from .cli_cases import BASE_CFG, write_dataset

    (world / "cfg.yml").write_text(BASE_CFG)
    write_dataset(world / "data" / "toy", 16, 0)
    return world


@pytest.mark.parametrize(
    "case,sets,needle",
    [
        ("inside-checkpoint", ["log_dir=ck/global_step2/log"], "checkpoint"),
        ("metrics-link", ["log_dir=lg"], "metrics.jsonl is a symbolic link"),
    ],
)
def test_fsdp_baseline_checks_its_log_dir_as_train_does(case, sets, needle, fsdp_world, capfd):
    if case == "metrics-link":
        os.mkdir("lg")
        os.symlink(os.path.abspath("user.json"), "lg/metrics.jsonl")
    argv = ["cfg.yml", *[x for s in sets for x in ("--set", s)]]
    refused(capfd, "fsdp_baseline", argv, fsdp_world, needle)
    assert (fsdp_world / "user.json").read_text() == PRECIOUS


def test_fsdp_baseline_moves_an_earlier_runs_metrics_aside(fsdp_world):
    """Control: a run into a log_dir holding another run's metrics.jsonl starts a fresh one and keeps
    the earlier records as metrics.jsonl.1 (before: appended to them, two runs' curves in one file)."""
    import socket
    import sys

    from .cli_cases import ROOT

    os.mkdir("log")
    earlier = "".join(json.dumps({"step": s, "loss": 9.0}) + "\n" for s in (1, 2, 3))
    (fsdp_world / "log" / "metrics.jsonl").write_text(earlier)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "fsdp_baseline.py"), "cfg.yml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(x)["step"] for x in open("log/metrics.jsonl")] == [1, 2]
    assert (fsdp_world / "log" / "metrics.jsonl.1").read_text() == earlier


def test_bench_sharding_pool_reads_its_rounds_capped_and_non_blocking(world):
    """--pool DIR with DIR/results.json a FIFO (before: blocked forever) or not the row list (before:
    a traceback): one error: line, nothing written. In a subprocess: a blocked reader is killed."""
    import sys

    from .cli_cases import ROOT

    for name, make in (("fifo", lambda p: os.mkfifo(p)), ("not-rows", lambda p: open(p, "w").write("[1, 2]"))):
        os.mkdir(name)
        make(os.path.join(name, "results.json"))
        (world / name / "meta.json").write_text("{}")
        tool = os.path.join(ROOT, "tools", "bench_sharding.py")
        try:
            r = subprocess.run(
                [sys.executable, tool, "--pool", name, "--out", "pooled"], capture_output=True, text=True, timeout=60
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"--pool {name}: still reading after 60 s")
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: --pool {name}: cannot read"), (
            r.stderr
        )
        assert not os.path.exists("pooled")


@pytest.mark.parametrize(
    "rows",
    [
        [{"series": "main", "strategy": "topo", "ok": True}],  # no timed_s, step_times_s ...
        [{"series": "main", "strategy": "topo", "ok": True, "timed_s": 5}],  # a number, not a list
    ],
)
def test_bench_sharding_pool_of_rows_of_another_shape_is_one_line(world, capfd, rows):
    """Rows that are objects but lack the fields bench_sharding writes were a KeyError/TypeError
    traceback from merge(); now one line naming them, and nothing written."""
    from megatron_topo.commands import bench_sharding

    os.mkdir("odd")
    (world / "odd" / "results.json").write_text(json.dumps(rows))
    (world / "odd" / "meta.json").write_text("{}")
    assert bench_sharding.main(["--pool", "odd", "--out", "pooled"]) == 2
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("error: --pool: the rows of odd are not the rows bench_sharding writes")
    assert not os.path.exists("pooled")
