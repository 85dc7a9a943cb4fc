"""megatron_topo.analysis.emulation.predict: the step-time model of the emulated cluster (8 gloo
ranks on one 2-core CPU, tc-shaped links) against the measured busiest links, the CPU constants
from unshaped rows, the overlap rules and the measured step times (docs/frontier.md §4.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis import perf_model as pm
from megatron_topo.analysis.bench.measure import LEVELS, merge
from megatron_topo.analysis.emulation import predict as emu
from megatron_topo.config import load_config
from megatron_topo.topology import Topology

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF_PY = os.path.join(REPO, "tools", "predict_perf.py")

# ------------------------------------------------------------------------ emulated cluster
# Measured (step s, unshaped t0 s) of tools/bench_sharding.py on the emulated cluster: 2 nodes x 2
# packages x 2 GCDs, 200/400 Mbit/s, the bench model (4 x 256, seq 128, micro-batch 2 x 4, bf16).
# IDLE: docs/benchmark.md's idle-machine table (10:18-10:43 UTC), engine before 3af3320.
IDLE = {"ddp": (1.67, 1.34), "zero3": (4.45, 2.39), "zeropp": (3.02, 2.79), "mics": (2.94, 1.90), "topo": (2.51, 2.14)}
# OVERLAP: runs/bench_sharding_overlap/results.json (from 12:07 UTC, 2 interleaved rounds), the engine of 3af3320.
OVERLAP = {
    "ddp": (1.392, 1.013),
    "zero3": (4.038, 1.853),
    "zeropp": (2.545, 2.312),
    "mics": (2.618, 1.614),
    "topo": (1.931, 1.831),
}
BENCH_SETS = [
    "num_layers=4",
    "hidden_size=256",
    "num_attention_heads=4",
    "seq_length=128",
    "max_position_embeddings=128",
    "train_micro_batch_size_per_gpu=2",
    "gradient_accumulation_steps=4",
    "precision=bf16",
]


def emulated_setup():
    cfg = load_config(
        [os.path.join(REPO, "configs/tiny.yml"), os.path.join(REPO, "configs/emulated_cpu.yml")], BENCH_SETS
    )
    return pm.Shape.from_config(cfg.model), Topology(8, 2, 2), cfg.system


def predict_emulated(table, step_overlap, overlap="engine"):
    shape, topo, system = emulated_setup()
    cpu = emu.calibrate_cpu(shape, topo, 2, 4, table["ddp"][1], {p: table[p][1] for p in ("topo", "zeropp")})
    return {
        p: emu.estimate_emulated(
            shape, pm.preset_plan(p, topo), topo, system, 2, 4, cpu, overlap=overlap, step_overlap=step_overlap
        )
        for p in table
    }, cpu


# busiest package NIC and intra-node link, MB per step on the wire (L2, ~4 % TCP/IP headers), from
# runs/bench_sharding_overlap/results.json (busiest_nic_bytes, busiest_intra_node_link_bytes)
BUSIEST_MB = {
    "ddp": (12.6, 12.6),
    "zero3": (50.3, 50.4),
    "zeropp": (14.8, 30.9),
    "mics": (3.6, 85.3),
    "topo": (9.0, 12.9),
    "paro_iig": (5.4, 85.3),
}


@pytest.mark.parametrize("strategy", sorted(BUSIEST_MB))
def test_gloo_wire_model_matches_the_measured_busiest_links(strategy):
    shape, topo, _ = emulated_setup()
    plan = pm.preset_plan(strategy, topo)
    total: dict = {}
    for c in pm.plan_collectives(shape.params, plan, topo):
        for k, v in emu.gloo_link_bytes(c, plan, topo).items():
            total[k] = total.get(k, 0.0) + v * (4 if c.per_micro_batch else 1)
    for i, kind in enumerate(("nic", "node")):
        model = max(v for k, v in total.items() if k[1] == kind) / 1e6
        assert model * 1.04 == pytest.approx(BUSIEST_MB[strategy][i], rel=0.06), (kind, model)


def test_quantized_elements_by_hand():
    shape, topo, _ = emulated_setup()
    psi = shape.params
    e = emu.quant_elements(psi, pm.preset_plan("topo", topo), topo)  # INT8 pair gather, INT8 secondary, INT4 a2a
    assert e == {"forward": pytest.approx(psi / 2 + psi), "backward": pytest.approx(psi + 2 * psi), "step": 0.0}
    e = emu.quant_elements(psi, pm.preset_plan("zeropp", topo), topo)  # + the 2-hop's requantize of 1/P
    assert e == {
        "forward": pytest.approx(psi / 8 + psi),
        "backward": pytest.approx(psi + 2 * psi + 2 * psi / 4),
        "step": 0.0,
    }
    for p in ("ddp", "zero3", "mics"):
        assert emu.quant_elements(psi, pm.preset_plan(p, topo), topo) == {"forward": 0.0, "backward": 0.0, "step": 0.0}
    e = emu.quant_elements(psi, pm.Plan("x", 2, 4, 8, 2, 8, 16, 16), topo)  # bf16 secondary, bf16 gradients
    assert e == {"forward": pytest.approx(psi / 2 + psi), "backward": 0.0, "step": 0.0}
    e = emu.quant_elements(psi, pm.Plan("x", 2, 4, 8, None, 8, 16, 8), topo)  # no secondary: gather again
    assert e == {"forward": pytest.approx(1.5 * psi), "backward": pytest.approx(1.5 * psi + 2 * psi), "step": 0.0}
    # once per step (unit.py): the INT8 combine quantizes the psi/g shard and sums psi/g of pieces
    # (o = W: no gather of the sums); the INT8 publish quantizes psi/o and dequantizes psi/w
    e = emu.quant_elements(psi, pm.preset_plan("topo", topo, combine_bits=8, publish_bits=8), topo)
    assert e["step"] == pytest.approx(2 * psi / 4 + psi / 8 + psi / 2)
    # mics (o = 4 < W): the summed psi/W slice is requantized and the psi/g shard dequantized again;
    # error feedback dequantizes the psi/g shard once more for its residual
    e = emu.quant_elements(psi, pm.preset_plan("mics", topo, combine_bits=8, error_feedback=True), topo)
    assert e["step"] == pytest.approx(3 * psi / 4 + psi / 8 + psi / 4)


def test_cpu_constants_come_from_the_unshaped_rows():
    preds, cpu = predict_emulated(IDLE, step_overlap=False)
    assert preds["ddp"]["unshaped_s"] == pytest.approx(IDLE["ddp"][1])  # the FLOP rate is ddp's, by construction
    _, _, system = emulated_setup()
    assert cpu.flops / 1e12 == pytest.approx(0.01757, rel=2e-3)  # the idle table's rate (docs/frontier.md §4.1)
    assert 1e-9 < cpu.quant_s_per_element < 1e-7
    # one least-squares constant for both quantized presets: neither is reproduced exactly
    assert preds["topo"]["unshaped_s"] > IDLE["topo"][1] and preds["zeropp"]["unshaped_s"] < IDLE["zeropp"][1]


@pytest.mark.parametrize("table,step_overlap", [(IDLE, False), (OVERLAP, True)], ids=["idle", "overlap"])
@pytest.mark.parametrize("strategy", ["zero3", "zeropp", "mics", "topo", "ddp"])
def test_emulated_step_time_within_25_percent(table, step_overlap, strategy):
    preds, _ = predict_emulated(table, step_overlap)
    err = preds[strategy]["step_s"] / table[strategy][0] - 1
    assert abs(err) <= 0.25, f"{strategy}: predicted {preds[strategy]['step_s']:.2f} s, measured {table[strategy][0]} s"


def test_emulated_step_collectives_do_their_own_cpu_work_on_the_wire():
    """ddp at 1 micro-batch: the all-reduce starts with each unit's gradient (no reduction: lag 0)
    and its own CPU work (gloo's copying, ring-step calls) runs while its bytes are on the wire,
    so the step is forward + the pipeline of (backward + that work) with the link + the optimizer;
    and no plan's prediction exceeds the no-overlap bound t0 + links (the model before this rule put
    ddp's and topo's 1-micro-batch steps above it)."""
    from megatron_topo.analysis.perf_model.step import _pipeline

    shape, topo, system = emulated_setup()
    cpu = emu.CpuRates(4.3e10, 0.84, 4e-9, 9e-4, 5e-8)
    plan = pm.preset_plan("ddp", topo)
    e = emu.estimate_emulated(shape, plan, topo, system, 2, 1, cpu)
    cs, link = e["cpu_s"], e["net_s"]["combine"]
    own = cs["transport"]["combine"] + cs["step_calls"]["combine"]
    want = cs["forward"] + _pipeline(cs["backward"] + own, link, shape.units) + cs["step"]
    assert e["step_s"] == pytest.approx(max(e["unshaped_s"], want))
    assert e["step_s"] < e["unshaped_s"] + link - min(own, link) * 0.9
    for p in ("ddp", "zero1", "zero2", "zero3", "zeropp", "mics", "topo", "paro_iig"):
        for k in (1, 2, 4, 8):
            for q in ({}, {"combine_bits": 8, "publish_bits": 8}):
                try:
                    plan = pm.preset_plan(p, topo, **q)
                except ValueError:
                    continue
                got = emu.estimate_emulated(shape, plan, topo, system, 2, k, cpu)["step_s"]
                bound = emu.estimate_emulated(shape, plan, topo, system, 2, k, cpu, overlap="serial")["step_s"]
                assert got <= bound * (1 + 1e-9), (p, k, q, got, bound)


def test_stack_overhead_is_fitted_from_unshaped_steps_and_added_in_series():
    """Another implementation of a plan (PyTorch FSDP2 in the benchmark): one constant, its CPU
    time per second of our modelled CPU time, recovered from its unshaped steps and added to the
    predicted step in series."""
    shape, topo, system = emulated_setup()
    cpu = emu.CpuRates(4.3e10, 0.84, 4e-9, 9e-4, 5e-8)
    plan = pm.preset_plan("zero3", topo)
    rows = [
        (plan, k, emu.estimate_emulated(shape, plan, topo, system, 2, k, cpu, stack_overhead=0.7)["unshaped_s"])
        for k in (1, 2, 4, 8)
    ]
    assert emu.fit_stack_overhead(shape, topo, 2, rows, cpu) == pytest.approx(0.7)
    ours = emu.estimate_emulated(shape, plan, topo, system, 2, 2, cpu)
    theirs = emu.estimate_emulated(shape, plan, topo, system, 2, 2, cpu, stack_overhead=0.7)
    assert theirs["step_s"] == pytest.approx(ours["step_s"] + 0.7 * ours["unshaped_s"])


def test_emulated_alternative_rules_as_documented():
    """docs/frontier.md §4.1: charging gloo's transport to each collective ("store_forward") also
    stays within 25%; adding everything up ("serial") misses MiCS, which hides half its traffic."""
    for table, so in ((IDLE, False), (OVERLAP, True)):
        sf, _ = predict_emulated(table, so, overlap="store_forward")
        assert all(abs(sf[p]["step_s"] / table[p][0] - 1) <= 0.25 for p in table)
        serial, _ = predict_emulated(table, so, overlap="serial")
        assert serial["mics"]["step_s"] / table["mics"][0] - 1 > 0.25
    with pytest.raises(ValueError, match="overlap"):
        predict_emulated(IDLE, False, overlap="magic")


def test_emulated_cli(tmp_path):
    _, topo, _ = emulated_setup()
    cmd = "python train.py configs/tiny.yml " + " ".join(f"--set {s}" for s in BENCH_SETS)
    rows = [
        {
            "series": "main",
            "strategy": s,
            "kind": "train",
            "world_size": 8,
            "gpus_per_node": 2,
            "gcds_per_gpu": 2,
            "inter_node_rate_bps": 200000000,
            "intra_node_rate_bps": 400000000,
            "command": cmd,
            "step_time_s": m,
            "unshaped_step_time_s": t0,
        }
        for s, (m, t0) in OVERLAP.items()
    ]
    rows.append({"strategy": "fsdp2_full", "step_time_s": 5.0, "command": cmd})  # not a plan: skipped
    path = tmp_path / "results.json"
    path.write_text(json.dumps(rows))
    r = subprocess.run(
        [sys.executable, PERF_PY, "--emulated", str(path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "predicted s" in r.stdout and "topo" in r.stdout and "fsdp2" not in r.stdout
    r = subprocess.run(
        [sys.executable, PERF_PY, "--emulated", str(path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    data = json.loads(r.stdout)
    preds, _ = predict_emulated(OVERLAP, step_overlap=True)
    assert [x["strategy"] for x in data["rows"]] == ["zero3", "zeropp", "mics", "topo", "ddp"]
    for x in data["rows"]:
        assert x["predicted_s"] == pytest.approx(preds[x["strategy"]]["step_s"])
    path.write_text(json.dumps([x for x in rows if x["strategy"] != "ddp"]))
    r = subprocess.run(
        [sys.executable, PERF_PY, "--emulated", str(path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "ddp" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_accumulation_report_renders_model_and_fsdp2_constants():
    """The accumulation series' report (bench_sharding --series accum) on rows whose measured and
    unshaped steps come from the model itself: the fitted constants and the FSDP2 constant are
    stated, every cell's error is +0%, auto is compared with the fastest preset."""
    import dataclasses

    from megatron_topo.analysis.emulation import accum_report

    shape, topo, system = emulated_setup()
    cpu = emu.CpuRates(3e10, 1.7, 2e-9, 1.2e-3, 3e-9)
    plans = {
        "ddp": pm.preset_plan("ddp", topo),
        "topo": pm.preset_plan("topo", topo),
        "zeropp": pm.preset_plan("zeropp", topo),
        "mics": pm.preset_plan("mics", topo),
        "zero3": pm.preset_plan("zero3", topo),
        "fsdp2_full": pm.preset_plan("zero3", topo),
        "auto": pm.preset_plan("topo", topo),
    }
    rows = []
    for s, plan in plans.items():
        over = 0.5 if s == "fsdp2_full" else 0.0
        for k in (1, 2, 4):
            e = emu.estimate_emulated(shape, plan, topo, system, 2, k, cpu, stack_overhead=over)
            rows.append(
                {
                    "ok": True,
                    "series": "accum",
                    "cluster": "frontier",
                    "strategy": s,
                    "accum": k,
                    "kind": "fsdp" if s.startswith("fsdp") else "train",
                    "plan": dataclasses.asdict(plan),
                    "world_size": 8,
                    "gcds_per_gpu": 2,
                    "gpus_per_node": 2,
                    "inter_node_rate_bps": 200e6,
                    "intra_node_rate_bps": 400e6,
                    "step_time_s": e["step_s"],
                    "timed_s": [e["step_s"]],
                    "unshaped_step_time_s": e["unshaped_s"],
                    "quant_s": 0.0,
                    "lower_bound_s": 1.0,
                    "auto_choice": "chose topo (w 2, g 4, os 8)" if s == "auto" else None,
                    "auto_trials": (
                        f"preset auto: timed 2 plans modelled within 25% of the fastest (median of "
                        f"3 steps, slowest rank): topo 0.{k}1 s (model 0.3); zeropp 0.{k}2 s "
                        f"(model 0.31); chose topo"
                    )
                    if s == "auto"
                    else None,
                }
            )
    meta = {
        "model": "configs/tiny.yml",
        "model_set": [x for x in BENCH_SETS if "accumulation" not in x],
        "clusters": {"frontier": "2 x 2 x 2"},
    }
    md = accum_report.render(rows, meta, REPO)
    assert "30.00 GFLOP/s per rank, 1.70 GB/s of gloo copying" in md
    assert "fsdp2_full 1.50x our engine's modelled CPU time" in md
    for s in plans:
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {s} | ") and "/" in ln)
        assert line.count("(+0%)") + line.count("(-0%)") == 3, line
    assert "| 1 | topo " in md
    best = {k: min(r["step_time_s"] for r in rows if r["accum"] == k and r["strategy"] != "auto") for k in (1, 2, 4)}
    for r in rows:  # auto vs the fastest preset, per cell
        if r["strategy"] == "auto":
            assert f"(= topo) | {r['step_time_s'] / best[r['accum']]:.2f}x" in md, r["accum"]
    for k in (1, 2, 4):  # what auto timed before training, per cell
        assert f"- {k}: topo 0.{k}1 s (model 0.3); zeropp 0.{k}2 s (model 0.31); chose topo" in md
    # pooled rounds whose timing chose differently name both choices
    auto1 = next(r for r in rows if r["strategy"] == "auto" and r["accum"] == 1)
    auto1["auto_choices"] = ["chose topo", "chose zeropp+combine_bits=8"]
    assert "| topo / zeropp+combine_bits=8 | " in accum_report.render(rows, meta, REPO)  # no "= topo" twin
    # the rounds of one run: merge names every round's choice
    rounds = [dict(auto1, auto_choice=c, ok=True) for c in ("chose topo", "chose zeropp+combine_bits=8", "chose topo")]
    for r in rounds:
        r.pop("auto_choices")
        r.update(step_times_s=[0.4], peak_rss_bytes=1, tokens_per_step=1, **{f"comm_bytes_{x}": 0 for x in LEVELS})
    assert merge(rounds, None)["auto_choices"] == ["chose topo", "chose zeropp+combine_bits=8"]
