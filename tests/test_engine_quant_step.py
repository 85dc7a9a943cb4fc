"""Quantized once-per-step traffic (beyond the paper): ``combine_bits: 8`` sums the replicas'
gradient shards with an INT8 all-to-all reduce-scatter (fp32 sums; an INT8 all-gather of the
sums when the optimizer shard is wider than a slice), ``publish_bits: 8`` all-gathers the updated
shards in INT8 while each rank's own shard stays exact. Byte counts are in test_engine_volumes."""

import pytest
import torch

from megatron_topo.config import ConfigError, ZeroTopoConfig
from megatron_topo.topology import Topology
from megatron_topo.zero_topo import layout as L
from megatron_topo.zero_topo.sharding import resolve_plan

from .dist_utils import run_distributed
from .engine_cases import make_engine, reference, train_steps

BLK = 64
EXACT = dict(weight_bits=16, secondary_bits=16, grad_bits=16)


def _train(rank, world, cases):
    out = {}
    for name, kw in cases.items():
        eng = make_engine(rank, world, ZeroTopoConfig(quant_block_size=BLK, grad_quant_block_size=BLK, **kw))
        losses = train_steps(eng, rank)
        params = eng.full_parameters()
        # after the last step's publish: this rank's own piece of its primary shard is exact
        own = []
        for u, master in zip(eng.units, eng.optimizer.params):
            u.wait_publish()
            a = u.optim_range[0] - u.primary_range[0]
            own.append(torch.equal(u.primary[a : a + master.numel()], master.detach().to(u.dtype)))
        out[name] = (losses, params, all(own))
        eng.remove_hooks()
    return out


CASES = {
    "topo": dict(preset="topo", **EXACT),
    "topo_c8": dict(preset="topo", combine_bits=8, **EXACT),
    "topo_p8": dict(preset="topo", publish_bits=8, **EXACT),
    "topo_c8p8": dict(preset="topo", combine_bits=8, publish_bits=8, **EXACT),
    "mics_c8": dict(preset="mics", combine_bits=8, **EXACT),  # optimizer shard = the node: all-gather too
}


def test_quantized_combine_and_publish_train_like_the_exact_plan():
    world = 8
    res = run_distributed(_train, world, CASES)
    ref = reference(world)
    exact_losses = res[0]["topo"][0]
    for name in CASES:
        losses, params, own_exact = res[0][name]
        assert own_exact, name
        for got, want in zip(losses, exact_losses):  # every step's loss within 0.5 %
            assert abs(got - want) <= 5e-3 * abs(want), (name, losses, exact_losses)
        # parameters stay close to the unsharded reference (INT8 error, not a different model)
        num = sum(float((params[n] - w).norm() ** 2) for n, w in ref.items()) ** 0.5
        den = sum(float(w.norm() ** 2) for w in ref.values()) ** 0.5
        assert num / den < (1e-5 if name == "topo" else 2e-2), (name, num / den)
        for rank in range(1, world):  # every rank ends with the same model
            other = res[rank][name][1]
            for n in params:
                assert torch.equal(other[n], params[n]), (name, rank, n)


def test_combine_bits_exclude_deterministic():
    with pytest.raises(ConfigError, match="combine_bits"):
        resolve_plan(ZeroTopoConfig(preset="topo", combine_bits=8, deterministic=True), Topology(8, 2, 2))


def test_quantized_plans_align_every_slice_to_whole_blocks():
    topo = Topology(16, 2, 4)
    plan = resolve_plan(ZeroTopoConfig(preset="mics", combine_bits=8, publish_bits=8), topo)
    from megatron_topo.zero_topo.memory import block_sizes

    assert block_sizes(plan) == [plan.quant_block_size, plan.grad_quant_block_size]
    align = L.alignment(16, block_sizes(plan))
    for n in (1, 1000, 123457):
        padded = L.padded_size(n, align)
        r = topo.world_size // plan.grad_factor
        assert (padded // plan.grad_factor) % (r * plan.grad_quant_block_size) == 0
