"""Bytes sent per link level and model-state bytes per rank equal the formulas of docs/design.md §4.8 and §4.10.

Expectations are derived from the volume table (not from the engine): M = 2L bytes per unit at
16 bits (L = the unit's padded length), INT8 halves it, INT4 quarters it, plus one fp32 scale
per quantization block. 8 ranks = 2 nodes x 2 GPUs x 2 GCDs, bf16, 2 micro-batches, 1 step.
"""
import pytest
import torch

from megatron_topo.config import ZeroTopoConfig

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine

W, N, P, G = 8, 2, 4, 2  # world, nodes, ranks per node, GCDs per GPU
MICRO = 2
BW = BG = 256  # weight / gradient quantization block sizes


def _run(rank, world, cases):
    out = {}
    for name, kw in cases.items():
        eng = make_engine(rank, world, ZeroTopoConfig(quant_block_size=BW, grad_quant_block_size=BG, **kw),
                          precision="bf16")
        eng.comm.reset_counters()
        for m in range(MICRO):
            x, y = batch(0, rank, m)
            eng.backward(loss_fn(eng(x), y) / MICRO)
        eng.step()
        out[name] = {"bytes": dict(eng.comm.bytes), "state": dict(eng.state_bytes_before_step),
                     "L": [u.layout.padded for u in eng.units], "numel": [u.numel for u in eng.units]}
        eng.remove_hooks()
    return out


def level(f, kind="block"):
    """Link level of a group of f ranks: consecutive blocks, or strided replicas."""
    if kind == "strided":  # ranks r, r+f, ...: spans nodes whenever there is more than one
        return "inter_node"
    if f <= G:
        return "intra_gpu"
    return "intra_node" if f <= P else "inter_node"


def expected(kind: str, Ls: list[int]) -> dict:
    """Bytes one rank sends in one step, from the DESIGN §4 table."""
    e = {"intra_gpu": 0, "intra_node": 0, "inter_node": 0}
    ag = lambda S, d: S * (d - 1) / d  # all-gather / reduce-scatter / all-to-all
    ar = lambda S, d: 2 * S * (d - 1) / d
    q8 = lambda L, d: ag(L, d) + ag(4 * L / BW, d)  # INT8 payload + fp32 scales
    q4 = lambda L, d: ag(L / 2, d) + ag(4 * L / BG, d)  # INT4 payload + fp32 scales
    last = len(Ls) - 1
    for i, L in enumerate(Ls):
        M = 2 * L
        fwd_bwd = MICRO * (2 if i != last else 1)  # the last unit stays gathered into backward
        if kind == "zero3":
            e["inter_node"] += fwd_bwd * ag(M, W) + MICRO * ag(M, W)
        elif kind == "zeropp":
            e["inter_node"] += MICRO * q8(L, W)  # forward all-gather, INT8 over the world
            if i != last:
                e["intra_node"] += MICRO * q8(L, P)  # backward from the INT8 secondary in the node
            e["intra_node"] += MICRO * q4(L, P)  # hop 1: INT4 all-to-all in the node
            e["inter_node"] += MICRO * (ag(L / 2 / P, N) + ag(4 * L / BG / P, N))  # hop 2
        elif kind.startswith("topo"):
            s = 2 if kind != "topo_sec8" else P
            e["intra_gpu"] += MICRO * q8(L, 2)  # forward all-gather inside the GCD pair
            if i != last:
                e[level(s)] += MICRO * q8(L, s)  # backward from the INT8 secondary
            e["intra_node"] += MICRO * q4(L, P)  # INT4 all-to-all reduce-scatter in the node
            if kind == "topo_rs":
                e["inter_node"] += ag(M / P, N)  # cross-node reduce-scatter, once per step
            elif kind == "topo_q":  # INT8 all-to-all reduce-scatter of the L/P shard (os = world: no gather)
                e["inter_node"] += ag(L / P, N) + ag(4 * L / P / BG, N)
            else:
                e["inter_node"] += ar(M / P, N)  # cross-node all-reduce, once per step
            if kind == "topo_q":  # post-step all-gather of the primary shard in INT8
                e["inter_node"] += ag(L / 2, W // 2) + ag(4 * L / 2 / BW, W // 2)
            else:
                e["inter_node"] += ag(M / 2, W // 2)  # post-step all-gather of the primary shard
        elif kind in ("mics", "mics_q"):
            e["intra_node"] += fwd_bwd * ag(M, P) + MICRO * ag(M, P)
            if kind == "mics_q":  # INT8 reduce-scatter + INT8 all-gather of the summed slices
                e["inter_node"] += 2 * (ag(L / P, N) + ag(4 * L / P / BG, N))
            else:
                e["inter_node"] += ar(M / P, N)
        elif kind == "ddp":
            e["inter_node"] += ar(M, W)
        elif kind == "zero1":
            e["inter_node"] += ar(M, W) + ag(M, W)
        elif kind == "zero2":
            e["inter_node"] += MICRO * ag(M, W) + ag(M, W)  # + post-step all-gather of weights
        elif kind == "paro_iig":  # weights and grads in the node, optimizer over the world
            e["intra_node"] += fwd_bwd * ag(M, P) + MICRO * ag(M, P)
            e["inter_node"] += ar(M / P, N) + ag(M / P, N)
        elif kind == "paro_nig":
            e["intra_node"] += MICRO * ag(M, P)
            e["inter_node"] += ar(M / P, N) + ag(M, W)
    return e


CASES = {
    "ddp": dict(preset="ddp"), "zero1": dict(preset="zero1"), "zero2": dict(preset="zero2"),
    "zero3": dict(preset="zero3"), "zeropp": dict(preset="zeropp"), "mics": dict(preset="mics"),
    "topo": dict(preset="topo"), "topo_sec8": dict(preset="topo", secondary_degree=P),
    "topo_rs": dict(preset="topo", inter_node_reduce="reduce_scatter"),
    "paro_iig": dict(preset="paro_iig"), "paro_nig": dict(preset="paro_nig"),
    "topo_q": dict(preset="topo", combine_bits=8, publish_bits=8),
    "mics_q": dict(preset="mics", combine_bits=8),
}


@pytest.fixture(scope="module")
def results():
    return run_distributed(_run, W, CASES)


@pytest.mark.parametrize("kind", list(CASES))
def test_bytes_per_level_equal_formulas(results, kind):
    for rank in range(W):
        got = results[rank][kind]
        want = expected(kind, got["L"])
        for lvl, v in want.items():
            assert got["bytes"][lvl] == pytest.approx(v, abs=0.5), (kind, rank, lvl, got["bytes"], want)


def memory_formula(kind, L):
    """docs/design.md §4.10 memory per device (bf16 weights, fp32 gradient shards, Adam 12 bytes)."""
    w, g, os_, s = {
        "ddp": (1, 1, 1, None), "zero1": (1, 1, W, None), "zero2": (1, W, W, None),
        "zero3": (W, W, W, None), "zeropp": (W, W, W, P), "mics": (P, P, P, None),
        "topo": (2, P, W, 2), "topo_sec8": (2, P, W, P), "topo_rs": (2, P, W, 2),
        "paro_iig": (P, P, W, None), "paro_nig": (1, P, W, None),
        "topo_q": (2, P, W, 2), "mics_q": (P, P, P, None),
    }[kind]
    return {
        "weights": 2 * L / w,
        "secondary": (L / s + 4 * L / s / BW) if s else 0,  # INT8 + scales
        "gradients": 4 * L / g,
        "optimizer": 12 * L / os_,
    }


@pytest.mark.parametrize("kind", list(CASES))
def test_model_state_bytes_equal_formulas(results, kind):
    got = results[0][kind]
    want = {k: 0.0 for k in ("weights", "secondary", "gradients", "optimizer")}
    for L in got["L"]:
        for k, v in memory_formula(kind, L).items():
            want[k] += v
    for k, v in want.items():
        assert got["state"][k] == pytest.approx(v, abs=0.5), (kind, k, got["state"], want)
    # padding is bounded: less than one alignment unit (world x block) per unit
    align = W * (BW if kind in ("zeropp", "topo", "topo_sec8", "topo_rs", "topo_q", "mics_q") else 16)
    assert all(0 <= L - n < align for L, n in zip(got["L"], got["numel"]))
