"""GPT-NeoX configs run unchanged: NeoX keys are implemented, accepted (their value is what we do
anyway) or refused with the reason; every problem of a file is reported at once; the defaults are
GPT-NeoX's; the vocabulary is derived and padded like GPT-NeoX's; the repo's configs keep their
architecture."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from megatron_topo.config import Config, ConfigError, load_config, neox_table, neox_table_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# every key the issue lists, in a NeoX-style file (values as GPT-NeoX's own configs write them)
NEOX_YML = """\
{{
  "pipe_parallel_size": 1,
  "model_parallel_size": 1,
  "num_layers": 2,
  "hidden_size": 32,
  "num_attention_heads": 4,
  "seq_length": 32,
  "max_position_embeddings": 32,
  "norm": "layernorm",
  "pos_emb": "rotary",
  "rotary_pct": 0.25,
  "no_weight_tying": true,
  "gpt_j_residual": true,
  "output_layer_parallelism": "column",
  "scaled_upper_triang_masked_softmax_fusion": true,
  "bias_gelu_fusion": true,
  "attention_config": [[["global"], 2]],
  "init_method": "small_init",
  "output_layer_init_method": "wang_init",
  "optimizer": {{"type": "Adam", "params": {{"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1.0e-8}}}},
  "min_lr": 0.00006,
  "zero_optimization": {{
    "stage": 1, "allgather_partitions": true, "allgather_bucket_size": 500000000, "overlap_comm": true,
    "reduce_scatter": true, "reduce_bucket_size": 500000000, "contiguous_gradients": true, "cpu_offload": false
  }},
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "data_impl": "mmap",
  "checkpoint_activations": true,
  "checkpoint_num_layers": 1,
  "partition_activations": true,
  "synchronize_each_layer": true,
  "gradient_clipping": 1.0,
  "weight_decay": 0.01,
  "hidden_dropout": 0,
  "attention_dropout": 0,
  "fp16": {{"fp16": true, "enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2,
            "min_loss_scale": 1}},
  "train_iters": 2,
  "lr_decay_iters": 2,
  "distributed_backend": "nccl",
  "lr_decay_style": "cosine",
  "warmup": 0.01,
  "checkpoint_factor": 2,
  "eval_interval": 1000,
  "eval_iters": 1,
  "log_interval": 1,
  "steps_per_print": 1,
  "keep_last_n_checkpoints": 1,
  "wall_clock_breakdown": true,
  "tokenizer_type": "ByteLevel",
  "make_vocab_size_divisible_by": 128,
  "data_path": "builtin",
  "builtin_corpus_bytes": 100000,
  "data_cache_dir": "{tmp}/cache",
  "save": "{tmp}/ck",
  "log-dir": "{tmp}/logs",
  "tensorboard-dir": "{tmp}/tb",
  "use_wandb": false,
  "progress_bar": false
}}
"""


# GPT-NeoX's required model keys (and seq_length), for files that test something else
ARCH = (
    "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 64\nmax_position_embeddings: 64\n"
    "train_iters: 10\ntrain_micro_batch_size_per_gpu: 2\n"
)


def run(args, cwd, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_neox_style_config_with_every_listed_key_runs_2_steps(tmp_path):
    p = tmp_path / "neox.yml"
    p.write_text(NEOX_YML.format(tmp=tmp_path))
    cfg = load_config([str(p)])
    assert cfg.model.vocab_size == 384  # ByteLevel's 257 ids padded to a multiple of 128, as GPT-NeoX pads
    assert cfg.checkpoint.keep_last == 1 and cfg.logging.tensorboard_dir == f"{tmp_path}/tb"
    assert cfg.precision == "fp16"
    r = run([str(p), "--set", "fp16.enabled=false", "--set", "fp16.fp16=false"], tmp_path)  # (fp16: the dry run below)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done: step 2" in r.stdout
    assert "global_step2" in os.listdir(tmp_path / "ck")
    saved = (tmp_path / "logs" / "config.yml").read_text()
    assert "preset: zero1" in saved and "zero_optimization" not in saved  # the resolved plan is recorded
    d = run([str(p), "--dry-run", "--world-size", "4"], tmp_path)
    assert d.returncode == 0, d.stderr[-3000:]
    last = json.loads(d.stdout.strip().splitlines()[-1])
    assert last["parameters"] > 0 and last["config"]["vocab_size"] == 384


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    p = tmp_path / "bad.yml"
    p.write_text(
        "pipe_parallel_size: -1\nmodel_parallel_size: 0\npos_emb: learned\nnum_layers: 2\nhiden_size: 64\n"
        'attention_config: [[["local"], 2]]\nsparsity_config: {}\nlr_decay_style: exponential\n'
        "zero_optimization: {stage: 3, offload_optimizer: {device: disk}}\n"
    )
    r = run([str(p), "--dry-run", "--world-size", "2"], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and all(line.startswith("error: ") for line in lines), r.stderr
    text = "\n".join(lines)
    for needle in (
        "pipe_parallel_size must be >= 0, got -1",
        "model_parallel_size must be >= 1, got 0",
        "pos_emb='learned' is not valid; use one of rotary",
        "did you mean 'hidden_size'",
        "attention type 'local' is not supported",
        "GPT-NeoX key 'sparsity_config' is not supported here: sparse attention",
        "lr_decay_style='exponential' is not valid",
        "offload_optimizer.device='disk' is not valid",
        "hidden_size, num_attention_heads, max_position_embeddings, seq_length are required "
        "(GPT-NeoX has no default for them)",
    ):
        assert sum(needle in line for line in lines) == 1, (needle, text)
    assert len(lines) == 9, text


def test_defaults_are_gpt_neox_defaults():
    c = Config()
    m, t = c.model, c.train
    assert (
        m.rotary_pct,
        m.gpt_j_residual,
        m.no_weight_tying,
        m.init_method,
        m.output_layer_init_method,
        m.init_method_std,
        m.make_vocab_size_divisible_by,
        m.norm,
        m.rotary_emb_base,
        m.layernorm_epsilon,
    ) == (1.0, False, False, "normal", "scaled_normal", 0.02, 128, "layernorm", 10000, 1e-5)
    assert (t.lr_decay_style, t.weight_decay, t.warmup, t.min_lr, t.gradient_clipping, t.seed) == (
        "linear",
        0.1,
        0.01,
        0.0,
        1.0,
        1234,
    )
    assert c.data.split == "969,30,1" and c.model.checkpoint_num_layers == 1


def test_scaled_normal_is_std_over_sqrt_2_layers():
    import math

    from megatron_topo.config import ModelConfig
    from megatron_topo.model import build_model

    cfg = ModelConfig(num_layers=8, hidden_size=256, num_attention_heads=4, seq_length=8, vocab_size=128)
    m = build_model(cfg, seed=1)
    out = m.layers[0].mlp.dense_4h_to_h.weight if hasattr(m.layers[0], "mlp") else None
    assert out is not None
    assert abs(float(out.detach().std()) - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(float(m.layers[0].mlp.dense_h_to_4h.weight.detach().std()) - 0.02) < 0.0005


@pytest.mark.parametrize(
    "extra,vocab",
    [("", 384), ("make_vocab_size_divisible_by: 64\n", 320), ("tokenizer_type: CharLevelTokenizer\n", 512)],
)
def test_vocab_size_is_derived_and_padded(tmp_path, extra, vocab):
    p = tmp_path / "v.yml"
    p.write_text(ARCH + extra)
    assert load_config([str(p)]).model.vocab_size == vocab


def test_explicit_vocab_smaller_than_the_tokenizer_is_one_line(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({f"w{i}": i for i in range(300)} | {"<|endoftext|>": 300}, unk_token="w0")
    )
    tok.save(str(tmp_path / "tok.json"))
    base = ARCH + f"tokenizer_type: HFTokenizer\nvocab_file: {tmp_path / 'tok.json'}\n"
    (tmp_path / "a.yml").write_text(base + "vocab_size: 256\n")
    with pytest.raises(ConfigError) as e:
        load_config([str(tmp_path / "a.yml")])
    assert "\n" not in str(e.value) and "vocab_size 256 is smaller than the tokenizer's 301 ids" in str(e.value)
    (tmp_path / "b.yml").write_text(base)
    assert load_config([str(tmp_path / "b.yml")]).model.vocab_size == 384


def test_merge_file_reaches_the_tokenizer(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    (tmp_path / "m.yml").write_text(
        ARCH + f"tokenizer_type: GPT2BPETokenizer\nvocab_file: {tmp_path / 'vocab.json'}\n"
        f"merge_file: {tmp_path / 'merges.txt'}\n"
    )
    cfg = load_config([str(tmp_path / "m.yml")])
    assert cfg.data.merge_file == str(tmp_path / "merges.txt") and cfg.model.vocab_size == 128


@pytest.mark.parametrize(
    "name,arch",
    [
        (
            "tiny.yml",
            dict(
                num_layers=4,
                hidden_size=128,
                rotary_pct=0.25,
                gpt_j_residual=True,
                no_weight_tying=True,
                init_method="small_init",
                output_layer_init_method="wang_init",
                vocab_size=512,
            ),
        ),
        (
            "20B.yml",
            dict(
                num_layers=44,
                hidden_size=6144,
                rotary_pct=0.25,
                gpt_j_residual=True,
                no_weight_tying=True,
                init_method="small_init",
                output_layer_init_method="wang_init",
                vocab_size=50432,
            ),
        ),
        (
            "10B.yml",
            dict(
                num_layers=48,
                hidden_size=4096,
                rotary_pct=0.25,
                gpt_j_residual=True,
                no_weight_tying=True,
                init_method="small_init",
                output_layer_init_method="wang_init",
                vocab_size=50432,
            ),
        ),
    ],
)
def test_repo_configs_keep_their_architecture_and_schedule(name, arch):
    cfg = load_config([os.path.join(ROOT, "configs", name)])
    for k, v in arch.items():
        assert getattr(cfg.model, k) == v, k
    assert cfg.train.lr_decay_style == "cosine" and cfg.train.weight_decay == 0.01
    assert cfg.data.split in ("949,50,1", "995,4,1")


def test_docs_table_is_generated_from_the_declarations():
    rows = neox_table()
    status = {k: s for k, s, _ in rows}
    for k in (
        "scaled_upper_triang_masked_softmax_fusion",
        "bias_gelu_fusion",
        "pos_emb",
        "data_impl",
        "checkpoint_num_layers",
        "partition_activations",
        "synchronize_each_layer",
        "steps_per_print",
        "wall_clock_breakdown",
        "distributed_backend",
        "zero_optimization.allgather_partitions",
        "zero_optimization.reduce_scatter",
        "attention_config",
        "pipe_parallel_size",
        "model_parallel_size",
    ):
        assert status[k] == "accepted", k
    for k in (
        "keep_last_n_checkpoints",
        "merge_file",
        "make_vocab_size_divisible_by",
        "tensorboard_dir",
        "rotary_pct",
        "finetune",
        "no_load_optim",
        "train_batch_size",
        "scheduler.type",
        "norm",
        "num_kv_heads",
        "fp16.fp16",
    ):  # (GPT-NeoX's duplicate of fp16.enabled: true enables fp16 here too)
        assert status[k] == "implemented", k
    assert status["sparsity_config"] == "rejected"
    with open(os.path.join(ROOT, "docs", "neox_compat.md")) as f:
        doc = f.read()
    assert neox_table_markdown() in doc, (
        "docs/neox_compat.md: regenerate with python -m megatron_topo.config --neox-table"
    )
    assert re.search(r"\d+ implemented, \d+ accepted, \d+ rejected", doc)
