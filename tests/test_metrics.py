"""metrics.py: GPT-NeoX FLOPs formula, TFLOPS, metrics.jsonl + TensorBoard writer, reader."""

from __future__ import annotations

import glob
import json
import math
import os

import pytest
import torch

from megatron_topo.config import ModelConfig
from megatron_topo.metrics import (
    MetricsWriter,
    drop_superseded,
    flops_per_iteration,
    mfu,
    peak_memory_bytes,
    read_metrics,
    tflops_per_gpu,
)

SMALL = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=512)


def _strict(line: str) -> dict:
    """json.loads that refuses the non-standard NaN/Infinity tokens."""

    def bad(tok):
        raise ValueError(f"non-standard JSON constant {tok}")

    return json.loads(line, parse_constant=bad)


# ------------------------------------------------------------------------------------ FLOPs
def test_flops_hand_computed():
    # 24 * f * B * s * L * h^2 * (1 + s/(6h) + V/(16 L h)), B=4, s=64, L=2, h=64, V=512, f=3:
    # 24*3*4*64*2*4096 = 150,994,944;  1 + 64/384 + 512/2048 = 17/12;  product = 213,909,504
    assert flops_per_iteration(SMALL, 4, checkpoint_activations=False) == pytest.approx(213_909_504.0, rel=1e-12)
    # with recompute f = 4: 24*4*4*64*2*4096 * 17/12 = 285,212,672
    assert flops_per_iteration(SMALL, 4, checkpoint_activations=True) == pytest.approx(285_212_672.0, rel=1e-12)


def test_flops_recompute_factor_and_linearity():
    cfg = ModelConfig(num_layers=44, hidden_size=6144, num_attention_heads=64, seq_length=2048, vocab_size=50432)
    f3 = flops_per_iteration(cfg, 8, False)
    f4 = flops_per_iteration(cfg, 8, True)
    assert f4 / f3 == pytest.approx(4.0 / 3.0, rel=1e-12)
    assert flops_per_iteration(cfg, 16, False) == pytest.approx(2 * f3, rel=1e-12)
    # the vocabulary term carries the full prefactor (the GPT-NeoX PR #1044 bug added it bare)
    no_vocab = 24 * 3 * 8 * 2048 * 44 * 6144**2 * (1 + 2048 / (6 * 6144))
    assert f3 - no_vocab == pytest.approx(24 * 3 * 8 * 2048 * 44 * 6144**2 * 50432 / (16 * 44 * 6144), rel=1e-9)
    # about 6 * params * tokens for a 20B model: within 15%
    params = 20.6e9
    assert f3 == pytest.approx(6 * params * 8 * 2048, rel=0.15)


def test_tflops_and_mfu():
    assert tflops_per_gpu(8e12, 2.0, 4) == pytest.approx(1.0)
    assert mfu(8e12, 2.0, 4, peak_tflops=2.0) == pytest.approx(0.5)
    assert math.isnan(tflops_per_gpu(1e12, 0.0, 1))


def test_peak_memory_cpu():
    rss = peak_memory_bytes("cpu")
    assert isinstance(rss, int) and rss > 10 * 2**20  # this process has imported torch


# ----------------------------------------------------------------------------------- writer
def test_writer_jsonl_append_and_tensorboard(tmp_path):
    run = tmp_path / "run"
    w = MetricsWriter(str(run))
    w.log(1, {"loss": 5.0, "tflops_per_gpu": torch.tensor(0.25), "tokens_per_s": 1000, "skipped": False})
    w.log(2, {"loss": float("nan"), "grad_norm": float("inf"), "comm_bytes": {"intra_node": 12}})
    w.close()
    # resume: a new writer on the same run appends, never truncates
    w = MetricsWriter(str(run))
    w.log(3, {"loss": 4.0, "grad_norm": -float("inf")})
    w.close()

    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    recs = [_strict(line) for line in lines]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[0] == {"step": 1, "loss": 5.0, "tflops_per_gpu": 0.25, "tokens_per_s": 1000, "skipped": False}
    assert recs[1]["loss"] == "NaN" and recs[1]["grad_norm"] == "Infinity"
    assert recs[1]["comm_bytes"] == {"intra_node": 12}
    assert recs[2]["grad_norm"] == "-Infinity"

    back = read_metrics(str(run))
    assert math.isnan(back[1]["loss"]) and back[1]["grad_norm"] == math.inf and back[2]["grad_norm"] == -math.inf
    assert read_metrics(str(run / "metrics.jsonl"))[0]["loss"] == 5.0

    events = glob.glob(str(run / "tensorboard" / "events.out.tfevents.*"))
    assert len(events) == 2 and all(os.path.getsize(e) > 0 for e in events)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for e in events:
        acc = EventAccumulator(e)
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"loss", "tflops_per_gpu", "tokens_per_s", "grad_norm", "comm_bytes/intra_node"} <= tags


def test_writer_custom_tensorboard_dir_and_flush_each_line(tmp_path):
    tb = tmp_path / "tb"
    w = MetricsWriter(str(tmp_path / "run"), tensorboard_dir=str(tb))
    import numpy as np

    w.log(7, {"loss": np.float32(1.5), "hist": np.array([1, 2])})
    # flushed per line: readable before close
    assert _strict((tmp_path / "run" / "metrics.jsonl").read_text().strip()) == {"step": 7, "loss": 1.5, "hist": [1, 2]}
    w.close()
    assert glob.glob(str(tb / "events.out.tfevents.*"))
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_disabled_writer_touches_nothing(tmp_path):
    w = MetricsWriter(str(tmp_path / "rank1"), enabled=False)
    w.log(1, {"loss": 1.0})
    w.close()
    assert not (tmp_path / "rank1").exists()


def test_resume_after_truncated_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # crash mid-line
    w = MetricsWriter(str(run), tensorboard=False)
    w.log(2, {"loss": 1.0})
    w.log(2, {"loss": 0.9})  # a resumed run repeats a step: the last record wins in last_per_step
    w.close()
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2: skipping"):
        recs = read_metrics(str(run))
    assert [r["step"] for r in recs] == [1, 2, 2]
    with pytest.warns(UserWarning):
        assert [r["loss"] for r in read_metrics(str(run), last_per_step=True)] == [2.0, 0.9]


def test_last_per_step_merges_records_of_a_step(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.log(10, {"loss": 3.0, "tokens_per_sec": 100.0})
    w.log(10, {"eval_loss": 3.5})  # an eval record at the same step
    w.log(11, {"loss": 2.9})
    w.close()
    recs = read_metrics(str(tmp_path), last_per_step=True)
    assert recs == [{"step": 10, "loss": 3.0, "tokens_per_sec": 100.0, "eval_loss": 3.5}, {"step": 11, "loss": 2.9}]


def test_a_resume_supersedes_the_steps_after_its_checkpoint(tmp_path):
    """A job killed after its checkpoint of step 2 logged steps 3-5; the job resumed from step 2
    moves those records aside (metrics.jsonl then holds every step once) and a file written before
    this rule reads back as one history (the resumed steps win, the superseded ones are dropped)."""
    run = tmp_path / "run"
    w = MetricsWriter(str(run), tensorboard=False)
    for s in range(1, 6):
        w.log(s, {"loss": float(s)})
    w.log(4, {"eval_loss": 9.0})  # eval of the killed job at a superseded step
    w.close()
    older = (run / "metrics.jsonl").read_text()
    w = MetricsWriter(str(run), tensorboard=False, resume_step=2)
    assert w.superseded == 4
    for s in range(3, 7):
        w.log(s, {"loss": 10.0 + s})
    w.close()
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in read_metrics(str(run))] == [1.0, 2.0, 13.0, 14.0, 15.0, 16.0]
    moved = [json.loads(x) for x in (run / "metrics.jsonl.superseded").read_text().splitlines()]
    assert [r["step"] for r in moved] == [3, 4, 5, 4]
    # the same history in one file (before this rule): read back as one curve, no eval_loss leak
    spliced = tmp_path / "old"
    spliced.mkdir()
    (spliced / "metrics.jsonl").write_text(
        older + "".join(json.dumps({"step": s, "loss": 10.0 + s}) + "\n" for s in range(3, 7))
    )
    recs = read_metrics(str(spliced), last_per_step=True)
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0), (6, 16.0)]
    assert all("eval_loss" not in r for r in recs)
    assert drop_superseded([{"step": 1}, {"step": 2}, {"step": 2}, {"step": 1}])[1] == 3


def test_read_metrics_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(str(tmp_path))


def test_step_key_reserved(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    with pytest.raises(ValueError, match="reserved"):
        w.log(1, {"step": 3})
    w.close()


# ------------------------------------------------------------------------- bench smoke test
def test_bench_model_smoke(tmp_path):
    """tools/bench_model.py runs; its plain GPT-NeoX matches ours (same logits, same loss path)."""
    import subprocess
    import sys

    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "bench_model.py")
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            tool,
            "--num-layers",
            "2",
            "--hidden-size",
            "32",
            "--num-attention-heads",
            "4",
            "--seq-length",
            "16",
            "--vocab-size",
            "64",
            "--batch",
            "2",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["logits_parity_max_abs_diff"] < 1e-5
    # same initial weights, batches and optimizer semantics: the losses agree after 3 steps
    assert res["final_loss"]["ours"] == pytest.approx(res["final_loss"]["plain"], rel=1e-4)
    assert res["ratio_ours_over_plain"] > 0 and set(res["tokens_per_s"]) == {"ours", "plain"}
    assert "ours/plain" in r.stdout


def test_read_metrics_caps_a_line_and_counts_many_skips(tmp_path, monkeypatch):
    """A line far longer than any record is skipped without being read whole (monkeypatched cap:
    64 characters; the real one is 1 MiB), and a file of many bad lines gives SKIPS_NAMED named
    warnings plus one that counts the rest, not one warning per line."""
    import warnings

    from megatron_topo import metrics as M

    monkeypatch.setattr(M, "MAX_RECORD_CHARS", 64)
    p = tmp_path / "metrics.jsonl"
    bad = "".join("{broken\n" for _ in range(1000))
    p.write_text('{"step": 1, "loss": 2.0}\n' + '{"step": 2, "x": "' + "z" * 5000 + '"}\n' + bad + '{"step": 3}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = M.read_metrics(str(p))
    assert [r["step"] for r in recs] == [1, 3]
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == M.SKIPS_NAMED + 1, msgs
    assert msgs[0] == f"{p}:2: skipping a line longer than 64 characters, not a record"
    assert msgs[1].startswith(f"{p}:3: skipping a line that is not valid JSON")
    assert msgs[-1] == f"{p}: skipping 996 more lines of these kinds"


def test_read_metrics_skips_a_deeply_nested_line(tmp_path):
    """A JSON line nested 100,000 levels deep (probe 5, metrics-deep-nesting-plot) is skipped with a
    warning like any other bad line, not a RecursionError traceback in plot_metrics."""
    import warnings

    from megatron_topo.metrics import read_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "loss": 2.0}\n' + "[" * 100000 + "]" * 100000 + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = read_metrics(str(p))
    assert [r["step"] for r in recs] == [1]
    assert [str(w.message) for w in caught] == [f"{p}:2: skipping a line nested too deeply to be a record"]
