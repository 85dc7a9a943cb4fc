"""DeepSpeed JSON configs: ZeRO / ZeRO++ / MiCS / hpZ keys map onto plans or are documented no-ops,
train_batch_size is checked, schedulers map onto ours, scientific notation parses, conflicts are
errors, the saved config records the resolved plan."""

from __future__ import annotations

import json

import pytest
import yaml

from megatron_topo.config import ConfigError, check_batch_size, load_config
from megatron_topo.topology import Topology
from megatron_topo.training import learning_rate
from megatron_topo.zero_topo.sharding import effective_config, resolve_plan

NODE16 = Topology(32, 2, 8)  # 2 nodes of 8 GPUs x 2 GCDs: 16 ranks per node

# DeepSpeed's ZeRO++ tutorial block (its keys and values, written out here)
ZEROPP = {
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": 10000000,
        "reduce_scatter": True,
        "zero_quantized_weights": True,
        "zero_hpz_partition_size": 16,
        "zero_quantized_gradients": True,
        "contiguous_gradients": True,
        "overlap_comm": True,
    }
}


# what GPT-NeoX requires and a DeepSpeed file leaves to the model config (a file's own keys win)
REQUIRED = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 64,
    "max_position_embeddings": 64,
    "train_iters": 10,
    "train_micro_batch_size_per_gpu": 2,
}


def write_json(tmp_path, data, name="ds.json", required=True):
    p = tmp_path / name
    p.write_text(json.dumps({**(REQUIRED if required else {}), **data}, indent=2))
    return str(p)


def test_zeropp_tutorial_block_resolves_to_zeropp(tmp_path):
    cfg = load_config([write_json(tmp_path, {"train_micro_batch_size_per_gpu": 1, **ZEROPP})])
    plan = resolve_plan(cfg.zero_topo, NODE16, cfg.zero_optimization)
    assert plan.preset == "zeropp"
    assert (plan.factors, plan.secondary_degree, plan.weight_bits, plan.grad_bits) == ((32, 32, 32), 16, 8, 4)


def test_stage3_keys_and_bucket_sizes_are_no_ops_even_as_strings(tmp_path):
    z = {
        "stage": 3,
        "stage3_max_live_parameters": "1e9",
        "stage3_max_reuse_distance": 1e9,
        "stage3_prefetch_bucket_size": "5e8",
        "stage3_param_persistence_threshold": "1e6",
        "stage3_gather_16bit_weights_on_model_save": True,
        "sub_group_size": 1e12,
        "round_robin_gradients": True,
        "allgather_bucket_size": "5e8",
        "reduce_bucket_size": "2e8",
        "offload_optimizer": {"device": "none"},
        "offload_param": {"device": "none", "pin_memory": True},
    }
    cfg = load_config([write_json(tmp_path, {"zero_optimization": z})])
    assert cfg.zero_optimization.allgather_bucket_size == 500_000_000
    assert cfg.zero_optimization.stage3_max_live_parameters == 10**9
    assert resolve_plan(cfg.zero_topo, NODE16, cfg.zero_optimization).preset == "zero3"
    y = tmp_path / "ds.yml"
    y.write_text(
        "".join(f"{k}: {v}\n" for k, v in REQUIRED.items())
        + 'zero_optimization:\n  stage: 2\n  allgather_bucket_size: 5e8\n  reduce_bucket_size: "5e8"\n'
    )
    assert load_config([str(y)]).zero_optimization.reduce_bucket_size == 500_000_000


def test_offload_is_accepted_with_the_note_and_bad_devices_refused(tmp_path):
    """Offload changes where states live, not what is computed: cpu/nvme are accepted and named in the
    note line (the states stay on the device; the preflight refuses a plan that does not fit)."""
    p = write_json(
        tmp_path,
        {
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu"},
                "offload_param": {"device": "nvme", "nvme_path": "/nvme"},
            }
        },
    )
    cfg = load_config([p])
    assert cfg.no_effect == [
        "zero_optimization.offload_optimizer.device=cpu",
        "zero_optimization.offload_param.device=nvme",
        "zero_optimization.offload_param.nvme_path=/nvme",
    ]
    assert resolve_plan(cfg.zero_topo, NODE16, cfg.zero_optimization).preset == "zero3"
    p = write_json(tmp_path, {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}}, "b.json")
    with pytest.raises(ConfigError) as e:
        load_config([p])
    assert (
        str(e.value) == "zero_optimization.offload_optimizer.device='gpu' is not valid; use one of none, cpu, nvme "
        "(DeepSpeed's devices are none, cpu and nvme)"
    )


def test_bad_hpz_and_mics_sizes_are_reported_under_deepspeeds_key():
    from megatron_topo.config import ZeroOptimizationBlock, ZeroTopoConfig

    with pytest.raises(ConfigError, match=r"^zero_optimization\.zero_hpz_partition_size=6 does not fit"):
        resolve_plan(ZeroTopoConfig(), NODE16, ZeroOptimizationBlock(stage=3, zero_hpz_partition_size=6))
    with pytest.raises(ConfigError, match=r"^zero_optimization\.mics_shard_size=12 does not fit"):
        resolve_plan(ZeroTopoConfig(), NODE16, ZeroOptimizationBlock(stage=3, mics_shard_size=12))
    p = resolve_plan(
        ZeroTopoConfig(),
        NODE16,
        ZeroOptimizationBlock(stage=3, mics_shard_size=8, mics_hierarchical_params_gather=True),
    )
    assert p.preset == "mics" and p.factors == (8, 8, 8)
    with pytest.raises(ConfigError, match="needs stage 3"):
        resolve_plan(ZeroTopoConfig(), NODE16, ZeroOptimizationBlock(stage=2, zero_quantized_gradients=True))


def test_conflict_with_an_explicit_preset_is_an_error(tmp_path):
    p = write_json(tmp_path, {"zero_optimization": {"stage": 1}, "zero_topo": {"preset": "topo"}})
    with pytest.raises(ConfigError, match="zero_optimization and zero_topo.preset=topo both choose the sharding"):
        load_config([p])
    p = write_json(tmp_path, {"zero_optimization": {"stage": 3}, "zero_topo": {"preset": "ddp"}}, "e.json")
    with pytest.raises(ConfigError, match="zero_optimization and zero_topo.preset=ddp .* both choose the sharding"):
        load_config([p])


def test_saved_config_records_the_resolved_plan(tmp_path):
    cfg = load_config([write_json(tmp_path, ZEROPP)])
    plan = resolve_plan(cfg.zero_topo, NODE16, cfg.zero_optimization)
    eff = effective_config(cfg, plan, NODE16)
    text = eff.to_flat_yaml()
    data = yaml.safe_load(text)
    assert data["zero_topo"]["preset"] == "zeropp" and data.get("zero_optimization") is None
    (tmp_path / "saved.yml").write_text(text)
    again = load_config([str(tmp_path / "saved.yml")])
    assert resolve_plan(again.zero_topo, NODE16, again.zero_optimization) == plan
    # hpZ that is not the node: zero3 + the overrides, recorded explicitly
    cfg = load_config(
        [
            write_json(
                tmp_path, {"zero_optimization": {**ZEROPP["zero_optimization"], "zero_hpz_partition_size": 8}}, "b.json"
            )
        ]
    )
    plan = resolve_plan(cfg.zero_topo, NODE16, cfg.zero_optimization)
    (tmp_path / "saved2.yml").write_text(effective_config(cfg, plan, NODE16).to_flat_yaml())
    again = load_config([str(tmp_path / "saved2.yml")])
    assert again.zero_topo.preset == "zero3" and again.zero_topo.secondary_degree == 8
    assert resolve_plan(again.zero_topo, NODE16, again.zero_optimization) == plan


def test_train_batch_size_derives_the_accumulation_for_the_world(tmp_path):
    cfg = load_config(
        [
            write_json(
                tmp_path,
                {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
            )
        ]
    )
    assert check_batch_size(cfg, 4) is None and cfg.train.gradient_accumulation_steps == 4
    assert "gradient_accumulation_steps 4 -> 8" in check_batch_size(cfg, 2)  # DeepSpeed: the global batch stays
    assert cfg.train.gradient_accumulation_steps == 8
    with pytest.raises(
        ConfigError, match=r"global batch 32 .* cannot be reached on 3 ranks.*nearest valid: 2 ranks or 4"
    ):
        check_batch_size(cfg, 3)
    with pytest.raises(ConfigError, match="not a multiple of"):
        load_config([write_json(tmp_path, {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, "c.json")])


@pytest.mark.parametrize(
    "sched,checks",
    [
        (
            {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}},
            {5: 5e-4, 10: 1e-3, 50: 1e-3, 100: 1e-3},
        ),
        (
            {
                "type": "WarmupDecayLR",
                "params": {
                    "warmup_max_lr": 1e-3,
                    "warmup_num_steps": 10,
                    "total_num_steps": 110,
                    "warmup_type": "linear",
                },
            },
            {10: 1e-3, 60: 5e-4, 110: 0.0},
        ),
        (
            {
                "type": "WarmupCosineLR",
                "params": {
                    "warmup_num_steps": 10,
                    "total_num_steps": 110,
                    "cos_min_ratio": 0.1,
                    "warmup_type": "linear",
                },
            },
            {10: 1e-3, 60: 5.5e-4, 110: 1e-4},
        ),
    ],
)
def test_deepspeed_schedulers_map_onto_ours(tmp_path, sched, checks):
    cfg = load_config(
        [
            write_json(
                tmp_path,
                {
                    "train_iters": 100,
                    "scheduler": sched,
                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.05}},
                },
            )
        ]
    )
    assert cfg.train.weight_decay == 0.05
    for step, lr in checks.items():
        assert learning_rate(cfg, step) == pytest.approx(lr, abs=1e-9), step


def test_scheduler_values_we_do_not_do_are_refused(tmp_path):
    p = write_json(
        tmp_path,
        {
            "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "log", "warmup_min_lr": 1e-5}},
            "lr_decay_style": "cosine",
        },
    )
    with pytest.raises(ConfigError) as e:
        load_config([p])
    text = str(e.value)
    assert "warmup_type='log' is not valid; use one of linear" in text and "warmup_min_lr=" in text
    assert "both set the learning-rate schedule" in text
    p = write_json(tmp_path, {"scheduler": {"type": "OneCycle"}}, "d.json")
    with pytest.raises(ConfigError, match="scheduler.type='OneCycle' is not valid"):
        load_config([p])


def test_bad_json_is_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"train_iters": 10,}')
    with pytest.raises(ConfigError, match=r"x.json: line 1: invalid JSON"):
        load_config([str(p)])
    p.write_text('{"train_iters": 10, "train_iters": 20}')
    with pytest.raises(ConfigError, match="repeated"):
        load_config([str(p)])


def test_train_py_reads_a_json_file_as_a_deepspeed_config(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    z = dict(ZEROPP["zero_optimization"], zero_hpz_partition_size=4)
    p = write_json(
        tmp_path,
        {
            "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": z,
            "steps_per_print": 10,
            "wall_clock_breakdown": False,
            "gradient_clipping": 1.0,
        },
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, os.path.join(root, "train.py"), p, "--dry-run", "--world-size", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["plan"]["preset"] == "zeropp"
    bad = write_json(tmp_path, {"zero_optimization": dict(z, zero_hpz_partition_size=3)}, "bad.json")
    r = subprocess.run(
        [sys.executable, os.path.join(root, "train.py"), bad, "--dry-run", "--world-size", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: zero_optimization.zero_hpz_partition_size=3 does not fit")
