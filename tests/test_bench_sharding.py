"""tools/bench_sharding.py (megatron_topo.analysis.bench): the volume formulas it checks against, its
reports, one benchmark row on an emulated 2-node cluster (skipped without the privileges to create
namespaces) and, with ``-m slow``, the full benchmark."""

import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis import formulas
from megatron_topo.analysis.bench import report, runs
from megatron_topo.analysis.emulation import cluster as C
from megatron_topo.commands import bench_sharding
from megatron_topo.topology import Topology

from . import volume_cases as V

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "bench_sharding.py")
PY = sys.executable
_WHY = C.check_privileges()
needs_netns = pytest.mark.skipif(_WHY is not None, reason=f"cannot create network namespaces: {_WHY}")


@pytest.mark.parametrize("kind", list(V.CASES))
def test_formulas_equal_the_engine_volume_tests(kind):
    """The bench's generic docs/design.md §4.8 formula reproduces tests/test_engine_volumes.py's table for
    every preset (which that test checks against the engine's counters)."""
    topo = Topology(V.W, V.G, V.P // V.G)
    kw = dict(V.CASES[kind])
    plan = formulas.plan_for(kw.pop("preset"), topo, kw, quant_block_size=V.BW, grad_quant_block_size=V.BG)
    Ls = [4096, 8192 * 3, 2048 * 5]
    got = formulas.expected_bytes_per_rank(plan, topo, Ls, V.MICRO)
    assert formulas.check(got, V.expected(kind, Ls), abs_tol=1e-6)[0] == "OK"


def test_formulas_scale_like_the_design_table():
    """Four nodes of two ranks: ZeRO-3 sends ~3M(d-1)/d per micro-batch across nodes; topo's
    inter-node bytes do not grow with the number of micro-batches; ZeRO++'s 2-hop second hop
    crosses nodes with 1/P of the INT4 gradient."""
    topo = Topology(8, 2, 1)
    L = 8 * 256 * 100
    M = 2 * L
    z3 = formulas.expected_bytes_per_rank(formulas.plan_for("zero3", topo), topo, [L, L], 4)
    assert z3["inter_node"] == pytest.approx(4 * (3 * M + 2 * M) * 7 / 8)  # last unit not re-gathered
    topo_plan = formulas.plan_for("topo", topo, quant_block_size=256, grad_quant_block_size=256)
    t1 = formulas.expected_bytes_per_rank(topo_plan, topo, [L], 1)["inter_node"]
    t8 = formulas.expected_bytes_per_rank(topo_plan, topo, [L], 8)["inter_node"]
    assert t1 == t8 > 0
    zpp_plan = formulas.plan_for("zeropp", topo, quant_block_size=256, grad_quant_block_size=256)
    zpp = formulas.expected_bytes_per_rank(zpp_plan, topo, [L], 1)
    fwd = L * 7 / 8 + 4 * L / 256 * 7 / 8
    hop2 = (L / 2 / 2) * 3 / 4 + 4 * (L / 2) / 256 * 3 / 4
    assert zpp["inter_node"] == pytest.approx(fwd + hop2)


def test_unit_lengths_pad_to_whole_blocks_per_shard():
    from megatron_topo.config import ModelConfig

    mc = ModelConfig(num_layers=2, hidden_size=64, seq_length=32)
    topo = Topology(8, 2, 2)
    plan = formulas.plan_for("topo", topo, quant_block_size=256, grad_quant_block_size=256)
    Ls = formulas.unit_lengths(mc, plan, 8)
    raw = formulas.raw_unit_lengths(mc)
    assert len(Ls) == len(raw) == 4
    assert all(L % (8 * 256) == 0 and 0 <= L - n < 8 * 256 for L, n in zip(Ls, raw))


def test_dry_run_lists_every_strategy(capsys):
    assert bench_sharding.main(["--dry-run", "--series", "main", "scaling", "--scaling-nodes", "1", "2"]) == 0
    out = capsys.readouterr().out
    for s in runs.ALL_STRATEGIES:
        assert f"2x2x2 {s}:" in out
    assert "zero_topo.secondary_degree=4" in out  # topo_sec8 = the node's ranks on this topology
    assert "tools/fsdp_baseline.py" in out and "--mode hsdp" in out
    assert "[scaling] 1x1x2 zero3" in out and "[scaling] 2x1x2 topo" in out


def _row(s, t, inter, **kw):
    r = {
        "series": "main",
        "strategy": s,
        "ok": True,
        "step_time_s": t,
        "tokens_per_sec": 1000 / t,
        "tokens_per_step": 1000,
        "comm_bytes_inter_node": inter,
        "formula_bytes_inter_node": inter,
        "wire_bytes_inter_node": inter / 2,
        "comm_bytes_intra_node": 0,
        "wire_bytes_intra_node": 0,
        "comm_bytes_intra_gpu": 0,
        "wire_bytes_intra_gpu": 0,
        "busiest_nic_bytes": inter / 8,
        "peak_rss_bytes": 2**29,
        "formula_check": "OK",
        "unshaped_step_time_s": t / 2,
        "lower_bound_s": t * 0.8,
        "lower_bound_overlap_s": t / 2,
        "nodes": 2,
    }
    r.update(kw)
    return r


def test_reports_ratios_table_and_plots(tmp_path):
    rows = [
        _row("zero3", 4.0, 5e8),
        _row("zeropp", 3.0, 1e8),
        _row("topo", 2.0, 3e7),
        {"series": "main", "strategy": "ddp", "ok": False, "error": "exit 1", "nodes": 2},
    ]
    md = report.table_main(rows)
    topo_line = next(ln for ln in md.splitlines() if ln.startswith("| topo "))
    assert "| 2.00x | 1.50x |" in topo_line
    assert "failed: exit 1" in md
    scal = [
        dict(_row(s, t, 1e7), series="scaling", nodes=n)
        for s, n, t in (("zero3", 1, 1.0), ("zero3", 2, 2.0), ("topo", 1, 1.0), ("topo", 2, 1.25))
    ]
    st = report.table_scaling(scal)
    assert "| topo | 1000 | 800 | 0.80 | 0.40 |" in st
    meta = {"model_set": [], "steps": 3, "warmup": 1, "machine": {}, "main_spec": "x", "scaling_spec": "y"}
    report.write_reports(str(tmp_path), rows + scal, meta)
    assert json.loads((tmp_path / "results.json").read_text())[0]["strategy"] == "zero3"
    assert (tmp_path / "results.png").stat().st_size > 1000 and (tmp_path / "scaling.png").exists()
    assert "## Weak scaling" in (tmp_path / "results.md").read_text()


@needs_netns
def test_one_benchmark_row_on_two_emulated_nodes(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run(
        [
            PY,
            TOOL,
            "--strategies",
            "topo",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--gcds-per-gpu",
            "2",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--no-unshaped",
            "--out",
            str(out),
            "--timeout",
            "150",
            "--model-set",
            "num_layers=2",
            "hidden_size=64",
            "seq_length=32",
            "max_position_embeddings=32",
            "train_micro_batch_size_per_gpu=2",
            "gradient_accumulation_steps=2",
            "precision=bf16",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 1
    r = rows[0]
    for key in (
        "strategy",
        "step_time_s",
        "tokens_per_sec",
        "comm_bytes_intra_gpu",
        "comm_bytes_intra_node",
        "comm_bytes_inter_node",
        "peak_rss_bytes",
    ):
        assert key in r, key
    assert r["ok"] and r["tokens_per_sec"] > 0 and r["formula_check"] == "OK"
    assert r["comm_bytes_inter_node"] == r["formula_bytes_inter_node"] > 0
    assert r["wire_bytes_inter_node"] > 0 and r["wire_bytes_intra_gpu"] > 0
    assert len(r["peak_rss_bytes_per_rank"]) == 4
    assert (out / "results.md").exists() and (out / "results.png").exists()
    assert not [n for n in C.list_namespaces() if n.startswith(C.PREFIX + "-")]


@pytest.mark.slow
@needs_netns
def test_full_benchmark(tmp_path):
    """The whole main series (about 15 minutes on 2 cores); every row runs and matches the formulas."""
    out = tmp_path / "bench"
    p = subprocess.run([PY, TOOL, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert {r["strategy"] for r in rows} == set(runs.ALL_STRATEGIES)
    assert all(r["formula_check"].startswith("OK") for r in rows)
