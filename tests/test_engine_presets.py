"""Every preset, quantization off, fp32: parameters equal the unsharded reference (8 ranks)."""

import torch

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.zero_topo.sharding import PRESETS

from .dist_utils import run_distributed
from .engine_cases import make_engine, reference, train_steps

UNQUANTIZED = dict(weight_bits=16, secondary_bits=16, grad_bits=16)


def _run_presets(rank, world, presets, extra):
    out = {}
    for name in presets:
        preset, _, mode = name.partition("/")
        zc = ZeroTopoConfig(preset=preset, **UNQUANTIZED, **extra.get(name, {}))
        eng = make_engine(rank, world, zc)
        train_steps(eng, rank, overlap=mode != "combine-in-step")
        out[name] = eng.full_parameters()
        eng.remove_hooks()
    return out


CASES = {"topo_sec8": ("topo", {"secondary_degree": 8}), "topo_rs": ("topo", {"inter_node_reduce": "reduce_scatter"})}


def test_every_preset_matches_reference():
    world = 8
    # "/combine-in-step": the cross-replica combine runs in step() instead of overlapping the
    # last backward; "/deterministic": the ordered all-gather + sum combine
    presets = list(PRESETS) + ["topo/combine-in-step", "mics/combine-in-step", "topo/deterministic"]
    extra = {"topo/deterministic": {"deterministic": True}}
    results = run_distributed(_run_presets, world, presets, extra)
    ref = reference(world)
    for name in presets:
        for rank in (0, world - 1):
            got = results[rank][name]
            for pname, want in ref.items():
                torch.testing.assert_close(
                    got[pname], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} rank {rank} {pname}: {m}"
                )


ODD = dict(hidden_size=24, num_attention_heads=3, vocab_size=37, seq_length=16)


def _run_odd(rank, world, presets):
    from .engine_cases import tiny_cfg

    out = {}
    for name in presets:
        quant = name.endswith("_q")
        zc = ZeroTopoConfig(
            preset=name.removesuffix("_q"),
            quant_block_size=64,
            grad_quant_block_size=64,
            **({} if quant else UNQUANTIZED),
        )
        # 6 ranks = 3 nodes x 1 GPU x 2 GCDs: not a multiple of 8, odd node count
        eng = make_engine(rank, world, zc, gcds=2, gpus=1, cfg=tiny_cfg(**ODD))
        losses = train_steps(eng, rank, steps=5 if not quant else 3)
        out[name] = (eng.full_parameters(), losses)
        eng.remove_hooks()
    return out


def test_odd_sizes_and_world_of_six():
    """Parameters whose sizes divide neither the block nor the group, 1-D tensors, world 6."""
    from .engine_cases import tiny_cfg

    world = 6
    presets = ["zero3", "zeropp", "mics", "topo", "paro_nig", "topo_q", "zeropp_q"]
    results = run_distributed(_run_odd, world, presets)
    ref = reference(world, cfg=tiny_cfg(**ODD))
    for name in presets:
        got, losses = results[0][name]
        if name.endswith("_q"):  # quantized: finite and within 2% of the exact run, step by step
            exact = results[0][name.removesuffix("_q")][1]
            for a, b in zip(losses, exact):
                assert abs(a - b) / b < 0.02, (name, losses, exact)
            continue
        for pname, want in ref.items():
            torch.testing.assert_close(got[pname], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} {pname}: {m}")


def _run_ckpt(rank, world):
    from .engine_cases import tiny_cfg

    out = {}
    for name in ("zero3", "topo"):
        zc = ZeroTopoConfig(preset=name, **UNQUANTIZED)
        eng = make_engine(rank, world, zc, gcds=2, gpus=1, cfg=tiny_cfg(checkpoint_activations=True))
        train_steps(eng, rank, steps=3)
        out[name] = eng.full_parameters()
        eng.remove_hooks()
    return out


def test_activation_checkpointing_under_sharding():
    """Recompute during backward re-enters the forward hooks: weights must be there, no double
    reduction, same result as the plain reference."""
    world = 4
    results = run_distributed(_run_ckpt, world)
    ref = reference(world, steps=3)
    for name in ("zero3", "topo"):
        for pname, want in ref.items():
            torch.testing.assert_close(
                results[0][name][pname], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} {pname}: {m}"
            )
