"""Overlap in backward, proven by the engine's event trace (order of launches and waits against
backward progress), not by timing: reductions finish oldest first, each at a fixed point (when the
reduction ``max_in_flight`` units later has been launched), each unit's cross-replica combine
starts right after its reduction is finished, ZeRO++'s second hop goes out before the next unit's
first hop. The points are fixed by program position, so every rank has the same trace."""

import pytest

from megatron_topo.config import ZeroTopoConfig

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine, tiny_cfg

LAYERS = 6  # 8 units: embedding, 6 layers, head


def _trace(rank, world, preset):
    eng = make_engine(rank, world, ZeroTopoConfig(preset=preset), gcds=2, gpus=1, cfg=tiny_cfg(num_layers=LAYERS))
    for m in range(2):
        x, y = batch(0, rank, m, cfg=eng.module.cfg)
        if m == 1:
            eng.trace = []
        eng.backward(loss_fn(eng(x), y) / 2, last_micro_batch=m == 1)
    trace, eng.trace = eng.trace, None
    eng.step()
    return trace, eng.max_in_flight, len(eng.units)


def _pos(trace, what, unit):
    return trace.index((what, unit))


@pytest.mark.parametrize("preset", ["topo", "zeropp", "zero3", "mics"])
def test_reductions_finish_oldest_first_and_combines_start_during_backward(preset):
    traces = run_distributed(_trace, 4, preset)  # 2 nodes x 1 GPU x 2 GCDs
    assert all(t == traces[0] for t in traces), traces  # one schedule on every rank
    trace, k, n = traces[0]
    launches = [u for e, u in trace if e == "launch_reduce"]
    waits = [u for e, u in trace if e == "wait_reduce"]
    assert launches == list(reversed(range(n))), trace  # backward order: head first
    assert waits == launches, trace  # oldest first
    done = trace.index(("autograd_done", None))
    for i, u in enumerate(launches):
        # at most k reductions in flight: unit u is finished no later than the launch k+1 after it
        if i + k + 1 < n:
            assert _pos(trace, "wait_reduce", u) < _pos(trace, "launch_reduce", launches[i + k + 1]), (u, trace)
        if i + k < n:  # ... and exactly then: right after the launch k later (a fixed point, not "when it lands")
            assert _pos(trace, "wait_reduce", u) == _pos(trace, "launch_reduce", launches[i + k]) + 1, (u, trace)
        if preset in ("topo", "mics"):  # node-sharded gradients: combined across nodes once per step
            assert _pos(trace, "combine", u) == _pos(trace, "wait_reduce", u) + 1, (u, trace)
            if i + k < n:  # every combine but the last k starts while autograd is still running
                assert _pos(trace, "combine", u) < done, (u, trace)
    if preset in ("topo", "mics"):
        # the head's combine is in flight before backward reaches the embedding
        assert _pos(trace, "combine", n - 1) < _pos(trace, "backward", 0), trace


def test_zeropp_second_hop_launched_before_the_next_units_first_hop():
    trace, k, n = run_distributed(_trace, 4, "zeropp")[0]
    launches = [u for e, u in trace if e == "launch_reduce"]
    assert sorted(u for e, u in trace if e == "hop2") == sorted(launches)
    for i, u in enumerate(launches):
        assert _pos(trace, "hop2", u) < _pos(trace, "wait_reduce", u)
        if i + 1 < n:
            assert _pos(trace, "hop2", u) < _pos(trace, "launch_reduce", launches[i + 1]), (u, trace)


def _step_trace(rank, world, zt, bound=0):
    eng = make_engine(rank, world, zt, gcds=2, gpus=1, cfg=tiny_cfg(num_layers=LAYERS), max_combines_in_flight=bound)
    x, y = batch(0, rank, 0, cfg=eng.module.cfg)
    eng.backward(loss_fn(eng(x), y), last_micro_batch=True)
    eng.trace = []
    eng.step()
    return eng.trace, len(eng.units)


def test_quantized_combine_second_stages_all_go_out_before_the_first_wait():
    """A two-stage combine (INT8 reduce-scatter, then an INT8 all-gather because the optimizer
    shard is wider than the summed slice): step() launches every unit's all-gather, in unit
    order on every rank, before it waits for any, so they pipeline on the link (before, each
    unit's all-gather was launched and waited for in turn)."""
    zt = ZeroTopoConfig(preset="mics", combine_bits=8)  # optimizer over the node, 2 replicas
    trace, n = run_distributed(_step_trace, 4, zt)[0]  # unbounded (max_combines_in_flight 0)
    stage2 = [u for e, u in trace if e == "combine_stage2"]
    assert stage2 == list(range(n)), trace
    assert trace.index(("combines_done", None)) > trace.index(("combine_stage2", n - 1)), trace
    # bounded: the K still in flight at the step (the first units, launched last in backward)
    k = 3
    trace, n = run_distributed(_step_trace, 4, zt, k)[0]
    assert [u for e, u in trace if e == "combine_stage2"] == list(range(k)), trace
    assert not [e for e, _ in trace if e == "finish_combine"], trace  # none of these is finished early
