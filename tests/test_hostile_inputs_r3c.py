"""Hostile inputs, round 3, second probe (an independent 178-case probe of other members of issue
29's families): GPT-NeoX checkpoint folders get the guards our own and HF folders have (a capped,
non-blocking ``latest``; layer files that must be regular files), meta.json's trainer.python_rng is
validated, a pickle refusal is one line, and predict_perf prints ``error:`` lines, reads its
results file without blocking and never draws over a user's file."""

from __future__ import annotations

import copy
import os
import threading

import pytest
import torch

from megatron_topo.commands import predict_perf
from megatron_topo.config import ConfigError
from megatron_topo.model.hf_weights import HFWeights
from megatron_topo.model.neox_checkpoint import NeoxWeights, step_folder
from megatron_topo.zero_topo import checkpoint as ckpt
from megatron_topo.zero_topo.checkpoint import meta_schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYER = "layer_00-model_00-model_states.pt"


def _neox(tmp_path, latest: bytes):
    step = tmp_path / "nx" / "global_step1"
    step.mkdir(parents=True)
    torch.save({"word_embeddings.weight": torch.zeros(2, 2)}, step / LAYER)
    (tmp_path / "nx" / "latest").write_bytes(latest)
    return str(tmp_path / "nx")


def test_a_neox_latest_names_its_step(tmp_path):
    assert step_folder(_neox(tmp_path, b"global_step1\n")).endswith("global_step1")


@pytest.mark.parametrize(
    "latest", [b"global_step1\0x\n", b"global_step1" + b" " * 8192, b"\xff\xfe", b"../global_step1"]
)
def test_a_neox_latest_that_is_not_a_step_name_is_not_followed(tmp_path, latest):
    """A NUL (os.listdir raised ValueError: a traceback), a file over 4 KiB (read whole before),
    bytes that are not UTF-8, a path: not a GPT-NeoX checkpoint, no exception."""
    assert step_folder(_neox(tmp_path, latest)) is None


def test_a_huge_sparse_neox_latest_is_not_read(tmp_path):
    path = _neox(tmp_path, b"")
    os.truncate(os.path.join(path, "latest"), 100 << 20)
    assert step_folder(path) is None


def _alarm(seconds: float):
    """Fail instead of hanging: open the FIFO's write end after ``seconds`` (unblocks a reader)."""

    def release(p):
        fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK) if os.path.exists(p) else None
        if fd is not None:
            os.close(fd)

    return lambda p: threading.Timer(seconds, release, (p,))


def test_a_neox_layer_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    step = tmp_path / "nx" / "global_step1"
    step.mkdir(parents=True)
    os.mkfifo(step / LAYER)
    timer = _alarm(20)(str(step / LAYER))
    timer.start()
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            NeoxWeights(str(step), 1)._load(LAYER)
    finally:
        timer.cancel()


GOOD_META = {
    "format": 2,
    "step": 3,
    "world_size": 1,
    "plan": {"weight_factor": 1, "grad_factor": 1, "optimizer_factor": 1, "preset": "ddp"},
    "shard_holders": 1,
    "units": [{"padded": 8, "numel": 6, "params": [["w", 0, 6, [6]]]}],
    "trainer": {"step": 3, "consumed_samples": 24, "consumed_valid": 0, "global_batch": 8},
    "files": {"rank_00000.pt": {"bytes": 100, "sha256": "ab" * 32}},
}


@pytest.mark.parametrize("seed", [[3, [1, 2], None], {"a": 1}, 1.5, True, "x" * 1000, 2**300])
def test_a_python_rng_that_random_seed_does_not_take_is_a_meta_error(seed):
    """Before: passed through unchecked and raised TypeError from random.seed on resume."""
    meta = copy.deepcopy(GOOD_META)
    meta["trainer"]["python_rng"] = seed
    with pytest.raises(meta_schema.MetaError, match="trainer.python_rng"):
        meta_schema.validate(meta, ckpt.SUPPORTED_FORMATS)


@pytest.mark.parametrize("seed", [None, 0, 12345, "abc"])
def test_a_python_rng_seed_is_kept(seed):
    meta = copy.deepcopy(GOOD_META)
    meta["trainer"]["python_rng"] = seed
    assert meta_schema.validate(meta, ckpt.SUPPORTED_FORMATS).trainer.python_rng == seed


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_with_code_in_an_hf_folder_is_one_line(tmp_path):
    torch.save({"gpt_neox.embed_in.weight": _Evil()}, tmp_path / "pytorch_model.bin")
    w = HFWeights.__new__(HFWeights)
    w.path, w._open = str(tmp_path), {}
    with pytest.raises(ConfigError) as e:
        w._file("pytorch_model.bin")
    assert "\n" not in str(e.value) and "cannot read the weights" in str(e.value)
    assert not (tmp_path / "pwned").exists()


MODEL = os.path.join(ROOT, "configs", "20B.yml")
SYSTEM = os.path.join(ROOT, "configs", "frontier.yml")


def _predict(capsys, *args):
    rc = predict_perf.main(["--model", MODEL, "--system", SYSTEM, *args])
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize(
    "args", [["--gcds", "0"], ["--gcds", "8,x"], ["--gcds", "1000000000000"], ["--presets", "zero9"]]
)
def test_predict_perf_errors_are_error_lines(capsys, args):
    rc, lines = _predict(capsys, *args)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines


def test_predict_perf_reads_a_fifo_results_file_without_waiting(capsys, tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    timer = _alarm(20)(str(fifo))
    timer.start()
    try:
        rc = predict_perf.main(["--emulated", str(fifo), "--system", os.path.join(ROOT, "configs", "emulated_cpu.yml")])
    finally:
        timer.cancel()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "not a file" in lines[0], lines


@pytest.mark.parametrize("name,content", [("mine.png", b"mine"), ("notes.yml", b"a: 1\n"), ("plot.png", None)])
def test_predict_perf_plot_never_replaces_a_users_file(capsys, tmp_path, name, content):
    """A user's non-PNG file named *.png, a YAML file (not a PNG name): refused, untouched; a new
    PNG is drawn, and drawn again over its own earlier plot."""
    out = tmp_path / name
    if content is not None:
        out.write_bytes(content)
    rc, lines = _predict(capsys, "--gcds", "8", "--presets", "topo", "--plot", str(out))
    if content is not None:
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: --plot"), lines
        assert out.read_bytes() == content
    else:
        assert rc == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        rc, lines = _predict(capsys, "--gcds", "8", "--presets", "topo", "--plot", str(out))
        assert rc == 0, lines


def test_a_tool_prints_every_problem_of_a_model_file_as_an_error_line(capsys, tmp_path):
    """tools/plan.py with a model file that has several problems: one error: line each (the second
    one had no prefix before); cli.fail does this for every tool that uses it."""
    from megatron_topo.commands import plan

    m = tmp_path / "m.yml"
    m.write_text("num_layers: abc\nhidden_size: 32\nnum_attention_heads: 4\n")
    rc = plan.main(["--model", str(m), "--system", SYSTEM, "--nodes", "1"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) >= 2 and all(ln.startswith("error: ") for ln in lines), lines
    assert any("num_layers" in ln for ln in lines)


def test_preprocess_stopped_by_sigterm_leaves_nothing(tmp_path):
    """SIGTERM (a scheduler's kill) during a 2-worker preprocess: one error line, exit 143, no
    partial .bin/.idx or temporary file, and no worker left (before: killed by the default handler,
    exit -15, no line, a leftover .bin.tmp.PID and a leaked-semaphore warning)."""
    import json
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "big.jsonl"
    line = json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 40}) + "\n"
    src.write_text(line * 40000)  # about 70 MB: many seconds of tokenizing
    out = tmp_path / "o"
    out.mkdir()
    p = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", str(src), "--output-prefix",
         str(out / "x"), "--tokenizer-type", "CharLevelTokenizer", "--workers", "2", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    t0 = time.monotonic()
    while not any(".tmp" in n for n in os.listdir(out)):  # the builder has started writing
        assert p.poll() is None and time.monotonic() - t0 < 60, p.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert p.returncode == 143 and lines == ["error: stopped by SIGTERM; no output written"], (p.returncode, stderr)
    assert os.listdir(out) == []
    children = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    assert children == []


def test_preprocess_removes_what_a_killed_run_left_and_nothing_else(tmp_path, capsys):
    """A SIGKILLed preprocess cannot clean up: its ``PREFIX.bin.tmp.PID`` stays. The next run of the
    same output removes the temporaries whose process is gone from this host and whose writer lock
    nobody holds, and says so in one warning line; a live writer's (its pid alive, or its lock held
    by a process elsewhere, as a writer on another host of a shared file system) and another
    prefix's temporaries stay (before: every leftover stayed for good)."""
    import json
    import subprocess
    import sys

    from tests.tool_loader import load_tool

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    other = dead.pid + 1000000  # a pid that does not exist here: "another host's" writer
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 8}) + "\n" for i in range(20)))
    out = tmp_path / "o"
    out.mkdir()
    pre = "x_text_document"
    files = [
        f"{pre}.bin.tmp.{dead.pid}",  # removed
        f"{pre}.idx.tmp.{dead.pid}",  # removed with its .bin
        f"{pre}.bin.tmp.{os.getppid()}",  # its writer is alive: kept
        f"{pre}.bin.tmp.{other}",  # its writer lock is held: kept
        f"y_text_document.bin.tmp.{dead.pid}",  # another dataset's: kept
    ]
    for name in files:
        (out / name).write_bytes(b"partial")
    held = os.open(out / files[3], os.O_RDONLY)
    holder = subprocess.Popen(  # locks its inherited descriptor, as a live writer elsewhere would
        [sys.executable, "-c", f"import fcntl, time; fcntl.flock({held}, fcntl.LOCK_EX); print(1, flush=True); "
         "time.sleep(60)"], pass_fds=(held,), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "1"
        rc = load_tool("preprocess_data").main(
            [
                "--input",
                str(src),
                "--output-prefix",
                str(out / "x"),
                "--tokenizer-type",
                "CharLevelTokenizer",
                "--quiet",
            ]
        )
        err = capsys.readouterr().err
        assert rc == 0, err
        warned = [ln for ln in err.splitlines() if "interrupted earlier run" in ln]
        assert warned == [
            f"warning: removed 2 temporary file(s) an interrupted earlier run left: {files[0]}, {files[1]}"
        ], err
        assert sorted(os.listdir(out)) == sorted([f"{pre}.bin", f"{pre}.idx", *files[2:]])
    finally:
        holder.kill()
        holder.wait()
        os.close(held)


def test_preprocess_rerun_right_after_a_sigkill_cleans_up(tmp_path):
    """SIGKILL a 2-worker preprocess while it writes, then run it again at once into the same
    prefix: the new run removes the dead run's temporaries (their writer lock died with it), names
    them in one warning line, and leaves only the new dataset."""
    import json
    import signal
    import subprocess
    import sys
    import time

    tool = os.path.join(ROOT, "tools", "preprocess_data.py")
    big = tmp_path / "big.jsonl"
    big.write_text((json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 40}) + "\n") * 20000)
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"text": "a short document"}) + "\n")
    out = tmp_path / "o"
    out.mkdir()
    args = ["--output-prefix", str(out / "x"), "--tokenizer-type", "CharLevelTokenizer", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, tool, "--input", str(big), "--workers", "2", *args], env=env)
    t0 = time.monotonic()
    while not any(".tmp" in n for n in os.listdir(out)):
        assert p.poll() is None and time.monotonic() - t0 < 60
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    left = sorted(n for n in os.listdir(out) if ".tmp." in n)
    assert left, "the killed run left nothing to clean up"
    r = subprocess.run([sys.executable, tool, "--input", str(small), *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [
        f"warning: removed {len(left)} temporary file(s) an interrupted earlier run left: {', '.join(left)}"
    ]
    assert sorted(os.listdir(out)) == ["x_text_document.bin", "x_text_document.idx"]


@pytest.mark.parametrize("target", ["outside.json", "missing.json"])
def test_a_dataset_journal_that_is_a_symlink_is_not_followed(tmp_path, target):
    """``PREFIX.replacing`` is written by commit_pair as a plain file; a symbolic link there (out of
    the folder, or dangling) is refused in one line, and neither it nor its target is touched
    (before: read through the link and then removed)."""
    import json

    from megatron_topo.data import MMapIndexedDataset, MMapIndexedDatasetBuilder
    from megatron_topo.data.errors import DataError

    d = tmp_path / "data"
    d.mkdir()
    with MMapIndexedDatasetBuilder(str(d / "toy")) as b:
        b.add_document([1, 2, 3])
        b.finalize()
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"bin": "toy.bin.tmp.1", "idx": "toy.idx.tmp.1"}))
    os.symlink(tmp_path / target, d / "toy.replacing")
    with pytest.raises(DataError, match=r"a symbolic link, not a replacement journal") as e:
        MMapIndexedDataset(str(d / "toy"))
    assert len(str(e.value).splitlines()) == 1
    assert os.path.islink(d / "toy.replacing") and outside.read_text().startswith("{")


def test_sweep_survives_a_leftover_that_vanishes_meanwhile(tmp_path, monkeypatch):
    """Two runs sweeping one prefix at once: a temporary the other run removed between the check and
    the removal is skipped (and not named as removed by this run), not an ``OSError`` traceback."""
    import subprocess
    import sys

    from megatron_topo.data import pair_commit

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"x.bin.tmp.{dead.pid}", f"x.idx.tmp.{dead.pid}"]
    for n in names:
        (tmp_path / n).write_bytes(b"partial")

    def abandoned_then_other_sweep_removes_bin(path, min_age_s):
        os.remove(path)  # the other run won the race for the .bin
        return True

    monkeypatch.setattr(pair_commit, "_abandoned", abandoned_then_other_sweep_removes_bin)
    assert pair_commit.sweep_leftovers(str(tmp_path / "x")) == [names[1]]
    assert os.listdir(tmp_path) == []
