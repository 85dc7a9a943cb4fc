"""HF export and import of the llama spec, and config.json readable by every transformers version:
a trained Llama (or Mistral) checkpoint exported by tools/convert_to_hf.py loads as HF
LlamaForCausalLM / MistralForCausalLM with our logits, and the folder imported back (finetune_from)
gives them again; the rotary settings are written under the legacy key names transformers 4.x
reads (rotary_pct / rotary_emb_base for GPT-NeoX, rope_theta for Llama) and the 5.x ones, in
agreement, so either set alone builds the same model."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_topo.commands import convert_to_hf, generate
from megatron_topo.config import ModelConfig
from megatron_topo.training import Trainer

from .train_utils import datasets, local_runtime, small_config

transformers = pytest.importorskip("transformers")

LLAMA = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    vocab_size=96,
    norm="rmsnorm",
    use_bias_in_norms=False,
    activation="swiglu",
    num_kv_heads=2,
    rms_norm_epsilon=1e-5,
    use_bias_in_attn_linear=False,
    use_bias_in_mlp=True,
    no_weight_tying=True,
    rotary_emb_base=50000,
    intermediate_size=96,
)  # GPT-NeoX's swiglu sizing: inner width int(96 * 2/3) // 2 = 32
# the 5.x names: dropping them leaves what transformers 4.38 / 4.57 read (they do not know these)
V5_KEYS = ("rope_parameters", "partial_rotary_factor")


def _train(tmp, model: ModelConfig, steps=2):
    cfg = small_config(tmp, **{"train.train_iters": steps})
    cfg.model = model
    cfg.checkpoint.save = str(tmp / "ck")
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)
    tr.train(until=steps)
    return tr


def _ids(vocab):
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(9))


def _ours(tr, vocab):
    tr.engine.eval()
    with torch.no_grad():
        return tr.engine(_ids(vocab)).detach().clone()


def _hf_from(folder, drop=()):
    """The HF model of ``folder`` with its config.json read without the keys ``drop``."""
    with open(f"{folder}/config.json") as f:
        d = json.load(f)
    for k in drop:
        d.pop(k, None)
    arch = d["architectures"][0]
    conf = transformers.AutoConfig.for_model(**{k: v for k, v in d.items() if k != "architectures"})
    hf = getattr(transformers, arch).from_pretrained(folder, config=conf).eval()
    return hf, d


@pytest.mark.parametrize("window", [None, 6], ids=["llama", "mistral"])
def test_llama_export_loads_in_hf_and_imports_back(tmp_path, window):
    kw = dict(LLAMA, sliding_window_width=window) if window else LLAMA
    if window:  # MistralForCausalLM has no biases
        kw = dict(kw, use_bias_in_mlp=False)
    tr = _train(tmp_path, ModelConfig(**kw))
    want = _ours(tr, 96)
    model, _ = generate.load_model(str(tmp_path / "ck"))  # tools/generate.py builds the checkpoint's spec
    with torch.no_grad():
        torch.testing.assert_close(model(_ids(96)), want, rtol=1e-5, atol=1e-5)
    out = tmp_path / "hf"
    assert convert_to_hf.main(["--checkpoint", str(tmp_path / "ck"), "--output", str(out)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == ("MistralForCausalLM" if window else "LlamaForCausalLM")
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=_ids(96)).logits, want, rtol=1e-5, atol=1e-5)
    # legacy names alone (transformers 4.x: rope_theta, no rope_parameters) build the same model
    legacy, d = _hf_from(str(out), drop=V5_KEYS)
    assert d["rope_theta"] == 50000.0 and d["rope_scaling"] is None
    with torch.no_grad():
        torch.testing.assert_close(legacy(input_ids=_ids(96)).logits, want, rtol=1e-5, atol=1e-5)
    # and back: the exported folder is a starting point (finetune_from) with the same logits
    cfg = small_config(tmp_path, **{"train.train_iters": 1})
    cfg.checkpoint.finetune_from = str(out)
    from megatron_topo.config.hf_config import apply_hf_model_config

    assert apply_hf_model_config(cfg, str(out), origin={"seq_length": 1}) == []
    for k, v in kw.items():
        assert getattr(cfg.model, k) == v, (k, getattr(cfg.model, k), v)  # every architecture key comes back
    cfg.logging.log_dir = str(tmp_path / "ft")
    back = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)
    assert back.state.step == 0
    torch.testing.assert_close(_ours(back, 96), want, rtol=1e-5, atol=1e-5)


def test_gpt_neox_config_json_has_the_legacy_rotary_keys(tmp_path):
    """rotary_pct 1.0 is not transformers 4.x's default (0.25): without rotary_pct in config.json
    4.38 / 4.57 build another model (logits off by up to 0.24 in the issue). Read with the 4.x
    names only, the export gives our logits."""
    m = ModelConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=16,
        vocab_size=96,
        rotary_pct=1.0,
        rotary_emb_base=20000,
        gpt_j_residual=False,
        no_weight_tying=True,
    )
    tr = _train(tmp_path, m)
    want = _ours(tr, 96)
    out = tmp_path / "hf"
    assert convert_to_hf.main(["--checkpoint", str(tmp_path / "ck"), "--output", str(out)]) == 0
    with open(out / "config.json") as f:
        d = json.load(f)
    # as transformers 4.38's GPTNeoXConfig.__init__ reads it: rotary_pct, rotary_emb_base, rope_scaling
    assert (d["rotary_pct"], d["rotary_emb_base"], d["rope_scaling"]) == (1.0, 20000, None)
    # and 5.x's names agree
    assert d["rope_parameters"]["partial_rotary_factor"] == d["partial_rotary_factor"] == 1.0
    assert d["rope_parameters"]["rope_theta"] == d["rope_theta"] == 20000.0
    for drop in (V5_KEYS + ("rope_theta",), ("rotary_pct", "rotary_emb_base")):
        hf, _ = _hf_from(str(out), drop=drop)
        with torch.no_grad():
            torch.testing.assert_close(hf(input_ids=_ids(96)).logits, want, rtol=1e-5, atol=1e-5)


def test_resume_refuses_another_llama_architecture(tmp_path):
    """The llama spec's arch_keys guard a resume: another sliding window or RMSNorm epsilon (same
    tensor shapes, another function) is refused before anything is loaded."""
    from megatron_topo.zero_topo.checkpoint import CheckpointError

    _train(tmp_path, ModelConfig(**LLAMA), steps=1)
    for change in (dict(sliding_window_width=4), dict(rms_norm_epsilon=1e-6)):
        cfg = small_config(tmp_path, **{"train.train_iters": 3})
        cfg.model = ModelConfig(**{**LLAMA, **change})
        cfg.checkpoint.load = str(tmp_path / "ck")
        cfg.logging.log_dir = str(tmp_path / "again")
        with pytest.raises(CheckpointError) as e:
            Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg), log=lambda *a, **k: None)
        key = next(iter(change))
        assert "the model config differs from the checkpoint's" in str(e.value) and key in str(e.value)
