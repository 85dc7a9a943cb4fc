"""Pythia's and local_setup's GPT-NeoX files as they are: extra_save_iters (Pythia's log-spaced
checkpoints) saves at those steps too, step 0 included; fp16.type bfloat16 is bf16 as GPT-NeoX derives
it; fp16.auto_cast, use_wandb and checkpoint_validation_with_forward_pass are accepted and named
in the note line when they change nothing; GPT-2 vocab/merges files without tokenizer_type are
GPT2BPETokenizer (GPT-NeoX's default); load = save and empty starts fresh; keys GPT-NeoX declares
and this trainer does not read are named as such, not mistaken for typos."""

from __future__ import annotations

import json
import os

import pytest
import torch

from megatron_topo.config import ConfigError, load_config

ARCH = (
    "num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\n"
    "vocab_size: 64\ntrain_micro_batch_size_per_gpu: 2\nprecision: fp32\nlog_interval: 1\neval_interval: 0\n"
    "progress_bar: false\n"
)

# the keys of GPT-NeoX's configs/pythia/1B.yml that this issue is about, with its values
PYTHIA = """\
"fp16": {"enabled": true, "type": "bfloat16", "auto_cast": true, "loss_scale": 0, "loss_scale_window": 1000,
         "initial_scale_power": 12, "hysteresis": 2, "min_loss_scale": 1}
"fp32_allreduce": true
"checkpoint_factor": 1000
"extra_save_iters": [0,1,2,4,8,16,32,64,128,256,512]
"train_iters": 143000
"""


def _trainer(cfg):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets

    return Trainer(
        cfg,
        Runtime(0, 1, 0, Topology(1, 1, 1), torch.device("cpu"), False),
        datasets=datasets(cfg),
        log=lambda *a, **k: None,
    )


def test_pythia_fp16_block_is_bf16_and_its_bookkeeping_keys_are_noted(tmp_path):
    p = tmp_path / "pythia.yml"
    p.write_text(ARCH.replace("precision: fp32\n", "") + PYTHIA)
    cfg = load_config([str(p)])
    assert cfg.precision == "bf16"  # GPT-NeoX: fp16.type bfloat16 is bf16 whatever fp16.enabled says
    assert cfg.checkpoint.extra_save_iters[:4] == [0, 1, 2, 4]
    assert cfg.no_effect == ["fp16.auto_cast=True", "fp32_allreduce=True"]
    q = tmp_path / "fp16.yml"
    q.write_text(ARCH.replace("precision: fp32\n", "") + "train_iters: 3\nfp16: {enabled: false, type: fp16}\n")
    assert load_config([str(q)]).precision == "fp16"


def test_extra_save_iters_saves_at_those_steps_too(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text(
        ARCH + f"train_iters: 6\ncheckpoint_factor: 4\nextra_save_iters: [0, 1, 2, 9]\nkeep_last: 0\n"
        f"save: {tmp_path / 'ck'}\nlog_dir: {tmp_path / 'run'}\n"
    )
    tr = _trainer(load_config([str(p)]))
    tr.train()
    steps = sorted(int(d[len("global_step") :]) for d in os.listdir(tmp_path / "ck") if d.startswith("global_step"))
    assert steps == [0, 1, 2, 4, 6]  # extra 0, 1, 2; every 4; the end (9 is past train_iters)


def test_local_setup_keys_start_fresh_then_resume(tmp_path):
    vocab = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}
    (tmp_path / "gpt2-vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "gpt2-merges.txt").write_text("#version: 0.2\na b\n")
    ck = tmp_path / "checkpoints"
    p = tmp_path / "local_setup.yml"  # GPT-NeoX's configs/local_setup.yml, with paths here
    p.write_text(
        f'{{"vocab-file": "{tmp_path}/gpt2-vocab.json", "merge-file": "{tmp_path}/gpt2-merges.txt",\n'
        f' "save": "{ck}", "load": "{ck}", "checkpoint_validation_with_forward_pass": False,\n'
        f' "tensorboard-dir": "{tmp_path}/tb", "log-dir": "{tmp_path}/logs", "use_wandb": True,\n'
        f' "wandb_host": "https://api.wandb.ai", "wandb_project": "neox"}}\n'
    )
    m = tmp_path / "model.yml"
    m.write_text(ARCH + "train_iters: 2\ncheckpoint_factor: 1\n")
    cfg = load_config([str(m), str(p)])
    assert cfg.data.tokenizer_type == "GPT2BPETokenizer"  # GPT-NeoX's default for GPT-2 files
    assert cfg.no_effect == ["use_wandb=True", "wandb_host=https://api.wandb.ai", "wandb_project=neox"]
    tr = _trainer(cfg)  # load = save = an empty (missing) folder: a fresh start, as in GPT-NeoX
    assert tr.resume_from is None
    tr.train()
    assert (ck / "latest").is_file()
    cfg = load_config([str(m), str(p)], ["train_iters=3"])
    tr = _trainer(cfg)  # now it holds a checkpoint: load resumes from it
    assert tr.resume_from == str(ck) and tr.state.step == 2
    other = load_config([str(m), str(p)], [f"load={tmp_path / 'nope'}"])
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="checkpoint path does not exist"):  # other missing paths: an error
        _trainer(other)


@pytest.mark.parametrize(
    "key,value,why",
    [
        ("scalenorm_epsilon", "1.0e-8", "ScaleNorm is not implemented"),
        ("gas", "4", "GPT-NeoX overwrites it with gradient_accumulation_steps: set that"),
        ("eval_tasks", "[lambada]", "an evaluation setting of GPT-NeoX's eval.py (lm-evaluation-harness)"),
        ("num_gpus", "8", "a DeepSpeed runner (deepspeed launcher) option"),
    ],
)
def test_declared_neox_keys_say_they_are_not_supported(tmp_path, key, value, why):
    p = tmp_path / "k.yml"
    p.write_text(ARCH + f"train_iters: 2\n{key}: {value}\n")
    with pytest.raises(ConfigError) as e:
        load_config([str(p)])
    assert str(e.value).startswith(f"{p}: GPT-NeoX key '{key}' is not supported here: {why}"), str(e.value)
    assert "did you mean" not in str(e.value)


def test_pythia_model_parallel_size_is_noted_and_pads_the_vocabulary(tmp_path):
    """Pythia 6.9B/12B set model_parallel_size 2/4: the same model, sharded by ZeRO here; the derived
    vocabulary is padded to 128 x model_parallel_size as GPT-NeoX pads it (50277 ids -> 50688 at 4, the
    vocab_size of HF pythia-12b)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({f"w{i}": i for i in range(50276)} | {"<|endoftext|>": 50276}, unk_token="w0")
    )
    tok.save(str(tmp_path / "tok.json"))
    p = tmp_path / "mp.yml"
    p.write_text(
        ARCH.replace("vocab_size: 64\n", "") + f"train_iters: 2\nmodel_parallel_size: 4\n"
        f"pipe_parallel_size: 1\ntokenizer_type: HFTokenizer\nvocab_file: {tmp_path / 'tok.json'}\n"
    )
    cfg = load_config([str(p)])
    assert cfg.model.vocab_size == 50688 and cfg.no_effect == ["model_parallel_size=4"]


def test_check_neox_configs_tool_counts_and_gives_reasons(tmp_path, capsys):
    """tools/check_neox_configs.py: a full file passes, a partial one is refused with its reasons."""
    from megatron_topo.commands.check_neox_configs import main

    d = tmp_path / "configs"
    (d / "llama").mkdir(parents=True)
    (d / "small.yml").write_text(
        ARCH.replace("vocab_size: 64\n", "").replace("precision: fp32\n", "")
        + PYTHIA.replace("143000", "10")
        + '"model_parallel_size": 2\n'
    )
    (d / "llama" / "train_config.yml").write_text(
        '{"finetune": true, "train_micro_batch_size_per_gpu": 4, "train_iters": 10}\n'
    )
    assert main([str(d), "--world-size", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == (
        "| `llama/train_config.yml` | refused | num_layers, hidden_size, num_attention_heads, "
        "max_position_embeddings, seq_length are required (GPT-NeoX has no default for them); set "
        "them in a config file or with --set |"
    )
    assert out[3] == "| `small.yml` | passes |  |"
    assert out[-1] == "1 of 2 files pass (dry run, unchanged, vocab_size=50304, world size 2)"
