"""Illegal plans and topologies are rejected with one clear line; layout math is nested."""

import pytest

from megatron_topo.config import ConfigError, TopologyConfig, ZeroOptimizationBlock, ZeroTopoConfig
from megatron_topo.topology import Topology, topology_from_config
from megatron_topo.zero_topo import layout as L
from megatron_topo.zero_topo.sharding import resolve_plan

FRONTIER2 = Topology(16, 2, 4)  # 2 nodes x 4 GPUs x 2 GCDs


def reject(match, **kw):
    with pytest.raises(ConfigError, match=match) as e:
        resolve_plan(ZeroTopoConfig(**kw), FRONTIER2)
    assert "\n" not in str(e.value)


def test_factor_not_dividing_topology():
    reject(r"weight_factor=3 does not fit .* legal values: 1, 2, 4, 8, 16", preset="topo", weight_factor=3)


def test_factor_not_aligned_with_nodes():
    reject(r"grad_factor=12 does not fit", preset="mics", grad_factor=12)


def test_dependency_rule_gradients_inside_weights():
    reject(
        r"grad_factor=2 breaks the dependency rule.*weight_factor=4",
        preset="mics",
        weight_factor=4,
        grad_factor=2,
        optimizer_factor=16,
    )


def test_dependency_rule_optimizer_inside_gradients():
    reject(r"optimizer_factor=4 breaks the dependency rule.*grad_factor=8", preset="topo", optimizer_factor=4)


def test_bad_secondary_degree():
    reject(r"secondary_degree=3 does not fit", preset="topo", secondary_degree=3)


def test_bad_bits():
    reject(r"grad_bits=2 is not valid; use one of 16, 8, 4", preset="topo", grad_bits=2)
    reject(r"weight_bits=4 is not valid; use one of 16, 8", preset="topo", weight_bits=4)


def test_bad_block_size():
    reject(r"quant_block_size=100 is not valid; use a power of two", preset="topo", quant_block_size=100)


def test_unknown_preset_and_reduce():
    reject(r"preset 'zero4' is unknown; valid: ddp, zero1", preset="zero4")
    reject(r"inter_node_reduce='ring' is not valid", preset="topo", inter_node_reduce="ring")


def test_reduce_scatter_needs_world_optimizer():
    reject(
        r"reduce_scatter needs optimizer_factor equal to the world size",
        preset="mics",
        inter_node_reduce="reduce_scatter",
    )


def test_world_not_multiple_of_node():
    with pytest.raises(ConfigError, match=r"world size 12 is not a multiple of ranks per node 8"):
        Topology(12, 2, 4)


def test_gcds_not_dividing_world():
    with pytest.raises(ConfigError, match=r"gcds_per_gpu=4 does not divide the world size 6"):
        topology_from_config(TopologyConfig(gcds_per_gpu=4), 6)


def test_nonpositive_topology():
    with pytest.raises(ConfigError, match=r"gcds_per_gpu must be >= 1"):
        Topology(8, 0, 4)


def test_deepspeed_keys_map_to_presets():
    ds = ZeroOptimizationBlock(
        stage=3, zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True
    )
    assert resolve_plan(ZeroTopoConfig(), FRONTIER2, ds).preset == "zeropp"
    assert resolve_plan(ZeroTopoConfig(), FRONTIER2, ZeroOptimizationBlock(stage=2)).preset == "zero2"
    p = resolve_plan(ZeroTopoConfig(), FRONTIER2, ZeroOptimizationBlock(stage=3))
    assert p.preset == "zero3" and p.factors == (16, 16, 16)
    with pytest.raises(ConfigError, match="stage 5 is not valid"):
        resolve_plan(ZeroTopoConfig(), FRONTIER2, ZeroOptimizationBlock(stage=5))


def test_topo_preset_is_the_paper():
    p = resolve_plan(ZeroTopoConfig(preset="topo"), FRONTIER2)
    assert p.factors == (2, 8, 16) and p.secondary_degree == 2
    assert (p.weight_bits, p.secondary_bits, p.grad_bits) == (8, 8, 4)


@pytest.mark.parametrize("chain", [(2, 8, 16), (1, 8, 16), (8, 8, 16), (2, 4, 8), (1, 1, 16), (16, 16, 16)])
def test_nested_layout_is_a_partition_and_nested(chain):
    w, g, o = chain
    world = 16
    lay = L.UnitLayout(1000, 1024, w, g, o)
    for level, f in (("primary", w), ("grad", g), ("optim", o)):
        # within one block of f ranks the shards tile the buffer exactly once
        for blk in L.blocks(world, f):
            rngs = sorted(getattr(lay, f"{level}_range")(r) for r in blk)
            assert rngs[0][0] == 0 and rngs[-1][1] == 1024
            assert all(a[1] == b[0] for a, b in zip(rngs, rngs[1:]))
    for r in range(world):  # optimizer shard inside gradient shard inside primary shard
        po, pg, pp = lay.optim_range(r), lay.grad_range(r), lay.primary_range(r)
        assert pp[0] <= pg[0] and pg[1] <= pp[1] and pg[0] <= po[0] and po[1] <= pg[1]
