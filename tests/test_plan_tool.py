"""tools/plan.py and the memory side of megatron_topo.analysis.perf_model, against docs/design.md §4.10's formulas
(written out here by hand) and the ZeRO-topo paper's worked example (§II-A: on 16 GCDs of 64 GiB,
model states alone allow about 68.7 B parameters under ZeRO-3 and about 55 B under ZeRO++)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis import perf_model as pm
from megatron_topo.commands import plan as tool
from megatron_topo.config import SystemConfig, TopologyConfig, load_config
from megatron_topo.topology import Topology
from megatron_topo.zero_topo import layout as L
from megatron_topo.zero_topo.sharding import PRESETS, validate_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_PY = os.path.join(REPO, "tools", "plan.py")
GIB = 2**30
PSI_20B = 20_554_567_680  # GPT-NeoX-20B


def _plan_json(nodes, *extra):
    args = tool.parse_args(
        [
            "--model",
            os.path.join(REPO, "configs/20B.yml"),
            "--system",
            os.path.join(REPO, "configs/frontier.yml"),
            "--nodes",
            str(nodes),
            *extra,
        ]
    )
    return tool.run(args)


def frontier(nodes) -> Topology:
    return Topology(world_size=8 * nodes, gcds_per_gpu=2, gpus_per_node=4)


def test_20b_parameter_count():
    cfg = load_config([os.path.join(REPO, "configs/20B.yml")])
    assert pm.Shape.from_config(cfg.model).params == PSI_20B
    cfg = load_config([os.path.join(REPO, "configs/10B.yml")])
    assert abs(pm.Shape.from_config(cfg.model).params / 1e9 - 10.08) < 0.01


def test_paper_example_16_gcds():
    r = _plan_json(2, "--convention", "paper")
    assert r["gcds"] == 16
    best = {p["preset"]: p["max_params"] for p in r["presets"]}
    assert best["zero3"] == pytest.approx(68.7e9, rel=0.01)
    assert best["zeropp"] == pytest.approx(55e9, rel=0.01)
    # exactly: 64 GiB / (16/16 bytes) and 64 GiB / (16/16 + 2/8 bytes)
    assert best["zero3"] == pytest.approx(64 * GIB / 1.0)
    assert best["zeropp"] == pytest.approx(64 * GIB / 1.25)
    for name, target in pm.PAPER_MAX_PARAMS_16_GCDS.items():
        assert best[name] == pytest.approx(target, rel=0.01)


@pytest.mark.parametrize("nodes", [1, 2, 48])
def test_memory_matches_design_formulas(nodes):
    """docs/design.md §4.10 (ZeRO-topo Tables V-VI), N nodes x P=8 GCDs, paper dtypes."""
    psi, P, N = float(PSI_20B), 8, nodes
    NP = N * P
    topo = frontier(nodes)
    expect = {  # (weights incl. secondary, gradients, optimizer)
        "zero3": (2 * psi / NP, 2 * psi / NP, 12 * psi / NP),
        "zeropp": (2 * psi / NP + 2 * psi / P, 2 * psi / NP, 12 * psi / NP),
        "topo": (2 * psi / 2 + psi / 2, 2 * psi / P, 12 * psi / NP),
        "mics": (2 * psi / P, 2 * psi / P, 12 * psi / P),
        "ddp": (2 * psi, 2 * psi, 12 * psi),
        "zero1": (2 * psi, 2 * psi, 12 * psi / NP),
        "zero2": (2 * psi, 2 * psi / NP, 12 * psi / NP),
    }
    for preset, (w, g, o) in expect.items():
        m = pm.model_state_memory(psi, pm.preset_plan(preset, topo))
        assert m.weights + m.secondary == pytest.approx(w), preset
        assert m.gradients == pytest.approx(g), preset
        assert m.optimizer == pytest.approx(o), preset
    sec8 = pm.model_state_memory(psi, pm.preset_plan("topo", topo, secondary_degree=8))
    assert sec8.weights + sec8.secondary == pytest.approx(2 * psi / 2 + psi / 8)  # Table V, Sec-Degree=8


def test_topo_weight_memory_does_not_shrink_with_scale():
    """Table V: topo's weight memory (1.5 psi with the pair secondary) is fixed; ZeRO-3's shrinks."""
    psi = float(PSI_20B)
    topo_w = {n: pm.model_state_memory(psi, pm.preset_plan("topo", frontier(n))) for n in (1, 6, 48)}
    assert {round(m.weights + m.secondary) for m in topo_w.values()} == {round(1.5 * psi)}
    z3 = [pm.model_state_memory(psi, pm.preset_plan("zero3", frontier(n))).weights for n in (1, 6, 48)]
    assert z3[0] > z3[1] > z3[2]


def test_engine_convention_counts_fp32_gradients_and_int8_secondaries():
    psi, topo = float(PSI_20B), frontier(48)
    zpp = pm.model_state_memory(psi, pm.preset_plan("zeropp", topo), "engine")
    assert zpp.secondary == pytest.approx(psi / 8)  # INT8 over the node, as megatron_topo keeps it
    assert zpp.gradients == pytest.approx(4 * psi / 384)
    t = pm.model_state_memory(psi, pm.preset_plan("topo", topo), "engine")
    assert t.gradients == pytest.approx(4 * psi / 8)
    with pytest.raises(ValueError, match="convention"):
        pm.model_state_memory(psi, pm.preset_plan("topo", topo), "bogus")


def test_max_params_and_reserve():
    r0 = _plan_json(2, "--convention", "paper")
    r8 = _plan_json(2, "--convention", "paper", "--reserve-gib", "8")
    a = {p["preset"]: p["max_params"] for p in r0["presets"]}
    b = {p["preset"]: p["max_params"] for p in r8["presets"]}
    assert b["zero3"] == pytest.approx(a["zero3"] * 56 / 64)
    topo = pm.preset_plan("topo", frontier(2))
    # topo on 16 GCDs: 2/2 + 1/2 + 2/8 + 12/16 = 2.5 bytes per parameter
    assert pm.max_params(64 * GIB, topo) == pytest.approx(64 * GIB / 2.5)
    fits = {p["preset"]: p["fits"] for p in r0["presets"]}
    assert fits["zero3"] and fits["topo"] and not fits["ddp"]


def test_rank0_groups_match_layout():
    for W, w, g, o, P in ((16, 2, 8, 16, 8), (384, 2, 8, 384, 8), (64, 8, 32, 64, 8), (48, 1, 1, 48, 8)):
        assert list(pm._block0(w)) == L.blocks(W, w)[0]
        assert list(pm._replicas0(W, g)) == L.strided(W, g)[0]
        assert list(pm._post_gather0(w, o)) == L.post_gather_groups(W, w, o)[0]
        if g > P:
            assert list(pm._two_hop0(g, P)) == L.two_hop_peer_groups(W, g, P)[0]


def test_legal_plans_are_legal_and_cover_presets():
    topo = frontier(2)
    plans = pm.legal_plans(topo)
    for p in plans:
        validate_plan(p, topo)
        w, g, o = p.factors
        assert g % w == 0 and o % g == 0
    keys = {
        (
            p.factors,
            p.secondary_degree,
            p.weight_bits,
            p.secondary_bits if p.secondary_degree else 16,
            p.grad_bits,
            p.inter_node_reduce,
        )
        for p in plans
    }
    for name in PRESETS:
        q = pm.preset_plan(name, topo)
        key = (
            q.factors,
            q.secondary_degree,
            q.weight_bits,
            q.secondary_bits if q.secondary_degree else 16,
            q.grad_bits,
            q.inter_node_reduce,
        )
        assert key in keys, name


def test_search_respects_memory_and_beats_presets():
    cfg = load_config([os.path.join(REPO, "configs/20B.yml"), os.path.join(REPO, "configs/frontier.yml")])
    shape, topo, system = pm.Shape.from_config(cfg.model), frontier(2), cfg.system
    limit = 40 * GIB
    found = pm.search_plans(shape, topo, system, 1, 4, memory_limit=limit)
    assert found
    for plan, _est in found:
        assert pm.model_state_memory(shape.params, plan).total <= limit
    times = [e.step_s for _, e in found]
    assert times[0] <= min(times) * 1.006  # fastest first (0.5% buckets tie, broken by memory)
    for name in PRESETS:
        plan = pm.preset_plan(name, topo)
        if pm.model_state_memory(shape.params, plan).total <= limit:
            preset_t = pm.estimate_step(shape, plan, topo, system, 1, 4).step_s
            assert times[0] <= preset_t * 1.006, name


def test_search_on_a_fast_custom_system_prefers_plain_sharding():
    """With free communication every fitting plan ties on compute; the least memory wins."""
    fast = SystemConfig(
        name="free",
        bw_intra_gpu_gbs=1e9,
        bw_intra_node_gbs=1e9,
        bw_inter_node_gbs=1e9,
        latency_intra_gpu_us=0,
        latency_intra_node_us=0,
        latency_inter_node_us=0,
        hbm_bw_gbs=1e12,
    )
    shape = pm.Shape(8, 512, 256, 1024)
    topo = pm.topology_for(16, TopologyConfig(gcds_per_gpu=2, gpus_per_node=4))
    best_plan, best = pm.search_plans(shape, topo, fast, 1, 1)[0]
    assert best_plan.factors == (16, 16, 16) and best_plan.secondary_degree is None


def test_cli_table_and_json():
    cmd = [sys.executable, PLAN_PY, "--model", "configs/20B.yml", "--system", "configs/frontier.yml", "--nodes", "2"]
    r = subprocess.run(cmd + ["--convention", "paper"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "zero3" in r.stdout and "68.7" in r.stdout and "55.0" in r.stdout and "fastest plans" in r.stdout
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)  # default: engine convention
    assert r.returncode == 0, r.stderr
    assert "engine convention" in r.stdout and "52.66" in r.stdout  # topo's states on 16 GCDs (= --dry-run)
    r = subprocess.run(cmd + ["--json", "--top", "3"], cwd=REPO, capture_output=True, text=True, timeout=60)
    data = json.loads(r.stdout)
    assert len(data["best"]) == 3 and data["fitting_plans"] <= data["searched_plans"]


@pytest.mark.parametrize(
    "args,msg", [(["--nodes", "0"], "--nodes"), (["--nodes", "2", "--model", "nope.yml"], "nope.yml")]
)
def test_cli_bad_input(args, msg):
    base = {"--model": "configs/20B.yml", "--system": "configs/frontier.yml"}
    for k in ("--model",):
        if k in args:
            base.pop(k)
    cmd = [sys.executable, PLAN_PY] + [x for kv in base.items() for x in kv] + args
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr


def test_full_frontier_search_does_not_hang():
    """9,408 nodes (all of Frontier): node-level factors are log-spaced and the per-topology work is
    cached, so the search is seconds, not the tens of minutes a full divisor walk took."""
    cmd = [
        sys.executable,
        PLAN_PY,
        "--model",
        "configs/20B.yml",
        "--system",
        "configs/frontier.yml",
        "--nodes",
        "9408",
        "--json",
        "--top",
        "1",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-1000:]
    data = json.loads(r.stdout)
    assert data["gcds"] == 75264 and 0 < data["fitting_plans"] <= data["searched_plans"] < 50_000
    factors = {p["plan"]["optimizer_factor"] for p in data["presets"]}
    assert 75264 in factors  # the world is always a candidate
