"""The DeepSpeed configs of DeepSpeed's documentation (config-json page, ZeRO / ZeRO-Offload /
ZeRO-Infinity / ZeRO++ / MiCS tutorials) and of the HF Trainer's DeepSpeed guide load as users have
them (tests/data/deepspeed/*.json, written out from those pages): each maps onto the plan DeepSpeed
would run; HF's "auto" values are taken from the rest of the config as the HF Trainer fills them
and named in a note line; batch sizes are derived as DeepSpeed does (any two of train_batch_size,
micro-batch and accumulation give the third); performance-only keys (overlap_comm false, bucket
sizes, offload devices) are accepted and named in the note line."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from megatron_topo.config import ConfigError, check_batch_size, load_config, note_lines
from megatron_topo.topology import Topology
from megatron_topo.zero_topo.sharding import resolve_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "deepspeed")
# the model config a DeepSpeed file goes with (GPT-NeoX's required keys; lr etc. for the "auto" values)
MODEL = (
    "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\nmax_position_embeddings: 32\n"
    "train_iters: 100\nwarmup: 0.05\noptimizer: {params: {lr: 3.0e-4, betas: [0.9, 0.999], eps: 1.0e-6}}\n"
    "weight_decay: 0.01\ngradient_clipping: 0.5\nprecision: bf16\n"
)
NODE = Topology(16, 1, 8)  # 2 nodes x 8 GPUs

# file -> (plan preset at 16 ranks, precision)
EXPECTED = {
    "ds_docs_config_json_example.json": ("zero1", "fp16"),  # "zero_optimization": true is stage 1
    "ds_docs_config_json_blocks.json": ("ddp", "fp16"),
    "ds_docs_bf16.json": ("ddp", "bf16"),
    "ds_zero_tutorial_stage1.json": ("zero1", "bf16"),
    "ds_zero_tutorial_stage2.json": ("zero2", "bf16"),
    "ds_zero_offload_tutorial.json": ("zero2", "bf16"),
    "ds_zero_tutorial_stage3_offload.json": ("zero3", "bf16"),
    "ds_zero_infinity_nvme.json": ("zero3", "bf16"),
    "ds_zeropp_tutorial.json": ("zero3", "bf16"),  # hpZ 16 = the world here: zero3 with qwZ/qgZ
    "ds_mics_tutorial.json": ("mics", "bf16"),
    "hf_ds_config_zero2.json": ("zero2", "bf16"),
    "hf_ds_config_zero3.json": ("zero3", "bf16"),
    "hf_docs_zero1_bf16_auto.json": ("zero1", "bf16"),
    "hf_docs_zero2_block.json": ("zero2", "bf16"),
}


def _load(tmp_path, name, extra=""):
    """The model config + the fixture; the model config leaves to the file what the file sets itself
    (a key given in two files is an error), and gives what its "auto" values take."""
    data = json.load(open(os.path.join(DATA, name)))
    params = data.get("optimizer", {}).get("params", {})
    sched = data.get("scheduler", {}).get("params", {})
    drop = []
    if any(v != "auto" for v in params.values()):
        drop.append("optimizer:")
    if params.get("weight_decay", "auto") != "auto":
        drop.append("weight_decay:")
    if data.get("gradient_clipping", "auto") != "auto":
        drop.append("gradient_clipping:")
    if "scheduler" in data and sched.get("warmup_num_steps", "auto") != "auto":
        drop.append("warmup:")
    if any(data.get(b, {}).get("enabled") is True for b in ("fp16", "bf16")):
        drop.append("precision:")  # the file chooses the precision
    model = "".join(line + "\n" for line in MODEL.splitlines() if not line.startswith(tuple(drop)))
    batch = {
        k: v for k, v in data.items() if k in ("train_batch_size", "train_micro_batch_size_per_gpu") and v != "auto"
    }
    if not batch:
        model += "train_micro_batch_size_per_gpu: 2\n"  # (what HF's per_device_train_batch_size gives)
    p = tmp_path / "model.yml"
    p.write_text(model + extra)
    return load_config([str(p), os.path.join(DATA, name)])


def test_every_fixture_is_listed_and_documented():
    names = sorted(os.path.basename(f) for f in glob.glob(os.path.join(DATA, "*.json")))
    assert names == sorted(EXPECTED)
    doc = open(os.path.join(ROOT, "docs", "neox_compat.md")).read()
    assert all(f"`{n}`" in doc for n in names), [n for n in names if f"`{n}`" not in doc]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_docs_config_loads_and_maps_onto_deepspeeds_plan(tmp_path, name):
    cfg = _load(tmp_path, name)
    topo = Topology(8, 1, 8) if name == "ds_docs_config_json_example.json" else NODE  # its train_batch_size is 8
    check_batch_size(cfg, topo.world_size)
    plan = resolve_plan(cfg.zero_topo, topo, cfg.zero_optimization)
    assert (plan.preset, cfg.precision) == EXPECTED[name]
    t = cfg.train
    assert t.train_micro_batch_size_per_gpu >= 1 and t.gradient_accumulation_steps >= 1


def test_hf_auto_values_come_from_the_rest_of_the_config(tmp_path):
    cfg = _load(tmp_path, "hf_ds_config_zero3.json")
    check_batch_size(cfg, 16)
    t = cfg.train
    assert (
        t.optimizer.params.lr,
        t.optimizer.params.betas,
        t.optimizer.params.eps,
        t.weight_decay,
        t.gradient_clipping,
    ) == (3e-4, [0.9, 0.999], 1e-6, 0.01, 0.5)
    # WarmupDecayLR with "auto": linear decay over train_iters, warmup from the config's fraction
    assert (t.lr_decay_style, t.lr_decay_iters, t.warmup, t.min_lr) == ("linear", 100, 0.05, 0.0)
    assert cfg.precision == "bf16" and not t.fp16.enabled  # fp16.enabled "auto" follows precision
    z = cfg.zero_optimization  # HF's sizes from hidden_size 64 (no effect here, named in the note)
    assert (z.reduce_bucket_size, z.stage3_prefetch_bucket_size, z.stage3_param_persistence_threshold) == (
        64 * 64,
        int(0.9 * 64 * 64),
        640,
    )
    lines = note_lines(cfg)
    assert lines[1] == (
        'note: DeepSpeed "auto" values taken from the rest of the config (as the HF Trainer fills them): '
        "fp16.enabled=false, gradient_accumulation_steps=1, gradient_clipping=0.5, optimizer.params.betas=[0.9, "
        "0.999], optimizer.params.eps=1e-06, optimizer.params.lr=0.0003, optimizer.params.weight_decay=0.01, "
        "scheduler.params.total_num_steps=100, scheduler.params.warmup_max_lr=0.0003, "
        "scheduler.params.warmup_min_lr=0, scheduler.params.warmup_num_steps=5, train_batch_size=32, "
        "zero_optimization.reduce_bucket_size=4096, zero_optimization.stage3_param_persistence_threshold=640, "
        "zero_optimization.stage3_prefetch_bucket_size=3686"
    )
    assert "zero_optimization.offload_param.device=cpu" in lines[0]


def test_auto_batch_with_nothing_to_fill_it_takes_the_default_and_names_it(tmp_path):
    p = tmp_path / "m.yml"
    p.write_text(MODEL)
    cfg = load_config([str(p), os.path.join(DATA, "hf_ds_config_zero2.json")])
    check_batch_size(cfg, 8)
    assert (cfg.auto_values["train_micro_batch_size_per_gpu"], cfg.auto_values["train_batch_size"]) == (4, 32)
    assert "train_micro_batch_size_per_gpu=4" in note_lines(cfg)[1]


@pytest.mark.parametrize(
    "given,world,want",
    [
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, 8, (4, 2)),  # accumulation derived
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (4, 2)),  # micro-batch derived
        ({"train_batch_size": 64}, 8, (8, 1)),  # alone: accumulation 1
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, 8, (4, 3)),
    ],
)
def test_batch_sizes_are_derived_as_deepspeed_does(tmp_path, given, world, want):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(given))
    m = tmp_path / "m.yml"
    m.write_text(MODEL)
    cfg = load_config([str(m), str(p)])
    check_batch_size(cfg, world)
    assert (cfg.train.train_micro_batch_size_per_gpu, cfg.train.gradient_accumulation_steps) == want


def test_a_batch_no_split_gives_is_one_line(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_batch_size": 48, "gradient_accumulation_steps": 4}))
    m = tmp_path / "m.yml"
    m.write_text(MODEL)
    cfg = load_config([str(m), str(p)])
    with pytest.raises(ConfigError) as e:
        check_batch_size(cfg, 8)
    assert str(e.value) == (
        "train_batch_size 48 cannot be split into train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps 4 x world size 8 (DeepSpeed's rule); use a multiple of 32 "
        "or give the micro-batch"
    )


def test_overlap_comm_false_and_contiguous_gradients_false_are_noted(tmp_path):
    m = tmp_path / "m.yml"
    m.write_text(MODEL + "train_micro_batch_size_per_gpu: 2\n")
    p = tmp_path / "ds.json"
    p.write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": False},
                "fp16": {"enabled": False, "auto_cast": True},
            }
        )
    )
    cfg = load_config([str(m), str(p)])
    assert cfg.no_effect == [
        "fp16.auto_cast=True",
        "zero_optimization.contiguous_gradients=False",
        "zero_optimization.overlap_comm=False",
    ]


def test_dry_run_prints_the_auto_note(tmp_path):
    m = tmp_path / "m.yml"
    m.write_text(MODEL + "train_micro_batch_size_per_gpu: 2\n")
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "train.py"),
            str(m),
            os.path.join(DATA, "hf_docs_zero1_bf16_auto.json"),
            "--dry-run",
            "--world-size",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    notes = [x for x in r.stdout.splitlines() if x.startswith("note:")]
    assert notes == [
        'note: DeepSpeed "auto" values taken from the rest of the config (as the HF Trainer fills '
        "them): bf16.enabled=true, gradient_accumulation_steps=1, train_batch_size=8"
    ]


def test_an_effective_config_with_a_null_train_batch_size_loads_and_trains_its_batch(tmp_path):
    """config.yml (every key, train_batch_size: null) loads back: null is not a given batch size."""
    m = tmp_path / "m.yml"
    m.write_text(MODEL + "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 3\n")
    eff = tmp_path / "config.yml"
    eff.write_text(load_config([str(m)]).to_flat_yaml())
    cfg = load_config([str(eff)])
    check_batch_size(cfg, 4)
    assert (cfg.train.train_micro_batch_size_per_gpu, cfg.train.gradient_accumulation_steps) == (2, 3)


@pytest.mark.parametrize("consecutive,scale_after", [(False, 2.0**15), (True, 2.0**16)])
def test_consecutive_hysteresis_refills_after_a_clean_step(consecutive, scale_after):
    """DeepSpeed's fp16.consecutive_hysteresis: a clean step refills the hysteresis, so overflow, clean,
    overflow does not back the scale off; without it the second overflow does."""
    from megatron_topo.config import Fp16Block
    from megatron_topo.zero_topo.scaler import LossScaler

    s = LossScaler(Fp16Block(enabled=True, hysteresis=2, consecutive_hysteresis=consecutive))
    for overflow in (True, False, True):
        s.update(overflow)
    assert s.scale == scale_after
