"""Every preset, quantization off, fp32: parameters equal the unsharded reference (8 ranks)."""
import pytest
import torch

from megatron_topo.config import ZeroTopoConfig
from megatron_topo.zero_topo.plan import PRESETS

from .dist_utils import run_distributed
from .engine_cases import make_engine, reference, train_steps

UNQUANTIZED = dict(weight_bits=16, secondary_bits=16, grad_bits=16)


def _run_presets(rank, world, presets, extra):
    out = {}
    for name in presets:
        zc = ZeroTopoConfig(preset=name, **UNQUANTIZED, **extra.get(name, {}))
        eng = make_engine(rank, world, zc)
        train_steps(eng, rank)
        out[name] = eng.full_parameters()
        eng.remove_hooks()
    return out


CASES = {
    "topo_sec8": ("topo", {"secondary_degree": 8}),
    "topo_rs": ("topo", {"inter_node_reduce": "reduce_scatter"}),
}


def test_every_preset_matches_reference():
    world = 8
    presets = list(PRESETS)
    results = run_distributed(_run_presets, world, presets, {})
    ref = reference(world)
    for name in presets:
        for rank in (0, world - 1):
            got = results[rank][name]
            for pname, want in ref.items():
                torch.testing.assert_close(got[pname], want, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{name} rank {rank} {pname}: {m}")
