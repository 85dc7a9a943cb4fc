"""Hostile inputs, round 3b (issue 29, second probe): the same rules as tests/test_hostile_inputs_r3.py
(whose world, snapshot and mutations this file imports): each case exits != 0 with exactly one
``error:`` line naming the problem, no traceback, within 30 s, every file on disk unchanged.

Families: evaluation asked for that could not run (eval_iters 0, a validation split without data);
the offline tools' unverified load (``--load-unverified``); every tool's outputs over files the run
did not create (a user's file, an input, a FIFO, a link, a folder that is not an export, a
checkpoint step); FIFOs and devices among inputs; sizes that never end (tokens to generate,
workers, vocabulary, model dimensions); launcher variables that contradict each other; meta.json
and HF fields still used unvalidated; tools that skipped without a word (docs/reliability.md §7b)."""

import json
import os
import time

import pytest

from .cli_cases import ROOT, call, one_error_line, scratch
from .test_hostile_inputs_r3 import (
    GEN,
    PM,
    STEP,
    C,
    G,
    H,
    S,
    T,
    _delete,
    _fifo,
    _hf_config,
    _link,
    _meta,
    _set,
    _write,
    snap,
    world,  # noqa: F401 (a pytest fixture)
)
from .tool_loader import load_tool

PP = load_tool("preprocess_data").main
TT = load_tool("train_tokenizer").main

CONS_ARGS = ["--checkpoint", "ck", "--output", "o.pt"]
CONV = ["--checkpoint", "ck", "--output", "hf2"]
NO_RECORDS = _meta(_delete(["files"]))
TEXT = _write("text/in.jsonl", "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(20)))
PRE = ["--input", "text/in.jsonl", "--output-prefix", "out/x", "--tokenizer-type", "CharLevelTokenizer", "--quiet"]
TOK = ["--input", "text/in.jsonl", "--model-type", "bpe", "--vocab-size", "300"]
RUN = ["log/metrics.jsonl"]  # plot_metrics' run folder: the world's log/ (written below)


def _both(*fs):
    def f(d):
        for g in fs:
            g(d)

    return f


def _metrics(d):
    (d / "log").mkdir(exist_ok=True)
    (d / "log" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i, "loss": 4.0 / i}) + "\n" for i in (1, 2, 3))
    )


def _st_dtype(dtype):
    """hf/model.safetensors with its first tensor's dtype changed in the header (same bytes)."""

    def f(d):
        import struct

        p = d / "hf" / "model.safetensors"
        raw = p.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8 : 8 + n])
        hdr[min(k for k in hdr if k != "__metadata__")]["dtype"] = dtype
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        p.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])

    return f


# (id, entry point, argv, mutation, exit code, text the one stderr line contains)
CASES = [
    # ---- evaluation asked for (eval_interval > 0) must run: batches and a validation split with data
    (
        "eval-iters-zero",
        T,
        S("eval_interval=1", "eval_iters=0", "split=90,10,0"),
        None,
        2,
        "eval_iters is 0 but eval_interval 1 evaluates every 1 steps on 0 batches",
    ),
    (
        "eval-iters-zero-default-interval",
        T,
        S("eval_interval=100", "train_iters=100", "eval_iters=0", "split=9,1"),
        None,
        2,
        "set eval_iters >= 1 (micro-batches per evaluation), or set eval_interval: 0 to turn evaluation off",
    ),
    (
        "eval-split-without-validation",
        T,
        S("eval_interval=1", "eval_iters=1"),
        None,
        2,
        "split '100,0,0' gives the validation split no share of data/toy, but eval_interval 1 evaluates on it",
    ),
    (
        "eval-split-two-parts",
        T,
        S("eval_interval=2", "eval_iters=1", "split=9,0"),
        None,
        2,
        "split '9,0' gives the validation split no share of data/toy",
    ),
    (
        "eval-split-rounds-to-zero-docs",
        T,
        S("eval_interval=1", "eval_iters=1", "split=999,1,0"),
        None,
        2,
        "data/toy: split '999,1,0' gives the validation split 0 of the 64 documents, but eval_interval 1 evaluates",
    ),
    (
        "eval-train-paths-without-valid",
        T,
        S("train_data_paths=[data/toy]", "data_path=null", "eval_interval=1", "eval_iters=1"),
        None,
        2,
        "eval_interval 1 evaluates on valid_data_paths, which is not set",
    ),
    ("eval-interval-negative", T, S("eval_interval=-1"), None, 2, "eval_interval must be >= 0, got -1"),
    (
        "eval-iters-negative",
        T,
        S("eval_interval=1", "eval_iters=-2", "split=90,10,0"),
        None,
        2,
        "eval_iters must lie in [0, 16384], got -2",
    ),
    # ---- the offline tools refuse a checkpoint without file records, naming their own flag
    (
        "unverified-convert-refused",
        H,
        CONV,
        NO_RECORDS,
        2,
        "no size and SHA-256 recorded for rank_00000.pt, so its bytes cannot be verified; refusing to load it "
        "(pass --load-unverified to load it anyway)",
    ),
    ("unverified-consolidate-refused", C, CONS_ARGS, NO_RECORDS, 2, "(pass --load-unverified to load it anyway)"),
    ("unverified-generate-refused", G, GEN, NO_RECORDS, 2, "(pass --load-unverified to load it anyway)"),
    # ---- every tool's outputs: never over a file the run did not create
    (
        "plot-out-over-a-config",
        PM,
        ["log", "--out", "cfg.yml"],
        _metrics,
        2,
        "--out cfg.yml: the output must be a .png",
    ),
    (
        "plot-out-over-a-users-png",
        PM,
        ["log", "--out", "mine.png"],
        _both(_metrics, _write("mine.png", b"\x89PNG\r\n\x1a\nx")),
        2,
        "--out mine.png already exists; pass --force to replace it",
    ),
    (
        "plot-out-force-over-not-a-png",
        PM,
        ["log", "--out", "f.png", "--force"],
        _both(_metrics, _write("f.png", "text")),
        2,
        "--out f.png exists and is not a PNG image; it is not replaced, even with --force",
    ),
    (
        "plot-out-a-fifo",
        PM,
        ["log", "--out", "o.png"],
        _both(_metrics, _fifo("o.png")),
        2,
        "--out o.png is a FIFO, not a file",
    ),
    (
        "plot-out-a-symlink",
        PM,
        ["log", "--out", "o.png", "--force"],
        _both(_metrics, _link("o.png", "cfg.yml")),
        2,
        "--out o.png is a symbolic link; it is not replaced",
    ),
    (
        "plot-out-in-a-checkpoint",
        PM,
        ["log", "--out", f"{STEP}/o.png"],
        _metrics,
        2,
        "lies inside the checkpoint folder",
    ),
    (
        "tokenizer-out-is-its-input",
        TT,
        TOK + ["--output", "text/in.jsonl", "--force"],
        TEXT,
        1,
        "--output text/in.jsonl is an input of this run",
    ),
    (
        "tokenizer-out-over-a-users-file",
        TT,
        TOK + ["--output", "cfg.yml", "--force"],
        TEXT,
        1,
        "--output cfg.yml exists and is not a tokenizers JSON file; it is not replaced, even with --force",
    ),
    (
        "tokenizer-out-exists",
        TT,
        TOK + ["--output", "t.json"],
        _both(TEXT, _write("t.json", '{"model": {}}')),  # a tokenizers JSON: --force may replace it
        1,
        "--output t.json already exists; pass --force to replace it",
    ),
    (
        "preprocess-out-exists",
        PP,
        PRE,
        _both(TEXT, _write("out/x_text_document.bin", b""), _write("out/x_text_document.idx", b"MMIDIDX\x00\x00")),
        1,
        "--output-prefix out/x_text_document.bin already exists; pass --force to replace it",
    ),
    (
        "preprocess-out-over-not-a-dataset",
        PP,
        PRE + ["--force"],
        _both(TEXT, _write("out/x_text_document.bin", "mine")),
        1,
        "is not part of a dataset (no dataset index out/x_text_document.idx beside it)",
    ),
    (
        "preprocess-out-is-its-input",
        PP,
        ["--input", "text/x_text_document.bin"] + PRE[2:3] + ["text/x"] + PRE[4:] + ["--force"],
        _write("text/x_text_document.bin", "some text"),
        1,
        "is an input of this run",
    ),
    (
        "preprocess-out-in-a-checkpoint",
        PP,
        PRE[:3] + [f"{STEP}/x"] + PRE[4:],
        TEXT,
        1,
        "lies inside the checkpoint folder",
    ),
    (
        "consolidate-out-not-pt-or-safetensors",
        C,
        ["--checkpoint", "ck", "--output", "cfg.yml", "--force"],
        None,
        2,
        "give FILE.pt or FILE.safetensors",
    ),
    (
        "consolidate-force-over-a-foreign-pt",
        C,
        ["--checkpoint", "ck", "--output", "x.pt", "--force"],
        _write("x.pt", "mine"),
        2,
        "--output x.pt exists and is not a torch archive; it is not replaced, even with --force",
    ),
    (
        "consolidate-force-over-an-hf-export",
        C,
        ["--checkpoint", "ck", "--output", "hf/model.safetensors", "--force"],
        None,
        2,
        "lies inside",  # the folder is an HF export: refused before the file's own check (probe 7's recheck)
    ),
    ("consolidate-out-a-symlink", C, CONS_ARGS + ["--force"], _link("o.pt", "cfg.yml"), 2, "is a symbolic link"),
    (
        "convert-force-over-a-data-folder",
        H,
        ["--checkpoint", "ck", "--output", "data", "--force"],
        None,
        2,
        "--output data holds 'other.bin' and 3 more, which no conversion writes; it is not replaced, even with --force",
    ),
    (
        "convert-force-over-an-export-with-notes",
        H,
        ["--checkpoint", "ck", "--output", "hf", "--force"],
        _write("hf/NOTES.md", "mine"),
        2,
        "--output hf holds 'NOTES.md', which no conversion writes",
    ),
    (
        "convert-out-a-symlink",
        H,
        ["--checkpoint", "ck", "--output", "h3", "--force"],
        _link("h3", "hf"),
        2,
        "--output h3 is a symbolic link; it is not replaced",
    ),
    (
        "train-metrics-a-fifo",
        T,
        S("log_dir=lg"),
        _both(lambda d: (d / "lg").mkdir(), _fifo("lg/metrics.jsonl")),
        2,
        "log_dir lg: metrics.jsonl is a FIFO, not a file; the run appends its records there",
    ),
    (
        "train-metrics-a-symlink",
        T,
        S("log_dir=lg"),
        _both(_write("notes.txt", "mine\n"), lambda d: (d / "lg").mkdir(), _link("lg/metrics.jsonl", "notes.txt")),
        2,
        "log_dir lg: metrics.jsonl is a symbolic link",
    ),
    (
        "train-tensorboard-in-a-checkpoint",
        T,
        S(f"tensorboard_dir={STEP}/tb"),
        None,
        2,
        f"tensorboard_dir {STEP}/tb lies inside the checkpoint folder",
    ),
    ("train-data-cache-in-a-checkpoint", T, S(f"data_cache_dir={STEP}/c"), None, 2, "data_cache_dir"),
    # ---- inputs that block or never end; sizes that make a run never end
    (
        "preprocess-input-folder-with-a-fifo",
        PP,
        ["--input", "text"] + PRE[2:],
        _both(TEXT, _fifo("text/p.txt")),
        1,
        "text/p.txt is a FIFO, not a file",
    ),
    (
        "preprocess-input-a-fifo",
        PP,
        ["--input", "p.jsonl"] + PRE[2:],
        _fifo("p.jsonl"),
        1,
        "p.jsonl is a FIFO, not a file",
    ),
    (
        "preprocess-input-a-device",
        PP,
        ["--input", "z.txt"] + PRE[2:],
        _link("z.txt", "/dev/zero"),
        1,
        "z.txt is a device",
    ),
    (
        "gen-max-new-tokens-1e9",
        G,
        GEN[:4] + ["--max-new-tokens", "1000000000"],
        None,
        2,
        "--max-new-tokens 1000000000: must lie in [0, 1,048,576]",
    ),
    (
        "preprocess-workers-1e5",
        PP,
        PRE + ["--workers", "100000"],
        TEXT,
        1,
        "argument --workers: 100000 must lie in [1,",
    ),
    (
        "preprocess-char-vocab-zero",
        PP,
        PRE + ["--vocab-size", "0"],
        TEXT,
        1,
        "argument --vocab-size: 0 must lie in [1, 2,147,483,648]",
    ),
    (
        "preprocess-char-vocab-1e13",
        PP,
        PRE + ["--vocab-size", "10000000000000"],
        TEXT,
        1,
        "argument --vocab-size: 10000000000000",
    ),
    (
        "tokenizer-vocab-1e12",
        TT,
        TOK[:-1] + ["1000000000000", "--output", "t.json"],
        TEXT,
        1,
        "must lie in [259, 16,777,216]",
    ),
    (
        "tokenizer-min-frequency-negative",
        TT,
        TOK + ["--min-frequency", "-1", "--output", "t.json"],
        TEXT,
        2,
        "argument --min-frequency: -1 must lie in [0,",
    ),
    ("train-layers-1e8", T, S("num_layers=100000000"), None, 2, "num_layers must lie in [1, 4096]"),
    ("train-hidden-1e9", T, S("hidden_size=1000000000"), None, 2, "hidden_size must lie in [1, 262144]"),
    (
        "train-heads-32768",
        T,
        S("num_attention_heads=32768", "hidden_size=32768"),
        None,
        2,
        "num_attention_heads must lie in [1, 16384]",
    ),
    (
        "convert-max-shard-size-1e400",
        H,
        CONV + ["--max-shard-size", "1e400"],
        None,
        2,
        "--max-shard-size: '1e400' is not a size",
    ),
    # ---- meta.json and HF fields still used unvalidated
    (
        "meta-shard-holders-zero",
        C,
        CONS_ARGS,
        _meta(_set(["shard_holders"], 0)),
        2,
        "shard_holders: must lie in [1, 1]",
    ),
    (
        "meta-global-batch-string",
        T,
        S("load=ck", "train_iters=3"),
        _meta(_set(["trainer", "global_batch"], "x")),
        2,
        "trainer.global_batch: expected an integer, got str 'x'",
    ),
    (
        "hf-single-weights-symlink-out",
        T,
        S("finetune_from=hf"),
        lambda d: (os.rename(d / "hf" / "model.safetensors", d / "m.st"), _link("hf/model.safetensors", "m.st")(d)),
        2,
        "'model.safetensors' is a symbolic link out of hf",
    ),
    ("hf-weights-int32", T, S("finetune_from=hf"), _st_dtype("I32"), 2, "is torch.int32, not a floating-point tensor"),
    ("hf-weights-uint32", T, S("finetune_from=hf"), _st_dtype("U32"), 2, "not a floating-point tensor"),
    (
        "hf-rope-scaling-old-type",
        T,
        S("finetune_from=hf"),
        _hf_config(_set(["rope_scaling"], {"type": "yarn", "factor": 2})),
        2,
        "rope_type 'yarn' is not supported (plain rotary only)",
    ),
    # ---- tools that skipped without a word
    (
        "plot-metrics-not-in-any-run",
        PM,
        ["log", "--out", "o.png", "--metrics", "nope"],
        _metrics,
        2,
        "--metrics: no run has 'nope' (the records' keys: loss)",
    ),
    (
        "plot-metrics-only-garbage",
        PM,
        ["g", "--out", "o.png"],
        _write("g/metrics.jsonl", "x\ny\n"),
        2,
        "g/metrics.jsonl: no records (no line of its 4 bytes is a record)",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_r3b(case, world, tmp_path, monkeypatch, capfd):  # noqa: F811
    cid, entry, argv, mutate, code, needle = case
    d = scratch(world, tmp_path, monkeypatch)
    if mutate:
        mutate(d)
    before = snap(d)
    capfd.readouterr()
    t0 = time.perf_counter()
    rc = call(entry, argv)
    took = time.perf_counter() - t0
    line = one_error_line(capfd) if entry is not PM else _plot_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert len(line) < 600, line
    assert took < 30, f"{cid} took {took:.1f} s"
    after = {k: v for k, v in snap(d).items() if not k.startswith("cache/")}
    before = {k: v for k, v in before.items() if not k.startswith("cache/")}
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


def _plot_error_line(capfd):
    """plot_metrics names each line it skipped (``plot_metrics: warning: ...``); then its one error line."""
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("plot_metrics: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    return lines[0]


ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29581"}
ENV_CASES = [  # launcher variables that contradict each other: one line, before any rendezvous
    ("env-world-size-without-rank", {"WORLD_SIZE": "2", **ENV}, "WORLD_SIZE=2 but RANK is not set"),
    (
        "env-local-rank-negative",
        {"LOCAL_RANK": "-3", "RANK": "0", "WORLD_SIZE": "1"},
        "LOCAL_RANK=-3 is not a rank on this node",
    ),
    (
        "env-local-rank-beyond-the-node",
        {"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2"},
        "LOCAL_RANK=5 is not a rank on this node; valid: 0..1",
    ),
    (
        "env-local-world-size-zero",
        {"LOCAL_WORLD_SIZE": "0", "RANK": "0", "WORLD_SIZE": "1"},
        "LOCAL_WORLD_SIZE=0; it must be >= 1",
    ),
    (
        "env-master-addr-unresolvable",
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no such host !!", "MASTER_PORT": "29581"},
        "MASTER_ADDR='no such host !!' cannot be resolved",
    ),
]


@pytest.mark.parametrize("case", ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_launcher_environment(case, world, tmp_path, monkeypatch, capfd):  # noqa: F811
    cid, env, needle = case
    d = scratch(world, tmp_path, monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = snap(d)
    capfd.readouterr()
    t0 = time.perf_counter()
    rc = call(T, S("train_iters=1"))
    line = one_error_line(capfd)
    assert rc == 2 and needle in line, (rc, line)
    assert time.perf_counter() - t0 < 30 and snap(d) == before


def test_cases_are_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES + ENV_CASES if f"`{c[0]}`" not in doc]
    assert not missing, missing


# ------------------------------------------------------------------------------ correct behaviour
def test_evaluation_runs_when_asked_for_and_is_off_with_interval_zero(world, tmp_path, monkeypatch):  # noqa: F811
    d = scratch(world, tmp_path, monkeypatch)
    assert call(T, S("eval_interval=1", "eval_iters=1", "split=90,10,0", "log_dir=ev")) == 0
    assert "eval_loss" in (d / "ev" / "metrics.jsonl").read_text()
    # eval_interval: 0 is the way to turn it off, whatever eval_iters and split say
    assert call(T, S("eval_interval=0", "eval_iters=0", "log_dir=off")) == 0
    assert "eval_loss" not in (d / "off" / "metrics.jsonl").read_text()


def test_eval_interval_above_train_iters_is_a_note(world, tmp_path, monkeypatch, capfd):  # noqa: F811
    scratch(world, tmp_path, monkeypatch)
    capfd.readouterr()
    assert call(T, S("eval_interval=5", "eval_iters=1", "split=90,10,0", "log_dir=ev5")) == 0
    out = capfd.readouterr().out
    assert "note: eval_interval 5 is above train_iters 2: no step of this run evaluates" in out, out


@pytest.mark.parametrize("tool", ["convert", "consolidate", "generate"])
def test_offline_tools_load_unverified_when_asked_for(tool, world, tmp_path, monkeypatch, capfd):  # noqa: F811
    d = scratch(world, tmp_path, monkeypatch)
    NO_RECORDS(d)
    entry, argv = {"convert": (H, CONV), "consolidate": (C, CONS_ARGS), "generate": (G, GEN)}[tool]
    capfd.readouterr()
    assert call(entry, argv + ["--load-unverified"]) == 0
    if tool == "generate":
        assert capfd.readouterr().out.startswith("ids: ")
    else:
        assert os.path.exists(d / argv[-1])


def test_outputs_a_tool_wrote_are_replaced(world, tmp_path, monkeypatch):  # noqa: F811
    """plot_metrics replaces its own earlier PNG without --force; --force replaces a dataset, a
    consolidation and an export (what each tool writes), and only those."""
    d = scratch(world, tmp_path, monkeypatch)
    _metrics(d)
    TEXT(d)
    assert call(PM, ["log", "--out", "o.png"]) == 0 and call(PM, ["log", "--out", "o.png", "--smooth", "2"]) == 0
    assert call(PP, PRE) == 0 and call(PP, PRE + ["--force"]) == 0
    assert call(TT, TOK + ["--output", "t.json"]) == 0 and call(TT, TOK + ["--output", "t.json", "--force"]) == 0
    for out in ("c.pt", "c.safetensors"):
        assert call(C, ["--checkpoint", "ck", "--output", out]) == 0
        assert call(C, ["--checkpoint", "ck", "--output", out, "--force"]) == 0
    assert call(H, ["--checkpoint", "ck", "--output", "hf", "--force"]) == 0
