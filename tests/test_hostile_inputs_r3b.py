"""Hostile inputs, round 3b (issue 29, second probe): the same rules as tests/test_hostile_inputs_r3.py
(whose world, snapshot and mutations this file imports): each case exits != 0 with exactly one
``error:`` line naming the problem, no traceback, within 30 s, every file on disk unchanged.

Families: evaluation asked for that could not run (eval_iters 0, a validation split without data);
the offline tools' unverified load (``--load-unverified``); ... (see docs/reliability.md §7b)."""
import os
import time

import pytest

from .cli_cases import ROOT, call, one_error_line, scratch
from .test_hostile_inputs_r3 import C, G, GEN, H, S, T, _delete, _meta, snap, world  # noqa: F401

CONS_ARGS = ["--checkpoint", "ck", "--output", "o.pt"]
CONV = ["--checkpoint", "ck", "--output", "hf2"]
NO_RECORDS = _meta(_delete(["files"]))

# (id, entry point, argv, mutation, exit code, text the one stderr line contains)
CASES = [
    # ---- evaluation asked for (eval_interval > 0) must run: batches and a validation split with data
    ("eval-iters-zero", T, S("eval_interval=1", "eval_iters=0", "split=90,10,0"), None, 2,
     "eval_iters is 0 but eval_interval 1 evaluates every 1 steps on 0 batches"),
    ("eval-iters-zero-default-interval", T, S("eval_interval=100", "train_iters=100", "eval_iters=0", "split=9,1"), None, 2,
     "set eval_iters >= 1 (micro-batches per evaluation), or set eval_interval: 0 to turn evaluation off"),
    ("eval-split-without-validation", T, S("eval_interval=1", "eval_iters=1"), None, 2,
     "split '100,0,0' gives the validation split no share of data/toy, but eval_interval 1 evaluates on it"),
    ("eval-split-two-parts", T, S("eval_interval=2", "eval_iters=1", "split=9,0"), None, 2,
     "split '9,0' gives the validation split no share of data/toy"),
    ("eval-split-rounds-to-zero-docs", T, S("eval_interval=1", "eval_iters=1", "split=999,1,0"), None, 2,
     "data/toy: split '999,1,0' gives the validation split 0 of the 64 documents, but eval_interval 1 evaluates"),
    ("eval-train-paths-without-valid", T, S("train_data_paths=[data/toy]", "data_path=null", "eval_interval=1",
                                            "eval_iters=1"), None, 2,
     "eval_interval 1 evaluates on valid_data_paths, which is not set"),
    ("eval-interval-negative", T, S("eval_interval=-1"), None, 2, "eval_interval must be >= 0, got -1"),
    ("eval-iters-negative", T, S("eval_interval=1", "eval_iters=-2", "split=90,10,0"), None, 2,
     "eval_iters must be >= 0, got -2"),
    # ---- the offline tools refuse a checkpoint without file records, naming their own flag
    ("unverified-convert-refused", H, CONV, NO_RECORDS, 2,
     "no size and SHA-256 recorded for rank_00000.pt, so its bytes cannot be verified; refusing to load it "
     "(pass --load-unverified to load it anyway)"),
    ("unverified-consolidate-refused", C, CONS_ARGS, NO_RECORDS, 2, "(pass --load-unverified to load it anyway)"),
    ("unverified-generate-refused", G, GEN, NO_RECORDS, 2, "(pass --load-unverified to load it anyway)"),
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
    line = one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert len(line) < 600, line
    assert took < 30, f"{cid} took {took:.1f} s"
    after = {k: v for k, v in snap(d).items() if not k.startswith("cache/")}
    before = {k: v for k, v in before.items() if not k.startswith("cache/")}
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


def test_cases_are_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
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
