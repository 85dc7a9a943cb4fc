"""Bytes sent per link level and model-state bytes per rank equal the formulas of docs/design.md §4.8 and §4.10.

Expectations are derived from the volume table (not from the engine): M = 2L bytes per unit at
16 bits (L = the unit's padded length), INT8 halves it, INT4 quarters it, plus one fp32 scale
per quantization block. 8 ranks = 2 nodes x 2 GPUs x 2 GCDs, bf16, 2 micro-batches, 1 step.
"""

import pytest

from megatron_topo.config import ZeroTopoConfig

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine
from .volume_cases import BG, BW, CASES, MICRO, P, W, expected


def _run(rank, world, cases):
    out = {}
    for name, kw in cases.items():
        eng = make_engine(
            rank, world, ZeroTopoConfig(quant_block_size=BW, grad_quant_block_size=BG, **kw), precision="bf16"
        )
        eng.comm.reset_counters()
        for m in range(MICRO):
            x, y = batch(0, rank, m)
            eng.backward(loss_fn(eng(x), y) / MICRO)
        eng.step()
        out[name] = {
            "bytes": dict(eng.comm.bytes),
            "state": dict(eng.state_bytes_before_step),
            "L": [u.layout.padded for u in eng.units],
            "numel": [u.numel for u in eng.units],
        }
        eng.remove_hooks()
    return out


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
        "ddp": (1, 1, 1, None),
        "zero1": (1, 1, W, None),
        "zero2": (1, W, W, None),
        "zero3": (W, W, W, None),
        "zeropp": (W, W, W, P),
        "mics": (P, P, P, None),
        "topo": (2, P, W, 2),
        "topo_sec8": (2, P, W, P),
        "topo_rs": (2, P, W, 2),
        "paro_iig": (P, P, W, None),
        "paro_nig": (1, P, W, None),
        "topo_q": (2, P, W, 2),
        "mics_q": (P, P, P, None),
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
