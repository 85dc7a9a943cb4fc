"""ZeRO-3 frees every gathered unit after its forward, with or without activation checkpointing:
the storage is released and regathered in place before the unit's backward (docs/design.md §4.6),
so autograd's saved tensors no longer keep the whole model gathered until backward.

Peak per rank during forward + backward <= model states + activations + K gathered-unit-sized
buffers, K = 2 gathered units (the one computing, the prefetched one) + the unit's parameter
gradients + its flat gradient + ``max_in_flight`` reductions' send buffers. The whole model
(12 units) is well above that bound, which is what main (1d0c977) held without checkpointing.
"""

import os

import pytest

from megatron_topo.config import ZeroTopoConfig, load_config
from megatron_topo.dryrun import PeakMemory, dry_run
from megatron_topo.zero_topo import memory

from .dist_utils import run_distributed
from .engine_cases import batch, loss_fn, make_engine, tiny_cfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(num_layers=12, hidden_size=128, seq_length=8)
MAX_IN_FLIGHT = 2  # the engine's default
K = 2 + 1 + 1 + MAX_IN_FLIGHT
ZERO3 = dict(preset="zero3", weight_bits=16, secondary_bits=16, grad_bits=16)


def _activations(m, micro_batch: int, recompute: bool) -> int:
    return memory.activation_bytes(
        m.hidden_size, m.num_attention_heads, m.num_layers, m.seq_length, m.vocab_size, micro_batch, "fp32", recompute
    )


def _step_growth(rank, world, ckpt):
    """Bytes allocated above the engine's own (model states) at the peak of each of two steps'
    forward + backward, tracked storage by storage (in-place releases included)."""
    cfg = tiny_cfg(**SHAPE, checkpoint_activations=ckpt)
    tracker = PeakMemory()
    growth = []
    with tracker:
        eng = make_engine(rank, world, ZeroTopoConfig(**ZERO3), cfg=cfg, max_in_flight=MAX_IN_FLIGHT)
        base = tracker.current
        for step in range(2):
            tracker.peak = tracker.current
            x, y = batch(step, rank, 0, mb=1, cfg=cfg)
            eng.backward(loss_fn(eng(x), y), last_micro_batch=True)
            growth.append(tracker.peak - base)
            assert all(u.flat_storage_bytes() == 0 for u in eng.units)  # backward freed every unit
            eng.step()
    units = [u.layout.padded * 4 for u in eng.units]
    return growth, max(units), sum(units)


@pytest.mark.parametrize("ckpt", [False, True])
def test_zero3_peak_holds_a_bounded_number_of_units(ckpt):
    world = 4
    results = run_distributed(_step_growth, world, ckpt)
    m = tiny_cfg(**SHAPE)
    act = _activations(m, 1, ckpt)
    for rank, (growth, unit, model) in enumerate(results):
        bound = act + K * unit
        assert bound < model  # the test can tell a bounded peak from the whole model gathered
        for step, g in enumerate(growth):
            assert g <= bound, (
                f"rank {rank} step {step}: peak {g / 2**20:.2f} MiB above the states, "
                f"bound {bound / 2**20:.2f} MiB (activations + {K} units of "
                f"{unit / 2**20:.2f} MiB), whole model {model / 2**20:.2f} MiB"
            )


def _dry(ckpt: bool) -> dict:
    cfg = load_config(
        [os.path.join(REPO, f) for f in ("configs/tiny.yml", "configs/zero3.yml", "configs/local_cpu.yml")],
        [
            f"{k}={v}"
            for k, v in {
                **SHAPE,
                "hidden_size": 256,
                "max_position_embeddings": 8,
                "precision": "fp32",
                "checkpoint_activations": ckpt,
                "train_micro_batch_size_per_gpu": 1,
            }.items()
        ],
    )
    return cfg, dry_run(cfg, 8, 3)


def test_dry_run_zero3_without_checkpointing_holds_a_bounded_number_of_units():
    for ckpt in (False, True):
        cfg, r = _dry(ckpt)
        states = r["model_state_bytes_per_rank"]["total"]
        units = [u * 4 for u in memory.padded_units([int(n) for n in _unit_numels(cfg)], _plan(r), 8)]
        bound = _activations(cfg.model, 1, ckpt) + K * max(units)
        assert bound < sum(units)
        assert r["peak_bytes_per_rank"] - states <= bound, (ckpt, r["peak_bytes_per_rank"] - states, bound)


def _plan(r):
    from megatron_topo.zero_topo.sharding import Plan

    return Plan(**r["plan"])


def _unit_numels(cfg):
    from megatron_topo.analysis import formulas

    return formulas.raw_unit_lengths(cfg.model)
