"""megatron_topo.analysis.perf_model: FLOPs, per-level volumes against docs/design.md §4.8's table (written out here by
hand), the alpha-beta time model on arbitrary SystemConfigs, overlap, the comparison with the
ZeRO-topo paper (20B on 384 GCDs); the emulated cluster's model is in tests/test_emulated_model.py.
Targets the honest model does not reach are strict xfails:
they document the gap (docs/frontier.md) and turn red if a model change closes it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from megatron_topo.analysis import perf_model as pm
from megatron_topo.analysis.emulation import predict as emu
from megatron_topo.config import SystemConfig, load_config
from megatron_topo.topology import Topology

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF_PY = os.path.join(REPO, "tools", "predict_perf.py")
PSI = 20_554_567_680.0
M = 2 * PSI


def frontier(nodes) -> Topology:
    return Topology(world_size=8 * nodes, gcds_per_gpu=2, gpus_per_node=4)


def cfg20b():
    return load_config([os.path.join(REPO, "configs/20B.yml"), os.path.join(REPO, "configs/frontier.yml")])


def uniform_system(bw_gbs=1.0, nics=1, latency_us=0.0, **kw) -> SystemConfig:
    return SystemConfig(
        name="test",
        bw_intra_gpu_gbs=bw_gbs,
        bw_intra_node_gbs=bw_gbs,
        bw_inter_node_gbs=bw_gbs,
        nics_per_node=nics,
        latency_intra_gpu_us=latency_us,
        latency_intra_node_us=latency_us,
        latency_inter_node_us=latency_us,
        **kw,
    )


# ----------------------------------------------------------------------------------- FLOPs
def test_flops_formula_by_hand():
    s = pm.Shape(num_layers=2, hidden_size=64, seq_length=32, vocab_size=128)
    fwd = 24 * 3 * 32 * 2 * 64**2 * (1 + 32 / (6 * 64) + 128 / (16 * 2 * 64))
    assert s.forward_flops(3) == pytest.approx(fwd)
    assert s.microbatch_flops(3, recompute=True) == pytest.approx(4 * fwd)
    assert s.microbatch_flops(3, recompute=False) == pytest.approx(3 * fwd)
    assert s.params == 2 * (12 * 64 * 64 + 13 * 64) + 2 * 128 * 64 + 2 * 64
    assert s.units == 4


# --------------------------------------------------------------------------------- volumes
def _vol(preset, nodes, G=1, **over):
    return pm.bytes_per_level(PSI, pm.preset_plan(preset, frontier(nodes), **over), frontier(nodes), G)


def test_volumes_zero3_and_zeropp_48_nodes():
    d = 384
    v = _vol("zero3", 48)
    assert v["inter_node"] == pytest.approx(3 * M * (d - 1) / d)  # "3M per step"
    assert v["intra_node"] == v["intra_gpu"] == 0
    v = _vol("zeropp", 48)
    assert v["inter_node"] == pytest.approx(M / 2 * (d - 1) / d + M / (4 * 8) * 47 / 48)
    assert v["intra_node"] == pytest.approx(M / 2 * 7 / 8 + M / 4 * 7 / 8)


@pytest.mark.parametrize("sec", [2, 8])
def test_volumes_topo_48_nodes(sec):
    v = _vol("topo", 48, secondary_degree=sec)
    bwd = M / 2 * (sec - 1) / sec
    assert v["intra_gpu"] == pytest.approx(M / 2 * 1 / 2 + (bwd if sec == 2 else 0))
    assert v["intra_node"] == pytest.approx(M / 4 * 7 / 8 + (bwd if sec == 8 else 0))
    combine, post = 2 * (M / 8) * 47 / 48, M / 2 * 191 / 192
    assert v["inter_node"] == pytest.approx(combine + post)
    rs = _vol("topo", 48, secondary_degree=sec, inter_node_reduce="reduce_scatter")
    assert rs["inter_node"] == pytest.approx(combine / 2 + post)  # "a reduce-scatter ... half the bytes"


def test_volumes_one_node_and_mics():
    v = _vol("topo", 1)
    assert v["inter_node"] == 0
    assert v["intra_node"] == pytest.approx(M / 4 * 7 / 8 + M / 2 * 3 / 4)  # a2a + post-step gather (d=4)
    v = _vol("mics", 48)
    assert v["intra_node"] == pytest.approx(3 * M * 7 / 8)
    assert v["inter_node"] == pytest.approx(2 * (M / 8) * 47 / 48)
    v = _vol("ddp", 48)
    assert v["inter_node"] == pytest.approx(2 * M * 383 / 384)
    v = _vol("zero1", 48)
    assert v["inter_node"] == pytest.approx(2 * M * 383 / 384 + M * 383 / 384)


def test_cross_node_bytes_of_topo_do_not_grow_with_accumulation():
    for G in (1, 4, 16):
        assert _vol("topo", 48, G)["inter_node"] == pytest.approx(_vol("topo", 48, 1)["inter_node"])
        assert _vol("zero3", 48, G)["inter_node"] == pytest.approx(G * _vol("zero3", 48, 1)["inter_node"])


def test_collective_metadata():
    colls = {c.name: c for c in pm.plan_collectives(PSI, pm.preset_plan("topo", frontier(48)), frontier(48))}
    assert colls["forward_all_gather"].level == "intra_gpu"
    assert colls["grad_reduce"].op == "all_to_all" and colls["grad_reduce"].level == "intra_node"
    c = colls["combine"]
    assert (c.op, c.group_size, c.ranks_per_node, c.groups_per_node, c.level) == ("all_reduce", 48, 1, 8, "inter_node")
    c = colls["post_step_all_gather"]
    assert (c.group_size, c.ranks_per_node, c.groups_per_node) == (192, 4, 2)


# ------------------------------------------------------------------------------------ time
def test_nic_sharing_rules():
    topo, system = frontier(2), uniform_system(bw_gbs=1.0, nics=4)
    colls = {c.name: c for c in pm.plan_collectives(PSI, pm.preset_plan("zero3", topo), topo)}
    world = colls["forward_all_gather"]
    assert pm.bandwidth(world, topo, system, "rank") == pytest.approx(4e9 / 8)  # 8 ranks share 4 NICs
    assert pm.bandwidth(world, topo, system, "ring") == pytest.approx(1e9)  # one ring; capped by the node hop
    comb = {c.name: c for c in pm.plan_collectives(PSI, pm.preset_plan("topo", topo), topo)}["combine"]
    for mode in pm.NIC_SHARING:  # Eq. 5.7: 8 concurrent peer groups -> beta_inter / 8
        assert pm.bandwidth(comb, topo, system, mode) == pytest.approx(4e9 / 8)
    with pytest.raises(ValueError, match="nic_sharing"):
        pm.bandwidth(world, topo, system, "magic")


def test_alpha_beta_on_an_arbitrary_system():
    """The API takes any SystemConfig (e.g. an emulated cluster's measured rates)."""
    topo = frontier(2)
    c = {x.name: x for x in pm.plan_collectives(PSI, pm.preset_plan("zero3", topo), topo)}["grad_reduce"]
    bw_only = uniform_system(bw_gbs=2.0, nics=4)
    assert pm.collective_time(c, topo, bw_only, 10, "rank") == pytest.approx(c.bytes_sent / (8e9 / 8))
    # one world ring per node: the node's 8 GB/s, capped by the 2 GB/s hop inside the node
    assert pm.collective_time(c, topo, bw_only, 10) == pytest.approx(c.bytes_sent / 2e9)
    lat_only = uniform_system(bw_gbs=1e12, nics=4, latency_us=3.0, latency_small_message_us=0.5)
    lat = pm.collective_time(c, topo, lat_only, 10)
    assert lat == pytest.approx(10 * 15 * 3e-6, rel=1e-3)  # units x (d-1) steps x alpha, + ~0 bytes
    # a quantized gather is one collective too (scales packed with the payload): one ring's latency;
    # DeepSpeed's scales go apart, their ring steps at the small-message latency
    q = {x.name: x for x in pm.plan_collectives(PSI, pm.preset_plan("zeropp", topo), topo)}["forward_all_gather"]
    assert pm.collective_time(q, topo, lat_only, 10) == pytest.approx(10 * 15 * 3e-6, rel=1e-3)
    assert pm.collective_time(q, topo, lat_only, 10, separate_scales=True) == pytest.approx(
        10 * 15 * (3e-6 + 0.5e-6), rel=1e-3
    )
    assert pm.collective_time(c, topo, lat_only, 10, separate_scales=True) == pytest.approx(lat)  # 16-bit


def test_free_communication_gives_compute_bound_tflops():
    shape = pm.Shape(44, 6144, 2048, 50432)
    free = uniform_system(bw_gbs=1e12, nics=4, hbm_bw_gbs=1e15, peak_tflops=100.0, compute_efficiency=0.5)
    for preset in ("zero3", "zeropp", "topo", "mics"):
        est = pm.estimate_step(shape, pm.preset_plan(preset, frontier(4)), frontier(4), free, 1, 4)
        assert est.tflops_per_gcd == pytest.approx(50.0, rel=1e-3), preset


def test_overlap_rules():
    shape = pm.Shape(44, 6144, 2048, 50432)
    slow = uniform_system(bw_gbs=5.0, nics=4, hbm_bw_gbs=1e15, peak_tflops=191.5, compute_efficiency=0.4)
    topo = frontier(6)
    on = pm.estimate_step(shape, pm.preset_plan("zero3", topo), topo, slow, 1, 2)
    off = pm.estimate_step(shape, pm.preset_plan("zero3", topo, prefetch=False), topo, slow, 1, 2)
    ag, red, n = on.comm_s["forward_all_gather"], on.comm_s["grad_reduce"], shape.units
    t_f, t_b = on.compute_s / 4, on.compute_s * 3 / 4
    assert on.forward_s == pytest.approx(max(t_f, ag) + ag / n)
    assert on.backward_s == pytest.approx(max(t_b, ag + red) + (ag + red) / n)
    assert off.forward_s == pytest.approx(t_f + ag)
    assert off.step_s > on.step_s
    assert on.step_s == pytest.approx(2 * (on.forward_s + on.backward_s) + on.optimizer_s)  # no step comm


def test_in_flight_bound_is_the_engines():
    import inspect

    from megatron_topo.zero_topo.engine import ZeroTopoEngine

    assert inspect.signature(ZeroTopoEngine).parameters["max_in_flight"].default == pm.REDUCTIONS_IN_FLIGHT


def test_combine_lag_is_the_engines_fixed_point():
    """A unit's combine starts when the reduction REDUCTIONS_IN_FLIGHT units later is launched (a
    point fixed by program position, the same on every rank), immediately without a reduction
    (ddp, zero1)."""
    from megatron_topo.analysis.perf_model.step import combine_lag

    assert combine_lag(0.0) == 0.0
    assert combine_lag(0.25) == combine_lag(5.0) == pm.REDUCTIONS_IN_FLIGHT


def test_two_stage_combine_runs_its_all_gather_after_the_backward():
    """The engine launches a two-stage combine's INT8 all-gather in step() (after backward); the
    model puts that half of the combine there. A single-stage one (optimizer over the world)
    stays under the backward."""
    from megatron_topo.analysis.perf_model.step import combine_tail

    topo = frontier(2)
    system = uniform_system(bw_gbs=0.5, nics=4, hbm_bw_gbs=1e15, peak_tflops=191.5, compute_efficiency=0.4)
    two = pm.preset_plan("ddp", topo, combine_bits=8)
    one = pm.preset_plan("zero1", topo, combine_bits=8)
    assert combine_tail(two, topo) == 0.5 and combine_tail(one, topo) == 0.0
    assert combine_tail(pm.preset_plan("ddp", topo), topo) == 0.0
    shape = pm.Shape(4, 1024, 512, 8192)
    t = pm.estimate_step(shape, two, topo, system, 1, 2)
    assert t.last_backward_s >= t.backward_s + 0.5 * t.comm_s["combine"]


def test_step_overlap_matches_the_engine():
    """The combine of each unit is launched during the last backward REDUCTIONS_IN_FLIGHT units
    after its own (issue 27; from 3af3320 to then once its reduction landed), and each unit's
    post-step gather is waited for at its next forward gather."""
    from megatron_topo.analysis.perf_model.step import combine_lag

    shape = pm.Shape(44, 6144, 2048, 50432)
    topo, n = frontier(6), shape.units
    for bw in (5.0, 0.05):  # combine/post-step gather shorter, then longer, than a pass
        slow = uniform_system(bw_gbs=bw, nics=4, hbm_bw_gbs=1e15, peak_tflops=191.5, compute_efficiency=0.4)
        t = pm.estimate_step(shape, pm.preset_plan("topo", topo), topo, slow, 1, 3)
        C, A = t.comm_s["combine"], t.comm_s["post_step_all_gather"]
        B, F = t.backward_s, t.forward_s
        assert t.step_comm_s == pytest.approx(C + A)
        red = t.comm_s["grad_reduce"]
        k = combine_lag(red) + 1  # the combine starts REDUCTIONS_IN_FLIGHT units after its backward
        assert red > 0 and k == pm.REDUCTIONS_IN_FLIGHT + 1
        assert t.last_backward_s == pytest.approx(max(B + k * C / n, k * B / n + C))
        assert t.first_forward_s == pytest.approx(max(F, A) + min(F, A) / n)
        assert t.step_s == pytest.approx(2 * (F + B) + t.first_forward_s + t.last_backward_s + t.optimizer_s)
        assert t.step_comm_exposed_s == pytest.approx(t.first_forward_s + t.last_backward_s - F - B)
        assert t.step_comm_exposed_s < C + A
        old = pm.estimate_step(shape, pm.preset_plan("topo", topo), topo, slow, 1, 3, step_overlap=False)
        assert old.step_s == pytest.approx(3 * (F + B) + C + A + t.optimizer_s)  # engine before 3af3320
    # a combine on the same level as the backward traffic shares its link: added to that phase
    topo4 = frontier(4)
    plan = pm.Plan("x", 1, 16, 32)  # gradients over 2 nodes: reduction and combine both cross nodes
    slow = uniform_system(bw_gbs=5.0, nics=4, hbm_bw_gbs=1e15, peak_tflops=191.5, compute_efficiency=0.4)
    t = pm.estimate_step(shape, plan, topo4, slow, 1, 2)
    red, C, t_b = t.comm_s["grad_reduce"], t.comm_s["combine"], t.compute_s * 3 / 4
    assert t.last_backward_s == pytest.approx(max(t_b, red + C) + (red + C) / n)


# ------------------------------------------------------------------------- paper comparison
@pytest.fixture(scope="module")
def paper_run():
    """The paper measured DeepSpeed (seed 000 Table IX): the comparison uses that stack."""
    cfg = cfg20b()
    est = pm.predict(cfg, ["zero3", "zeropp", "topo"], [8, 16, 48, 96, 192, 384], stack="deepspeed")
    return est, pm.ratios(est, 384)


def test_scaling_efficiency_matches_paper(paper_run):
    est, _ = paper_run
    eff = pm.scaling_efficiency(est, "topo", 8, 384)
    assert abs(eff - pm.PAPER_TOPO_SCALING_EFFICIENCY) <= 0.05, eff


def test_ordering_and_trends_match_paper(paper_run):
    est, r = paper_run
    t = {(e.preset, e.gcds): e.tflops_per_gcd for e in est}
    assert t[("topo", 384)] > t[("zeropp", 384)] > t[("zero3", 384)]
    assert r["topo/zero3"] > 1.5  # ZeRO-3 is the one hurt most by Frontier's NICs
    for p in ("zero3", "zeropp", "topo"):  # weak scaling never improves per-GCD throughput
        assert t[(p, 384)] <= t[(p, 8)]


def test_topo_over_zero3_within_15_percent(paper_run):
    _, r = paper_run  # 2.12 (-12%)
    assert abs(r["topo/zero3"] / pm.PAPER_20B_384["topo/zero3"] - 1) <= 0.15, r


@pytest.mark.xfail(
    strict=True,
    reason="predicts topo/zeropp = 1.43 (paper 1.71, -16%) with RCCL's step latency at "
    "its seed-004 lower bound (85 us); 1.47 (-14%) at the 1 GB all-gather point (100 us); "
    "see docs/frontier.md",
)
def test_topo_over_zeropp_within_15_percent(paper_run):
    _, r = paper_run
    assert abs(r["topo/zeropp"] / pm.PAPER_20B_384["topo/zeropp"] - 1) <= 0.15, r


def test_zeropp_over_zero3_within_15_percent(paper_run):  # 1.49 (+6%)
    _, r = paper_run
    assert abs(r["zeropp/zero3"] / pm.PAPER_20B_384["zeropp/zero3"] - 1) <= 0.15, r


def test_system_constants_are_documented():
    """Every number in the system files carries its source in a comment."""
    for name in ("frontier.yml", "dgx_a100.yml", "dgx2_v100.yml", "emulated_cpu.yml"):
        lines = open(os.path.join(REPO, "configs", name)).read().splitlines()
        start = lines.index("system:")
        for line in lines[start + 1 :]:
            if not line.startswith("  "):
                break
            key = line.split(":")[0].strip()
            if key and key != "name" and not key.startswith("#"):
                assert "#" in line, f"{name}: {key} has no source comment"
    for mod, words in (
        (pm, ("191.5", "125", "compute_efficiency", "200 GB/s", "50 GB/s", "25 GB/s", "Eq. 5.7", "seed 004")),
        (emu, ("EMULATED_TRANSPORT_GBS", "6.5-7 Gbit/s", "364-381", "179-190", "unshaped step time of ddp")),
    ):
        for word in words:
            assert word in mod.__doc__, (mod.__name__, word)


# -------------------------------------------------------------------------------------- CLI
def test_cli_table_json_and_plot(tmp_path):
    png = tmp_path / "p.png"
    cmd = [
        sys.executable,
        PERF_PY,
        "--model",
        "configs/20B.yml",
        "--system",
        "configs/frontier.yml",
        "--gcds",
        "8,16,384",
    ]
    r = subprocess.run(cmd + ["--plot", str(png)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "topo/zeropp" in r.stdout and "1.71" in r.stdout and "weak-scaling efficiency" in r.stdout
    assert png.stat().st_size > 1000
    r = subprocess.run(cmd + ["--json", "--nic-sharing", "ring"], cwd=REPO, capture_output=True, text=True, timeout=60)
    data = json.loads(r.stdout)
    assert data["gcds"] == [8, 16, 384] and len(data["estimates"]) == 9 and data["nic_sharing"] == "ring"
    r = subprocess.run(cmd[:-1] + ["8,x"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--gcds" in r.stderr


def test_emulated_rates_via_set_override():
    """Later the emulated cluster's rates go in the same way: a system block or --set overrides."""
    cfg = cfg20b()
    fast = dataclasses.replace(
        cfg.system, bw_inter_node_gbs=1000.0, bw_intra_node_gbs=1000.0, latency_inter_node_us=1.0
    )
    base = pm.ratios(pm.predict(cfg, ["zero3", "topo"], [384]), 384)["topo/zero3"]
    quick = pm.ratios(pm.predict(cfg, ["zero3", "topo"], [384], system=fast), 384)["topo/zero3"]
    assert quick < base


def test_quantized_combine_and_publish_in_the_model():
    """combine_bits/publish_bits = 8 halve the 16-bit once-per-step buffers (an INT8
    reduce-scatter replaces the all-reduce when the optimizer shard is the slice: 1/4 of its
    bytes), and the search offers them."""
    psi, topo = 20e9, frontier(48)
    M, W, P = 2 * psi, 384, 8
    base = {c.name: c for c in pm.plan_collectives(psi, pm.preset_plan("topo", topo), topo)}
    q = {
        c.name: c for c in pm.plan_collectives(psi, pm.preset_plan("topo", topo, combine_bits=8, publish_bits=8), topo)
    }
    assert base["combine"].bytes_sent == pytest.approx(2 * (M / P) * (W // P - 1) / (W // P))
    assert q["combine"].bytes_sent == pytest.approx((M / P / 2) * (W // P - 1) / (W // P))
    assert q["post_step_all_gather"].bytes_sent == pytest.approx(base["post_step_all_gather"].bytes_sent / 2)
    mics_q = {c.name: c for c in pm.plan_collectives(psi, pm.preset_plan("mics", topo, combine_bits=8), topo)}
    assert mics_q["combine"].bytes_sent == pytest.approx(2 * (M / P / 2) * (W // P - 1) / (W // P))  # + all-gather
    plans = pm.legal_plans(frontier(2))
    assert any(p.combine_bits == 8 and p.publish_bits == 8 for p in plans)
    assert all(p.grad_bits < 16 for p in plans if p.combine_bits < 16 or p.publish_bits < 16)
