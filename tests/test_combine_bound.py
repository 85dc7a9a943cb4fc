"""At most ``max_combines_in_flight`` units hold cross-replica combine buffers at once (issue 27's
leftover: every unit's INT8 send + receive buffers were alive from the last backward to the
step, about 5 GB for 20B topo). One more combine finishes the oldest first, in launch order, so
the arithmetic is unchanged: bounded runs train bit for bit like unbounded ones."""

import pytest
import torch

from megatron_topo.config import ZeroTopoConfig, load_config
from megatron_topo.zero_topo import engine as engine_mod
from megatron_topo.zero_topo import memory
from megatron_topo.zero_topo.sharding import Plan
from megatron_topo.zero_topo.unit import ShardedUnit

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine, tiny_cfg

WORLD = 8  # Topology(8, 2, 2): 2 nodes of 2 GPUs x 2 GCDs
INT8 = dict(combine_bits=8, quant_block_size=64, grad_quant_block_size=64)
CASES = {
    # optimizer shards over the world = the summed slice: one stage, the fp32 slice is the step's gradient
    "topo_int8": (ZeroTopoConfig(preset="topo", publish_bits=8, **INT8), "fp32"),
    # optimizer shards over the node: the summed INT8 slices are all-gathered (second stage)
    "mics_int8": (ZeroTopoConfig(preset="mics", **INT8), "fp32"),
    "topo_int8_ef": (ZeroTopoConfig(preset="topo", error_feedback=True, **INT8), "fp32"),
    # a 16-bit combine with a bf16 wire copy per unit: bounded the same way
    "topo_bf16": (ZeroTopoConfig(preset="topo"), "bf16"),
}


RUNS = ((0, True), (1, True), (2, True), (2, False))  # (bound, combine launched in the last backward)


def _train(rank, world, zcfg, precision):
    """Every run of RUNS on this rank, one after the other (one process launch)."""
    cfg = tiny_cfg(num_layers=4)
    real_start = ShardedUnit.start_combine
    out = []
    for bound, overlap in RUNS:
        eng = make_engine(rank, world, zcfg, precision=precision, cfg=cfg, max_combines_in_flight=bound)
        alive = []  # units holding combine buffers, after every combine launch

        def counted(u, eng=eng, alive=alive):
            real_start(u)
            alive.append(sum(v.combine_handle is not None and v.combine_holds_buffers for v in eng.units))

        ShardedUnit.start_combine = counted  # this forked rank only
        losses = []
        for step in range(3):
            tot = 0.0
            for m in range(2):
                x, y = batch(step, rank, m, cfg=cfg)
                loss = loss_fn(eng(x), y) / 2
                eng.backward(loss, last_micro_batch=overlap and m == 1)
                tot += loss.item()
            eng.step()
            losses.append(tot)
        ShardedUnit.start_combine = real_start
        params = {k: v.clone() for k, v in eng.full_parameters().items()}
        out.append((losses, params, max(alive), [u.combine_holds_buffers for u in eng.units]))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_bounded_combines_train_bit_exactly_like_unbounded_and_hold_at_most_k(case):
    zcfg, precision = CASES[case]
    for rank, runs in enumerate(run_distributed(_train, WORLD, zcfg, precision)):
        (l0, p0, most0, holds), rest = runs[0], runs[1:]
        assert all(holds), "every unit's combine allocates buffers here"
        assert most0 == len(holds) > 3  # unbounded: every unit's buffers alive at once
        for (bound, overlap), (l1, p1, most, _) in zip(RUNS[1:], rest):
            assert most <= bound, (case, bound, overlap, rank, most)
            assert l1 == l0, (case, bound, overlap, rank)
            assert p1.keys() == p0.keys()
            for k in p0:
                assert torch.equal(p1[k], p0[k]), (case, bound, overlap, rank, k)


def test_the_two_int8_cases_cover_both_combine_shapes():
    """mics_int8 runs the two-stage combine (INT8 all-gather of the summed slices), topo_int8 the
    one-stage one whose fp32 slice is kept as the step's gradient (memory's ``combine_kept``)."""
    from megatron_topo.topology import Topology
    from megatron_topo.zero_topo.sharding import resolve_plan

    topo = Topology(WORLD, 2, 2)
    for case, two_stage in (("mics_int8", True), ("topo_int8", False)):
        plan = resolve_plan(CASES[case][0], topo)
        P = memory.padded_units([10_000], plan, WORLD)[0]
        u = memory.unit_buffers(P, plan, WORLD, "fp32", 4)
        assert (u["combine_stage2"] > 0) == two_stage and (u["combine_kept"] > 0) != two_stage, case


def _unit(numels, plan, world):
    sizes = set(memory.padded_units(numels, plan, world))
    assert len(sizes) == 1
    return memory.unit_buffers(sizes.pop(), plan, world, "fp32", 4)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_estimate_charges_k_units_two_stage_combines(k):
    """n units of one size, INT8 two-stage combine (QuantizedCombine): per unit the first stage
    holds send + receive (the quantized gradient shard, q(G) each) and the fp32 slice (G/r), the
    second the quantized slice and the gathered shard; the estimate's step peak is k - 1 units in
    flight beside the one whose second stage goes out (or is finished); the unbounded one (0)
    charges every unit's."""
    plan = Plan("topo", 2, 4, 4, None, combine_bits=8, grad_quant_block_size=64, quant_block_size=64)
    world, n, r = 8, 6, 2
    numels = [40_000] * n
    u = _unit(numels, plan, world)
    G = memory.padded_units(numels, plan, world)[0] // 4
    q = lambda m: memory._q(m, 8, 64)  # noqa: E731
    A, B = 2 * q(G) + G // r * 4, G // r * 4 + q(G // r) + q(G)
    assert (u["combine"], u["combine_advanced"], u["combine_kept"]) == (A, B, 0)
    assert u["combine_advance_peak"] == max(A + q(G), B + q(G // r))
    assert u["combine_finish_peak"] == B + q(G)
    publish = n * u["publish"] + u["publish_tmp"]  # no secondary here, no gradient kept
    for bound in (k, 0):
        m = bound or n
        b = memory.buffer_bytes(numels, plan, world, "fp32", 4, max_combines=bound)
        in_step = max((m - 1) * max(A, B) + u["combine_advance_peak"], (m - 1) * B + u["combine_finish_peak"])
        assert b["step"] == max(in_step, publish) + memory.STEP_SCALARS, bound
        finishing = (m - 1) * A + max(u["combine_advance_peak"], u["combine_finish_peak"]) if m < n else 0
        assert b["combines"] == max(m * A + q(G), finishing), bound
    assert memory.buffer_bytes(numels, plan, world, "fp32", 4, max_combines=n) == b


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_estimate_keeps_the_finished_one_stage_slices(k):
    """One-stage INT8 combine: a finished combine keeps its fp32 slice (the step's gradient), so
    the estimate charges every finished unit's slice, k units' first stage and one unpack."""
    plan = Plan("zero3", 8, 4, 8, None, combine_bits=8, grad_quant_block_size=64, quant_block_size=64)
    world, n, r = 8, 5, 2
    numels = [40_000] * n
    u = _unit(numels, plan, world)
    G = memory.padded_units(numels, plan, world)[0] // 4
    q = lambda m: memory._q(m, 8, 64)  # noqa: E731
    s = G // r * 4
    assert (u["combine"], u["combine_kept"], u["combine_stage2"], u["unpack"]) == (2 * q(G) + s, s, 0, q(G))
    b = memory.buffer_bytes(numels, plan, world, "fp32", 4, max_combines=k)
    held = (n - k) * s + k * u["combine"] + q(G)
    assert b["combines"] == held
    assert b["step"] == max(held, n * s + n * u["publish"] + u["publish_tmp"]) + memory.STEP_SCALARS


def test_the_engine_default_is_the_config_default():
    import inspect

    from megatron_topo.config import ZeroTopoConfig as Z

    default = inspect.signature(engine_mod.ZeroTopoEngine).parameters["max_combines_in_flight"].default
    assert default == engine_mod.MAX_COMBINES_IN_FLIGHT == Z().max_combines_in_flight


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_bound_is_one_error_line(value, tmp_path, monkeypatch, capfd):
    from megatron_topo.commands import train as train_cli

    from .cli_cases import BASE_CFG, ENV_VARS, one_error_line, write_dataset

    monkeypatch.chdir(tmp_path)
    for key in ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "data").mkdir()
    write_dataset(tmp_path / "data" / "toy", 20, 0)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    rc = train_cli.main(["cfg.yml", "--set", f"zero_topo.max_combines_in_flight={value}"])
    line = one_error_line(capfd)
    assert rc == 2
    assert line.startswith("error: ") and "zero_topo.max_combines_in_flight" in line, line
    assert not (tmp_path / "log" / "metrics.jsonl").exists()


def test_the_preflight_uses_the_configured_bound():
    import os

    from megatron_topo import preflight
    from megatron_topo.topology import Topology
    from megatron_topo.zero_topo.sharding import resolve_plan

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join(repo, f"configs/{f}.yml") for f in ("20B", "topo", "frontier")]
    topo = Topology(384, 2, 4)
    est = {}
    for k in (0, 1, 4):
        cfg = load_config(files, ["zero_topo.combine_bits=8", f"zero_topo.max_combines_in_flight={k}"])
        est[k] = preflight.estimate(cfg, resolve_plan(cfg.zero_topo, topo), 384)["buffer_phases"]["step"]
    assert est[1] < est[4] < est[0]


def _trace(rank, world, bound):
    cfg = tiny_cfg(num_layers=6)
    zcfg = ZeroTopoConfig(preset="topo", **INT8)
    eng = make_engine(rank, world, zcfg, gcds=2, gpus=1, cfg=cfg, max_combines_in_flight=bound)
    for m in range(2):
        x, y = batch(0, rank, m, cfg=cfg)
        if m == 1:
            eng.trace = []
        eng.backward(loss_fn(eng(x), y) / 2, last_micro_batch=m == 1)
    eng.step()
    trace, eng.trace = eng.trace, None
    return trace, len(eng.units)


def test_the_oldest_combine_is_finished_right_before_one_more_starts():
    """The event trace (same on every rank): combines launch in backward order; unit L[i]'s is
    finished immediately before L[i + k]'s launch, oldest first; the last k are finished in the
    step, after their second stages went out."""
    k = 2
    traces = run_distributed(_trace, 4, k)  # 2 nodes x 1 GPU x 2 GCDs
    assert all(t == traces[0] for t in traces)
    trace, n = traces[0]
    launched = [u for e, u in trace if e == "combine"]
    finished = [u for e, u in trace if e == "finish_combine"]
    assert launched == list(reversed(range(n)))
    assert finished == launched[: n - k]
    for i, u in enumerate(finished):
        assert trace.index(("finish_combine", u)) + 1 == trace.index(("combine", launched[i + k])), trace
    assert trace.index(("combines_done", None)) > trace.index(("autograd_done", None))
