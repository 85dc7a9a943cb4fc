"""One collective schedule: every rank issues the same sequence of collectives over all its
communicators whatever its speed (NCCL/RCCL need ranks that share communicators to issue them in
one order; RCCL on MI250X deadlocks with several live communicators otherwise).

Each rank runs with its own random delays before every collective and its own random answers
from ``Work.is_completed()`` (a slow or fast GPU); the collective trace
(``distributed.trace_collectives``) of 8 gloo ranks must then be the same on every rank, and each
group's members must agree on what they issued on it. On 1d0c977 the engine launched a unit's
cross-node combine when ``is_completed()`` said its reduction had landed, and this test failed for
topo, mics and topo with INT8 combine/publish (checked); zero3 and zeropp have one replica here (no
combine collective) and ZeRO++'s second hop already went out at the next unit's reduction, so they
passed there too and guard the schedule from now on."""

import json
import random
import time

import pytest
import torch

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.model import build_model
from megatron_topo.topology import Topology
from megatron_topo.zero_topo import trace as T
from megatron_topo.zero_topo.comm import Comm
from megatron_topo.zero_topo.engine import ZeroTopoEngine
from megatron_topo.zero_topo.sharding import resolve_plan

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, tiny_cfg

WORLD = 8  # 2 nodes x 2 GPUs x 2 GCDs


class _Unsure:
    """A collective's Work whose ``is_completed`` answers at random (per rank): a rank that polls
    sees its reductions land at its own moments. ``wait`` is the real one."""

    def __init__(self, work, rng):
        self._work, self._rng = work, rng

    def is_completed(self):
        return self._rng.random() < 0.5

    def wait(self, *a, **kw):
        return self._work.wait(*a, **kw)


def _jittery(rank):
    """Wrap Comm's collectives: a random sleep before each, an unsure Work after."""
    rng = random.Random(7919 * (rank + 1))
    for name in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce"):
        real = getattr(Comm, name)

        def wrapped(self, *a, _real=real, **kw):
            time.sleep(rng.uniform(0.0, 0.004))
            work = _real(self, *a, **kw)
            return _Unsure(work, rng) if work is not None else None

        setattr(Comm, name, wrapped)


def _train(rank, world, zt, trace_dir, bound=None):
    _jittery(rank)  # this forked process only
    topo = Topology(world, 2, 2)
    cfg = tiny_cfg(num_layers=4)
    model = build_model(cfg, seed=7)
    comm = Comm(topo, rank, trace_dir=trace_dir)
    kw = {} if bound is None else {"max_combines_in_flight": bound}
    eng = ZeroTopoEngine(model, model.shard_units(), resolve_plan(zt, topo), comm, precision="fp32", lr=1e-2, **kw)
    for step in range(2):
        for m in range(2):  # accumulation: the combine goes out during the last micro-batch's backward
            x, y = batch(step, rank, m, cfg=cfg)
            eng.backward(loss_fn(eng(x), y) / 2, last_micro_batch=m == 1)
        eng.step()
    x, y = batch(2, rank, 0, cfg=cfg)
    with torch.no_grad():
        eng(x)  # the next forward waits for the last post-step gathers
    comm.trace.close()
    return True


CASES = {
    "topo": ZeroTopoConfig(preset="topo"),
    "zeropp": ZeroTopoConfig(preset="zeropp"),
    "mics": ZeroTopoConfig(preset="mics"),
    "zero3": ZeroTopoConfig(preset="zero3"),
    "topo_int8": ZeroTopoConfig(preset="topo", combine_bits=8, publish_bits=8),
    # combines bounded in flight (zero_topo.max_combines_in_flight): the oldest is finished, its
    # second stage issued (mics: optimizer shards over the node), at fixed program positions
    "topo_int8_k1": ZeroTopoConfig(preset="topo", combine_bits=8, publish_bits=8),
    "mics_int8_k2": ZeroTopoConfig(preset="mics", combine_bits=8),
}
BOUNDS = {"topo_int8_k1": 1, "mics_int8_k2": 2}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rank_issues_the_same_collectives_in_the_same_order(case, tmp_path):
    run_distributed(_train, WORLD, CASES[case], str(tmp_path), BOUNDS.get(case))
    traces = T.load_traces(str(tmp_path))
    assert sorted(traces) == list(range(WORLD))
    assert T.compare_traces(traces, WORLD) == []
    ops = {r["op"] for r in traces[0]}
    assert {"all_gather", "all_reduce"} <= ops, ops
    assert len(traces[0]) > 30  # the whole run: gathers, reductions, combines, norms, publishes
    # the property itself, stated here too (not only through compare_traces)
    seqs = [[(r["op"], len(r["group"]), r["bytes"], r["dtype"]) for r in traces[k]] for k in range(WORLD)]
    assert all(s == seqs[0] for s in seqs), case
    assert [r["seq"] for r in traces[0]] == list(range(len(traces[0])))


def test_trace_lines_name_the_collective_as_issued(tmp_path):
    """One JSON line per collective with the documented fields; the bytes are the whole buffer
    (S of docs/design.md §4.8) and match the traffic counters' ring formula."""
    run_distributed(_train, 4, ZeroTopoConfig(preset="zero3"), str(tmp_path))
    lines = (tmp_path / "rank_1.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"seq", "op", "group", "bytes", "dtype"}
    assert first["seq"] == 0 and first["op"] == "all_gather" and first["group"] == [0, 1, 2, 3]
    assert first["dtype"] == "float32" and first["bytes"] % 4 == 0


def test_compare_traces_names_the_first_difference():
    rec = lambda s, op, g, b=8, dt="float32": {"seq": s, "op": op, "group": g, "bytes": b, "dtype": dt}
    good = {
        0: [rec(0, "all_reduce", [0, 1]), rec(1, "all_gather", [0, 1, 2, 3])],
        1: [rec(0, "all_reduce", [0, 1]), rec(1, "all_gather", [0, 1, 2, 3])],
        2: [rec(0, "all_reduce", [2, 3]), rec(1, "all_gather", [0, 1, 2, 3])],
        3: [rec(0, "all_reduce", [2, 3]), rec(1, "all_gather", [0, 1, 2, 3])],
    }
    assert T.compare_traces(good, 4) == []
    swapped = dict(good)
    swapped[3] = [good[3][1], good[3][0]]
    problems = T.compare_traces(swapped, 4)
    assert problems and "rank 3 differs from rank 0 at collective 0" in problems[0]
    assert len(problems) == 1  # each group's own subsequence still agrees: only the interleaving differs
    bigger = dict(good)
    bigger[3] = [rec(0, "all_reduce", [2, 3], b=16), good[3][1]]
    problems = T.compare_traces(bigger, 4)
    assert any(
        p.startswith("group [2, 3]: its collective 0 is #0 all_reduce over 2 ranks [2, 3], 16 B") for p in problems
    )
    assert T.compare_traces({0: good[0]}, 4) == ["no trace from rank(s) [1, 2, 3]"]
    short = dict(good)
    short[2] = good[2][:1]
    assert any("rank 2 issued 1 collectives, rank 0 2" in p for p in T.compare_traces(short, 4))


def test_a_torn_last_line_is_dropped(tmp_path):
    (tmp_path / "rank_0.jsonl").write_text(
        '{"seq": 0, "op": "all_reduce", "group": [0, 1], "bytes": 8, "dtype": "float32"}\n{"seq": 1, "op": "all_'
    )
    assert len(T.load_traces(str(tmp_path))[0]) == 1


def test_trace_collectives_is_a_listed_key():
    from megatron_topo.config import describe_keys

    assert "distributed.trace_collectives" in describe_keys()


@pytest.mark.parametrize("how", ["file", "under_a_file"])
def test_a_trace_dir_that_cannot_be_one_is_one_error_line(how, tmp_path, monkeypatch, capfd):
    from megatron_topo.commands import train as train_cli

    from .cli_cases import BASE_CFG, ENV_VARS, one_error_line, write_dataset

    monkeypatch.chdir(tmp_path)
    for k in ENV_VARS:
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "data").mkdir()
    write_dataset(tmp_path / "data" / "toy", 20, 0)
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    (tmp_path / "taken").write_text("not a directory")
    target = "taken" if how == "file" else "taken/traces"
    rc = train_cli.main(["cfg.yml", "--set", f"distributed.trace_collectives={target}"])
    line = one_error_line(capfd)
    assert rc == 2
    assert line.startswith(f"error: distributed.trace_collectives {target}")
    assert ("exists and is not a directory" if how == "file" else "is a file, not a directory") in line
    assert not (tmp_path / "log" / "metrics.jsonl").exists()  # stopped before training logged anything
