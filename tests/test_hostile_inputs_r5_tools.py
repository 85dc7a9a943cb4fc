"""Probe 5 (issue 29), the tools' arguments: every numeric flag of every tool has a lower and an
upper bound (one ``error:`` line at parse time, nothing written), every refusal line starts with
``error:``, flags without effect in a combination get one ``note:``, a dataset writer refuses a
``PREFIX.replacing`` that is not a journal, and a stopped bench_data leaves no process or file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from .cli_cases import BASE_CFG, ROOT, call, one_error_line, write_dataset
from .tool_loader import load_tool

TOK = ["--input", "in.txt", "--model-type", "bpe", "--vocab-size", "300", "--output", "t.json"]
PRE = ["--input", "in.txt", "--output-prefix", "out/x", "--tokenizer-type", "ByteLevel", "--quiet"]
PLAN = ["--model", os.path.join(ROOT, "configs/tiny.yml"), "--system", os.path.join(ROOT, "configs/frontier.yml")]

# (case id, tool, argv, text the one error line holds)
BOUNDS = [
    # H2: fp16_gradient_error --worlds had only a lower bound
    ("fp16-worlds-2pow40", "fp16_gradient_error", ["--worlds", "1099511627776"], "--worlds: 1099511627776 must lie in"),
    ("fp16-worlds-second-huge", "fp16_gradient_error", ["--worlds", "8", "100000"], "--worlds: 100000 must lie"),
    ("fp16-micro-batch-huge", "fp16_gradient_error", ["--micro-batch", "100000"], "--micro-batch: 100000 must lie"),
    ("fp16-micro-batch-float", "fp16_gradient_error", ["--micro-batch", "1e9"], "'1e9' is not an integer"),
    # H3: bench_data --mb had no bound at all
    ("bench-data-mb-1e9", "bench_data", ["--mb", "1e9"], "--mb: 1e9 must lie in (0, 256] MB"),
    ("bench-data-mb-negative", "bench_data", ["--mb", "-1"], "--mb: -1 must lie in (0, 256] MB"),
    ("bench-data-mb-zero", "bench_data", ["--mb", "0"], "--mb: 0 must lie"),
    ("bench-data-mb-nan", "bench_data", ["--mb", "nan"], "--mb: nan is not finite"),
    ("bench-data-workers-huge", "bench_data", ["--workers", "1", "100000"], "--workers: 100000 must lie"),
    ("bench-data-workers-zero", "bench_data", ["--workers", "0"], "--workers: 0 must lie"),
    ("bench-data-bpe-vocab-small", "bench_data", ["--bpe-vocab-size", "3"], "--bpe-vocab-size: 3 must lie"),
    ("bench-data-bpe-vocab-huge", "bench_data", ["--bpe-vocab-size", "1" + "0" * 12], "--bpe-vocab-size"),
    ("bench-data-repeat-zero", "bench_data", ["--repeat", "0"], "--repeat: 0 must be >= 1"),
    # H5 / T4: bench_model's model flags take the config schema's bounds
    ("bench-model-hidden-2pow30", "bench_model", ["--hidden-size", "1073741824"], "--hidden-size: 1073741824 must lie"),
    ("bench-model-layers-zero", "bench_model", ["--num-layers", "0"], "--num-layers: 0 must lie in [1, 4,096]"),
    ("bench-model-layers-huge", "bench_model", ["--num-layers", "5000"], "--num-layers: 5000 must lie"),
    ("bench-model-heads-zero", "bench_model", ["--num-attention-heads", "0"], "--num-attention-heads: 0"),
    ("bench-model-seq-huge", "bench_model", ["--seq-length", str(1 << 21)], "--seq-length: 2097152 must lie"),
    ("bench-model-vocab-huge", "bench_model", ["--vocab-size", str(1 << 40)], "--vocab-size"),
    ("bench-model-batch-zero", "bench_model", ["--batch", "0"], "--batch: 0 must lie in [1, 65,536]"),
    ("bench-model-batch-huge", "bench_model", ["--batch", str(1 << 20)], "--batch: 1048576 must lie"),
    ("bench-model-threads-zero", "bench_model", ["--threads", "0"], "--threads: 0 must lie"),
    ("bench-model-lr-nan", "bench_model", ["--lr", "nan"], "--lr: nan is not finite"),
    ("bench-model-clip-negative", "bench_model", ["--clip", "-1"], "--clip: -1 must lie"),
    ("bench-model-seed-negative", "bench_model", ["--seed", "-1"], "--seed: -1 must lie"),
    ("bench-model-warmup-negative", "bench_model", ["--warmup", "-1"], "--warmup: -1 must lie"),
    ("bench-model-steps-zero", "bench_model", ["--steps", "0"], "--steps: 0 must be >= 1"),
    ("bench-model-profile-steps-huge", "bench_model", ["--profile-steps", "1000000"], "--profile-steps"),
    # bench_sharding: --nodes 0 / --mtu 0 printed the runs of an impossible cluster (--dry-run, exit 0)
    ("bench-sharding-nodes-zero", "bench_sharding", ["--nodes", "0", "--dry-run"], "--nodes: 0 must lie in [1, 254]"),
    ("bench-sharding-nodes-huge", "bench_sharding", ["--nodes", "1000", "--dry-run"], "--nodes: 1000 must lie"),
    ("bench-sharding-mtu-zero", "bench_sharding", ["--mtu", "0", "--dry-run"], "--mtu: 0 must lie in [68, 65,535]"),
    ("bench-sharding-mtu-huge", "bench_sharding", ["--mtu", "70000", "--dry-run"], "--mtu: 70000 must lie"),
    ("bench-sharding-gpus-huge", "bench_sharding", ["--gpus-per-node", "1000", "--dry-run"], "--gpus-per-node"),
    ("bench-sharding-gcds-zero", "bench_sharding", ["--gcds-per-gpu", "0", "--dry-run"], "--gcds-per-gpu: 0"),
    ("bench-sharding-scaling-zero", "bench_sharding", ["--scaling-nodes", "1", "0", "--dry-run"], "--scaling-nodes"),
    ("bench-sharding-accum-huge", "bench_sharding", ["--accumulation", "100000", "--dry-run"], "--accumulation"),
    ("bench-sharding-timeout-inf", "bench_sharding", ["--timeout", "inf", "--dry-run"], "--timeout: inf is not"),
    ("bench-sharding-warmup-negative", "bench_sharding", ["--warmup", "-1", "--dry-run"], "--warmup: -1 must lie"),
    ("bench-kernels-size-huge", "bench_kernels", ["--sizes-mib", "1e9"], "--sizes-mib: 1e9 must lie"),
    ("bench-kernels-size-negative", "bench_kernels", ["--sizes-mib", "1", "-4"], "--sizes-mib: -4 must lie"),
    ("bench-kernels-threads-zero", "bench_kernels", ["--threads", "0"], "--threads: 0 must lie"),
    ("bench-kernels-warmup-negative", "bench_kernels", ["--warmup", "-5"], "--warmup: -5 must lie"),
    ("bench-convergence-ranks-zero", "bench_convergence", ["--ranks", "0"], "--ranks: 0 must lie in [1, 64]"),
    ("bench-convergence-ranks-huge", "bench_convergence", ["--ranks", "100000"], "--ranks: 100000 must lie"),
    ("emulate-nodes-zero", "emulate_cluster", ["--nodes", "0", "--", "true"], "--nodes: 0 must lie"),
    ("emulate-mtu-zero", "emulate_cluster", ["--mtu", "0", "--", "true"], "--mtu: 0 must lie"),
    ("emulate-port-huge", "emulate_cluster", ["--master-port", "70000", "--", "true"], "--master-port: 70000"),
    ("emulate-timeout-negative", "emulate_cluster", ["--timeout", "-1", "--", "true"], "--timeout: -1 must lie"),
    (
        "emulate-timeout-tiny",
        "emulate_cluster",
        ["--timeout", "1e-300", "--", "true"],
        "--timeout: 1e-300 must lie in [1,",
    ),
    (
        "bench-sharding-timeout-tiny",
        "bench_sharding",
        ["--timeout", "1e-300", "--dry-run"],
        "--timeout: 1e-300 must lie",
    ),
    ("measure-iters-huge", "measure_collectives", ["--iters", "1000000"], "--iters: 1000000 must lie"),
    ("measure-warmup-negative", "measure_collectives", ["--warmup", "-2"], "--warmup: -2 must lie"),
    ("inspect-doc-negative", "inspect_data", ["data/toy", "--doc", "-1"], "--doc: -1 must lie"),
    ("inspect-doc-2pow70", "inspect_data", ["data/toy", "--doc", str(1 << 70)], "--doc: 1180591620717411303424"),
    ("inspect-vocab-huge", "inspect_data", ["data/toy", "--vocab-size", str(1 << 40)], "--vocab-size: 1099511627776"),
    ("preprocess-workers-zero", "preprocess_data", PRE + ["--workers", "0"], "--workers: 0 must lie"),
    ("preprocess-num-docs-zero", "preprocess_data", PRE + ["--num-docs", "0"], "--num-docs: 0 must lie"),
    ("preprocess-log-interval-huge", "preprocess_data", PRE + ["--log-interval", "1" + "0" * 16], "--log-interval"),
    ("preprocess-chunk-size-zero", "preprocess_data", PRE + ["--chunk-size", "0"], "--chunk-size: 0 must lie"),
    ("preprocess-partitions-huge", "preprocess_data", PRE + ["--partitions", str(1 << 20)], "--partitions"),
    ("plan-top-negative", "plan", PLAN + ["--nodes", "2", "--top", "-1"], "--top: -1 must lie"),
    ("plan-reserve-huge", "plan", PLAN + ["--nodes", "2", "--reserve-gib", "1e300"], "--reserve-gib: 1e300 must"),
    ("tt-min-frequency-2pow70", "train_tokenizer", TOK + ["--min-frequency", str(1 << 70)], "--min-frequency"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An empty working folder with a dataset (data/toy) and a text file (in.txt) to name."""
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    write_dataset(tmp_path / "data" / "toy", 8, 0)
    (tmp_path / "in.txt").write_text("some words to tokenize, and some more words\n" * 20)
    return tmp_path


def _files(root):
    return sorted(os.path.relpath(os.path.join(dp, f), root) for dp, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("case,tool,argv,needle", BOUNDS, ids=[c[0] for c in BOUNDS])
def test_every_numeric_flag_is_bounded(case, tool, argv, needle, folder, capfd):
    mod = load_tool(tool)
    before = _files(folder)
    capfd.readouterr()
    t0 = time.monotonic()
    rc = call(mod.main, argv)
    line = one_error_line(capfd)
    assert rc == (1 if tool == "preprocess_data" else 2) and needle in line, (rc, line)  # preprocess: 1 for all
    assert "Traceback" not in line and len(line) < 600
    assert _files(folder) == before  # nothing written
    assert time.monotonic() - t0 < 20


def test_bench_model_refuses_a_model_the_host_cannot_hold_before_allocating(folder, capfd):
    """hidden_size 262,144 is within the schema's bounds: the memory check refuses it (before: an
    allocator traceback for the 2**30 case; a 3 T-parameter model was allocated)."""
    mod = load_tool("bench_model")
    capfd.readouterr()
    rc = call(mod.main, ["--hidden-size", "262144", "--steps", "1", "--warmup", "0"])
    line = one_error_line(capfd)
    assert rc == 2 and "3,300,696,522,752 parameters" in line and "GiB of host memory is available" in line, line


# ---- T6: every refusal line starts with error: (measure_collectives printed "measure_collectives.py: ...")
PREFIX = [
    ("measure-sizes-huge", "measure_collectives", ["--sizes-mb", "1e9"], "error: --sizes-mb '1e9'"),
    ("measure-sizes-negative", "measure_collectives", ["--sizes-mb", "-4"], "must be positive"),
    ("measure-sizes-garbage", "measure_collectives", ["--sizes-mb", "1,x"], "comma-separated numbers"),
    ("measure-ops-unknown", "measure_collectives", ["--ops", "broadcastx"], "--ops: 'broadcastx' is not valid"),
    ("measure-one-rank", "measure_collectives", ["--sizes-mb", "1"], "one rank only"),
    ("sharding-steps-warmup", "bench_sharding", ["--steps", "2", "--warmup", "3", "--dry-run"], "must exceed"),
    ("sharding-pool-missing", "bench_sharding", ["--pool", "nowhere"], "--pool nowhere: cannot read"),
    ("sharding-rate-garbage", "bench_sharding", ["--inter-node", "fast", "--dry-run"], "error: "),
    ("bench-model-heads", "bench_model", ["--hidden-size", "30", "--num-attention-heads", "4"], "not divisible"),
    ("emulate-no-command", "emulate_cluster", [], "no command given"),
    ("emulate-latency-garbage", "emulate_cluster", ["--latency", "soon", "--", "true"], "error: "),
]


@pytest.mark.parametrize("case,tool,argv,needle", PREFIX, ids=[c[0] for c in PREFIX])
def test_every_refusal_line_starts_with_error(case, tool, argv, needle, folder, capfd):
    mod = load_tool(tool)
    before = _files(folder)
    capfd.readouterr()
    rc = call(mod.main, argv)
    line = one_error_line(capfd)  # the one line, starting with "error: "
    assert rc not in (0, None) and needle in line, (rc, line)
    assert _files(folder) == before


def test_bench_sharding_helpers_refuse_with_error_lines():
    """bench_sharding's --cpu-fit reader and run definitions stop with SystemExit(text): the text
    is the one line printed, so it starts with error: too."""
    from megatron_topo.analysis.bench import accum, runs
    from megatron_topo.commands.bench_sharding import build_parser

    def runs_args():
        return build_parser().parse_args(["--dry-run"])

    with pytest.raises(SystemExit) as e:
        accum.earlier_fit("nowhere", {})
    assert str(e.value.code).startswith("error: --cpu-fit nowhere: no fitted constants"), e.value.code
    with pytest.raises(SystemExit) as e:
        runs.run_def("no_such", runs_args(), 1, 1, 1, "log")
    assert str(e.value.code).startswith("error: unknown strategy 'no_such'"), e.value.code


def test_measure_collectives_refuses_a_fifo_system_file_with_an_error_line(folder, capfd):
    os.mkfifo(folder / "sy.yml")
    mod = load_tool("measure_collectives")
    capfd.readouterr()
    rc = call(mod.main, ["--system", "sy.yml", "--sizes-mb", "1", "--iters", "1", "--out", "mc"])
    line = one_error_line(capfd)
    assert rc == 2 and "sy.yml" in line and "FIFO" in line, line
    assert not (folder / "mc").exists()


# ---- flags without effect in a combination: one note (as --merge-file with CharLevelTokenizer)
def _notes(err):
    return [x for x in err.splitlines() if x.startswith("note: ")]


@pytest.mark.parametrize(
    "argv,note",
    [
        (["data/toy", "--stats", "--tokenizer-type", "CharLevelTokenizer"], "--tokenizer-type CharLevelTokenizer is"),
        (["data/toy", "--tokenizer-type", "ByteLevel"], "ignored without --doc"),
        (["data/toy", "--doc", "0", "--vocab-file", "tok.json"], "--vocab-file tok.json is ignored without --tok"),
        (["data/toy", "--stats", "--vocab-file", "tok.json"], "--vocab-file tok.json is ignored without --tok"),
        (["data/toy", "--doc", "0", "--tokenizer-type", "ByteLevel", "--vocab-file", "v"], "ByteLevel reads no"),
    ],
)
def test_inspect_data_notes_tokenizer_flags_without_effect(argv, note, folder, capfd):
    mod = load_tool("inspect_data")
    capfd.readouterr()
    assert call(mod.main, argv) == 0
    out, err = capfd.readouterr()
    notes = _notes(err)
    assert len(notes) == 1 and note in notes[0], err
    json.loads(out.splitlines()[0])  # stdout stays JSON


def test_inspect_data_says_nothing_when_every_flag_counts(folder, capfd):
    mod = load_tool("inspect_data")
    capfd.readouterr()
    assert call(mod.main, ["data/toy", "--doc", "0", "--tokenizer-type", "CharLevelTokenizer"]) == 0
    assert _notes(capfd.readouterr().err) == []


@pytest.mark.parametrize(
    "argv,note",
    [
        (["--vocab-size", "100"], "--vocab-size 100 is ignored: only CharLevelTokenizer takes a size"),
        (["--vocab-file", "in.txt"], "--vocab-file in.txt is ignored: ByteLevel reads no vocabulary file"),
        (["--tokenizer-model", "in.txt"], "--vocab-file in.txt is ignored"),
    ],
)
def test_preprocess_notes_tokenizer_flags_without_effect(argv, note, folder, capfd):
    mod = load_tool("preprocess_data")
    capfd.readouterr()
    assert call(mod.main, PRE + argv) == 0
    out = capfd.readouterr().out
    notes = _notes(out)  # beside the --merge-file note, on stdout
    assert len(notes) == 1 and note in notes[0], out


def test_preprocess_charlevel_vocab_size_gets_no_note(folder, capfd):
    mod = load_tool("preprocess_data")
    capfd.readouterr()
    argv = [*PRE[:-2], "CharLevelTokenizer", "--quiet", "--vocab-size", "300"]
    assert call(mod.main, argv) == 0
    out, err = capfd.readouterr()
    assert _notes(out) == [] and _notes(err) == []


def test_train_tokenizer_notes_spm_model_type_with_bpe(folder, capfd):
    mod = load_tool("train_tokenizer")
    capfd.readouterr()
    assert call(mod.main, TOK + ["--spm-model-type", "bpe"]) == 0
    notes = _notes(capfd.readouterr().err)
    assert notes == ["note: --spm-model-type bpe is ignored: it applies to --model-type sentencepiece"], notes
    assert call(mod.main, [*TOK[:-1], "t2.json"]) == 0  # not given: no note
    assert _notes(capfd.readouterr().err) == []


# ---- a dataset writer and a PREFIX.replacing that is not a journal (readers refuse it; preprocess removed it)
@pytest.mark.parametrize(
    "journal",
    [b"garbage{", b'{"bin": "other.bin", "idx": "other.idx"}', b"[]", b""],
    ids=["garbage", "names-other-files", "list", "empty"],
)
def test_preprocess_refuses_a_journal_that_is_not_one(journal, folder, capfd):
    (folder / "out").mkdir()
    j = folder / "out" / "x_text_document.replacing"
    j.write_bytes(journal)
    mod = load_tool("preprocess_data")
    capfd.readouterr()
    rc = call(mod.main, PRE)
    line = one_error_line(capfd)
    assert rc == 1 and "x_text_document.replacing: not a replacement journal" in line, line
    assert j.read_bytes() == journal  # left for the user, untouched
    assert sorted(os.listdir(folder / "out")) == ["x_text_document.replacing"]  # nothing written


def test_a_journal_of_an_interrupted_replacement_is_still_finished_by_the_writer(folder, capfd):
    """The writer completes an interrupted replacement (as a reader does) and then writes its own."""
    from megatron_topo.data import MMapIndexedDataset

    write_dataset(folder / "out" / "x_text_document", 3, 1)
    for suffix in ("bin", "idx"):  # a crash after the journal, before the renames
        os.replace(folder / "out" / f"x_text_document.{suffix}", folder / "out" / f"x_text_document.{suffix}.tmp.1")
    (folder / "out" / "x_text_document.replacing").write_text(
        json.dumps({"bin": "x_text_document.bin.tmp.1", "idx": "x_text_document.idx.tmp.1"})
    )
    mod = load_tool("preprocess_data")
    capfd.readouterr()
    assert call(mod.main, PRE + ["--force"]) == 0, capfd.readouterr().err
    assert sorted(os.listdir(folder / "out")) == ["x_text_document.bin", "x_text_document.idx"]
    assert MMapIndexedDataset(str(folder / "out" / "x_text_document")).num_documents == 1  # in.txt: one document


# ---- gpu_check on a CPU host without --small
class _Stop(BaseException):
    pass


@pytest.mark.parametrize("small", [False, True])
def test_gpu_check_on_cpu_says_the_full_size_checks_are_slow(small, folder, capfd, monkeypatch):
    from megatron_topo.commands import gpu_check, gpu_check_cases

    def stop(dev):
        raise _Stop  # end the run where the first check starts

    monkeypatch.setattr(gpu_check_cases, "triton_row", stop)
    (folder / "cfg.yml").write_text(BASE_CFG)
    args = gpu_check.parse_args(["cfg.yml", "--no-dry-run"] + (["--small"] if small else []))
    capfd.readouterr()
    with pytest.raises(_Stop):
        gpu_check.run_rank(args)
    # the interrupted check's hang timer is cancelled: left armed, it ended this very process
    # (os._exit(1) with a false "a hang" row) --timeout seconds later, in the middle of the suite
    armed = [t for t in threading.enumerate() if isinstance(t, threading.Timer) and not t.finished.is_set()]
    assert not armed, armed
    notes = _notes(capfd.readouterr().err)
    if small:
        assert notes == []
    else:
        assert len(notes) == 1 and "take a minute or more; --small shrinks them" in notes[0], notes


# ---- a stopped bench_data: no process, no generated corpus left
def _alive_in_group(pgid: int) -> list[str]:
    """Processes of the group that are not zombies (a zombie waits for init to reap it)."""
    r = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True)
    return [x for x in r.stdout.splitlines() if x.split()[1:2] and not x.split()[1].startswith("Z")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_bench_data_leaves_no_process_and_no_corpus(sig, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "bench_data.py"), "--mb", "4", "--workers", "2"]
    cmd += ["--tokenizer-type", "ByteLevel", "--repeat", "100000", "--json", str(tmp_path / "bd.json")]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_alive_in_group(p.pid)) < 4 and time.monotonic() < deadline:  # itself, tracker, 2 workers
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.2)
        assert len(_alive_in_group(p.pid)) >= 4
        time.sleep(0.5)
        os.kill(p.pid, sig)
        rc = p.wait(timeout=30)
        err = p.stderr.read().decode()
        deadline = time.monotonic() + 10
        while _alive_in_group(p.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive_in_group(p.pid) == []
        if sig == signal.SIGTERM:  # unwound: one line, the generated corpus removed
            assert rc == 128 + signal.SIGTERM, err
            assert [x for x in err.splitlines() if x.strip()] == ["error: stopped by SIGTERM; nothing written"], err
            assert os.listdir(tmp) == []
        assert not (tmp_path / "bd.json").exists()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
