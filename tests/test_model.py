"""The model equals HuggingFace GPT-NeoX given the same weights; the 20B shape has the right size."""

import os

import pytest
import torch

from megatron_topo.config import ModelConfig, load_config
from megatron_topo.model import build_model, num_params
from megatron_topo.model.hf import hf_config_kwargs, hf_head_name, to_hf_state_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("rotary_pct", [0.25, 1.0])
def test_logits_match_huggingface(parallel, rotary_pct):
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=32,
        vocab_size=101,
        rotary_pct=rotary_pct,
        gpt_j_residual=parallel,
    )
    ours = build_model(cfg, seed=3).eval()
    # perturb biases and norms so a swapped name or layout cannot hide behind zeros/ones
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    hf_cfg = transformers.GPTNeoXConfig(**hf_config_kwargs(cfg))
    hf = transformers.GPTNeoXForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict(), hf_head_name(hf)), strict=False)
    assert not unexpected and all("rotary" in m or "masked_bias" in m for m in missing), (missing, unexpected)
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = ours(ids)
        b = hf(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_20b_parameter_count_on_meta():
    cfg = load_config([os.path.join(ROOT, "configs", "20B.yml")])
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size, m.seq_length) == (
        44,
        6144,
        64,
        50432,
        2048,
    )
    assert m.rotary_pct == 0.25 and m.gpt_j_residual
    model = build_model(m, device="meta")
    assert num_params(model) == 20_554_567_680
    assert all(p.device.type == "meta" for p in model.parameters())


def test_activation_checkpointing_same_gradients():
    cfg = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, vocab_size=50)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 16))
    grads = []
    for ckpt in (False, True):
        model = build_model(cfg, seed=1)
        model.checkpoint_activations = ckpt
        model.train()
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
