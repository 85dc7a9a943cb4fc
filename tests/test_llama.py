"""The llama model spec: logits equal HF LlamaForCausalLM / MistralForCausalLM (single process and
under every preset on 8 ranks, weights loaded from an HF folder), GPT-NeoX's MLP sizing rule, the
parameter counts of GPT-NeoX's Llama-family configs, sharded init equal to the whole model's."""

from __future__ import annotations

import pytest
import torch

from megatron_topo.config import ConfigError, ModelConfig, ZeroTopoConfig
from megatron_topo.model import build_model, num_params
from megatron_topo.model.hf import to_hf_state_dict
from megatron_topo.model.llama import mlp_width
from megatron_topo.model.spec import spec_for

from .dist_utils import run_distributed

LLAMA = dict(
    num_layers=2,
    hidden_size=48,
    num_attention_heads=6,
    seq_length=16,
    vocab_size=97,
    norm="rmsnorm",
    use_bias_in_norms=False,
    activation="swiglu",
    rms_norm_epsilon=1e-5,
    use_bias_in_attn_linear=False,
    use_bias_in_mlp=False,
    no_weight_tying=True,
    num_kv_heads=2,
    rotary_emb_base=500000,
)


def llama_cfg(**kw) -> ModelConfig:
    return ModelConfig(**{**LLAMA, **kw})


def hf_model(cfg, ours):
    transformers = pytest.importorskip("transformers")
    arch, d = spec_for(cfg).hf_config(cfg)
    hf = getattr(transformers, arch)(transformers.AutoConfig.for_model(**d)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict(), cfg=cfg), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return hf


@pytest.mark.parametrize(
    "kw",
    [
        {},  # GQA, untied, no biases (Llama 2 70B-like)
        dict(num_kv_heads=1, use_bias_in_attn_linear=True, use_bias_in_mlp=True),  # MQA, every bias
        dict(num_kv_heads=None, no_weight_tying=False, mlp_type="llama", activation="silu"),  # MHA, tied, LLaMA MLP
        dict(sliding_window_width=5),  # Mistral: window shorter than the sequence
    ],
    ids=["gqa", "mqa_bias", "mha_tied", "mistral_window"],
)
def test_logits_equal_hf(kw):
    cfg = llama_cfg(**kw)
    assert spec_for(cfg).name == "llama" and not spec_for(cfg).check(cfg)
    ours = build_model(cfg, seed=3).eval()
    with torch.no_grad():  # off the unit norms and zero biases, so a swapped tensor shows
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf = hf_model(cfg, ours)
    assert type(hf).__name__ == ("MistralForCausalLM" if kw.get("sliding_window_width") else "LlamaForCausalLM")
    assert num_params(ours) == sum(p.numel() for p in hf.parameters()) == spec_for(cfg).param_count(cfg)
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_sliding_window_changes_the_logits():
    a, b = llama_cfg(), llama_cfg(sliding_window_width=5)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x, y = build_model(a, seed=3)(ids), build_model(b, seed=3)(ids)
    assert torch.equal(x[:, :5], y[:, :5]) and not torch.allclose(x[:, 5:], y[:, 5:])


# GPT-NeoX's sizing (megatron/model/transformer.py) on the shapes of its own Llama configs, and the
# widths Meta's / Mistral's checkpoints have
@pytest.mark.parametrize(
    "h,kw,width",
    [
        (4096, dict(mlp_type="llama", activation="silu"), 11008),  # llama/7B.yml (LLaMAParallelMLP)
        (5120, dict(mlp_type="llama", activation="silu"), 13824),  # llama/13B.yml
        (8192, dict(mlp_type="llama", activation="silu"), 22016),  # llama/65B.yml, codellama_34B.yml
        (4096, dict(mlp_type="llama", activation="silu", intermediate_size=14336), 14336),  # mistral/7B.yml
        (6656, dict(activation="swiglu", intermediate_size=53248, mlp_multiple_of=256), 17920),  # llama/30B.yml
        (4096, dict(activation="swiglu", intermediate_size=32768, mlp_multiple_of=256), 11008),  # llama2/7B.yml
        (5120, dict(activation="swiglu", intermediate_size=41472, mlp_multiple_of=256), 13824),  # llama2/13B.yml
        (8192, dict(activation="swiglu", intermediate_size=86016, mlp_multiple_of=256), 28672),  # llama2/70B.yml
        (4096, dict(activation="swiglu"), 5461),  # swiglu, defaults: int(2/3 * 4h) // 2
    ],
)
def test_mlp_width_follows_gpt_neox(h, kw, width):
    cfg = ModelConfig(hidden_size=h, num_attention_heads=32, norm="rmsnorm", use_bias_in_norms=False, **kw)
    assert mlp_width(cfg) == width


def test_inconsistent_swiglu_width_is_one_clear_error(tmp_path):
    from megatron_topo.config import load_config

    p = tmp_path / "bad.yml"
    p.write_text(
        "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 16\nmax_position_embeddings: 16\n"
        "norm: rmsnorm\nuse_bias_in_norms: false\nactivation: swiglu\nintermediate_size: 17\n"
        "vocab_size: 128\nnum_kv_heads: 3\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config([str(p)])
    msg = str(e.value)
    assert "GPT-NeoX's sizing gives the MLP 12 outputs for 5 inputs" in msg
    assert "num_kv_heads 3 does not divide num_attention_heads 4" in msg


# The model keys of GPT-NeoX's Llama-family configs (configs/llama, llama2, llemma, mistral), vocab
# 32000 as their SentencePiece tokenizers give. Expected: the HF model of the same shape, counted on
# the meta device (mlp_bias as GPT-NeoX builds it: ParallelMLP's use_bias_in_mlp defaults to true,
# LLaMAParallelMLP has none).
_OLD = dict(mlp_type="llama", activation="silu")
NEOX_LLAMA = {
    "llama/7B": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=2048, **_OLD),
    "llama/13B": dict(num_layers=40, hidden_size=5120, num_attention_heads=40, seq_length=2048, **_OLD),
    "llama/30B": dict(
        num_layers=60,
        hidden_size=6656,
        num_attention_heads=52,
        seq_length=2048,
        intermediate_size=53248,
        activation="swiglu",
        mlp_multiple_of=256,
    ),
    "llama/65B": dict(num_layers=80, hidden_size=8192, num_attention_heads=64, seq_length=2048, **_OLD),
    "llama2/7B": dict(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        seq_length=4096,
        intermediate_size=32768,
        activation="swiglu",
        mlp_multiple_of=256,
    ),
    "llama2/13B": dict(
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        seq_length=4096,
        intermediate_size=41472,
        activation="swiglu",
        mlp_multiple_of=256,
    ),
    "llama2/70B": dict(
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        seq_length=4096,
        intermediate_size=86016,
        activation="swiglu",
        mlp_multiple_of=256,
        rotary_emb_base=1000000,
    ),
    "llama2/codellama_7B": dict(
        num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096, rotary_emb_base=1000000, **_OLD
    ),
    "llama2/codellama_34B": dict(
        num_layers=48,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        seq_length=4096,
        rotary_emb_base=1000000,
        **_OLD,
    ),
    "llemma/7B": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, seq_length=4096, **_OLD),
    "llemma/34B": dict(
        num_layers=48,
        hidden_size=8192,
        num_attention_heads=64,
        num_kv_heads=8,
        seq_length=4096,
        rotary_emb_base=1000000,
        **_OLD,
    ),
    "mistral/7B": dict(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        seq_length=8192,
        intermediate_size=14336,
        sliding_window_width=4096,
        **_OLD,
    ),
}
# published sizes of the bias-free ones (Meta's and Mistral's model cards / HF num_parameters())
PUBLISHED = {
    "llama/7B": 6_738_415_616,
    "llama/13B": 13_015_864_320,
    "llama2/codellama_34B": 33_743_970_304,
    "mistral/7B": 7_241_732_096,
}


@pytest.mark.parametrize("name", sorted(NEOX_LLAMA))
def test_neox_llama_configs_count_like_hf(name):
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig(
        vocab_size=32000,
        norm="rmsnorm",
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        no_weight_tying=True,
        **NEOX_LLAMA[name],
    )
    spec = spec_for(cfg)
    assert spec.name == "llama" and not spec.check(cfg)
    ours = build_model(cfg, device="meta")
    want = spec.param_count(cfg)
    assert num_params(ours) == want == sum(spec.unit_numels(cfg))
    arch, d = spec.hf_config(cfg)
    with torch.device("meta"):
        hf = getattr(transformers, arch)(transformers.AutoConfig.for_model(**d))
    assert sum(p.numel() for p in hf.parameters()) == want
    if name in PUBLISHED:
        assert want == PUBLISHED[name]
    if cfg.activation == "swiglu":  # GPT-NeoX's ParallelMLP keeps its biases unless use_bias_in_mlp: false
        assert want - spec.param_count(ModelConfig(**{**vars(cfg), "use_bias_in_mlp": False})) == cfg.num_layers * (
            2 * mlp_width(cfg) + cfg.hidden_size
        )


def test_sharded_init_equals_whole_model_init():
    cfg = llama_cfg(no_weight_tying=False)
    whole = build_model(cfg, seed=11)
    meta = build_model(cfg, device="meta")
    for u in meta.shard_units():
        u.to_empty(device="cpu")
        meta.init_parameters(u, 11)
    got = dict(meta.named_parameters())
    for n, p in whole.named_parameters():
        assert torch.equal(got[n], p), n
    out = dict(whole.named_parameters())
    std_in = float(out["layers.0.self_attn.q_proj.weight"].detach().std())
    std_out = float(out["layers.1.mlp.down_proj.weight"].detach().std())
    assert abs(std_in - 0.02) < 0.004 and abs(std_out - 0.02 / 2) < 0.003  # normal / scaled_normal (2 layers)
    assert torch.equal(out["head.norm.weight"], torch.ones(48))


def _presets(rank, world, hf_dir, ids):
    from megatron_topo.config.hf_config import model_keys_from_hf, read_hf_config
    from megatron_topo.topology import Topology
    from megatron_topo.zero_topo.checkpoint.weights import load_hf_into_engine
    from megatron_topo.zero_topo.comm import Comm
    from megatron_topo.zero_topo.engine import ZeroTopoEngine
    from megatron_topo.zero_topo.sharding import PRESETS, resolve_plan

    from .engine_cases import make_engine, reference, train_steps

    cfg = ModelConfig(seq_length=16, **model_keys_from_hf(read_hf_config(hf_dir), hf_dir))
    topo = Topology(world, 2, 2)
    out = {}
    for preset in PRESETS:
        plan = resolve_plan(ZeroTopoConfig(preset=preset, weight_bits=16, secondary_bits=16, grad_bits=16), topo)
        model = build_model(cfg, device="meta")
        model.init_buffers("cpu")
        eng = ZeroTopoEngine(
            model,
            model.shard_units(),
            plan,
            Comm(topo, rank),
            device="cpu",
            init=lambda u, m=model: m.init_parameters(u, 1),
        )
        load_hf_into_engine(eng, hf_dir, cfg)
        eng.eval()
        with torch.no_grad():
            logits = eng(ids).clone()
        eng.train()
        eng.remove_hooks()
        eng = make_engine(
            rank, world, ZeroTopoConfig(preset=preset, weight_bits=16, secondary_bits=16, grad_bits=16), cfg=cfg
        )
        train_steps(eng, rank, steps=2)
        out[preset] = (logits, eng.full_parameters())
        eng.remove_hooks()
    return out, (reference(world, steps=2, cfg=cfg) if rank == 0 else None)


def test_logits_equal_hf_and_training_equals_reference_under_every_preset_on_8_ranks(tmp_path):
    """An HF Llama folder (GQA, untied) loaded into the sharded engine gives HF's logits under
    every preset; two training steps of the llama model equal the unsharded reference."""
    cfg = llama_cfg(vocab_size=101)
    ours = build_model(cfg, seed=5).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf = hf_model(cfg, ours)
    hf.save_pretrained(str(tmp_path / "hf"))
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    results = run_distributed(_presets, 8, str(tmp_path / "hf"), ids)
    ref = results[0][1]
    for rank in (0, 7):
        for preset, (logits, params) in results[rank][0].items():
            torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{preset}: {m}")
            for n, w in ref.items():
                torch.testing.assert_close(params[n], w, rtol=1e-5, atol=1e-6, msg=lambda m: f"{preset} {n}: {m}")


# GPT-NeoX's Llama-family config files as they write them (every model key of the upstream files;
# their training keys are other tests' business): accepted unchanged, with vocab_size supplied as
# the SentencePiece tokenizer would give it.
NEOX_COMMON = """\
{{
  "pipe_parallel_size": 1, "model_parallel_size": 1, "make_vocab_size_divisible_by": 1,
  "max_position_embeddings": {seq}, "pos_emb": "rotary", "rotary_pct": 1, "no_weight_tying": true,
  "gpt_j_residual": false, "output_layer_parallelism": "column", "norm": "rmsnorm", "rms_norm_epsilon": 1.0e-5,
  "attention_config": [[["flash"], {layers}]], "scaled_upper_triang_masked_softmax_fusion": true,
  "bias_gelu_fusion": false, "use_bias_in_norms": false, "use_bias_in_attn_linear": false,
  "vocab_size": 32000, "train_micro_batch_size_per_gpu": 1,
{model}
}}
"""


def _neox_file(tmp_path, name):
    import json

    keys = dict(NEOX_LLAMA[name])
    body = ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in keys.items())
    p = tmp_path / (name.replace("/", "_") + ".yml")
    p.write_text(NEOX_COMMON.format(seq=keys["seq_length"], layers=keys["num_layers"], model=body))
    return p


@pytest.mark.parametrize("name", sorted(NEOX_LLAMA))
def test_neox_llama_files_load_unchanged(tmp_path, name):
    from megatron_topo.config import load_config

    cfg = load_config([str(_neox_file(tmp_path, name))])
    spec = spec_for(cfg.model)
    assert spec.name == "llama"
    assert spec.param_count(cfg.model) == num_params(build_model(cfg.model, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama2/70B", "mistral/7B"])
def test_neox_llama_files_dry_run_at_8_ranks(tmp_path, name):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "train.py"),
            str(_neox_file(tmp_path, name)),
            "--dry-run",
            "--world-size",
            "8",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    cfg = ModelConfig(
        vocab_size=32000,
        norm="rmsnorm",
        use_bias_in_norms=False,
        use_bias_in_attn_linear=False,
        no_weight_tying=True,
        **NEOX_LLAMA[name],
    )
    assert report["parameters"] == spec_for(cfg).param_count(cfg)


def test_frontier_llama_20b_config():
    import os

    from megatron_topo.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config([os.path.join(root, "configs", n) for n in ("llama_20B.yml", "topo.yml", "frontier.yml")])
    m = cfg.model
    assert spec_for(m).name == "llama" and (m.num_layers, m.hidden_size, m.num_kv_heads, mlp_width(m)) == (
        48,
        6144,
        8,
        17920,
    )
    assert spec_for(m).param_count(m) == num_params(build_model(m, device="meta")) == 20_702_631_936


@pytest.mark.parametrize(
    "kw,arch,problem",
    [
        (dict(), "gpt_neox", None),
        (dict(norm="rmsnorm", use_bias_in_norms=False, activation="swiglu"), "llama", None),
        (dict(mlp_type="llama", activation="silu", norm="rmsnorm", use_bias_in_norms=False), "llama", None),
        (dict(arch="gpt_neox", norm="rmsnorm"), "gpt_neox", "arch: gpt_neox builds LayerNorm"),
        (dict(activation="swiglu"), "llama", "norm='layernorm' with a gated MLP"),
        (dict(norm="rmsnorm", activation="swiglu"), "llama", "use_bias_in_norms=true is not valid with norm: rmsnorm"),
        (
            dict(norm="rmsnorm", use_bias_in_norms=False, activation="silu"),
            "llama",
            "activation='silu' with mlp_type='regular' is not valid",
        ),
        (dict(num_kv_heads=2), "gpt_neox", "num_kv_heads 2 is not valid for the gpt_neox architecture"),
        (dict(sliding_window_width=8), "gpt_neox", "sliding_window_width is not valid for the gpt_neox"),
        (dict(use_bias_in_mlp=False), "gpt_neox", "use_bias_in_mlp=false is not valid for the gpt_neox"),
        (
            dict(norm="rmsnorm", use_bias_in_norms=False, activation="swiglu", gpt_j_residual=True),
            "llama",
            "gpt_j_residual=true is not valid for the llama",
        ),
    ],
)
def test_the_spec_is_derived_from_neox_keys_and_checks_them(kw, arch, problem):
    cfg = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **kw)
    spec = spec_for(cfg)
    assert spec.name == arch
    problems = spec.check(cfg)
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


def test_llama_dry_run_counts_activations_with_its_spec():
    from megatron_topo.config import Config
    from megatron_topo.dryrun import dry_run

    cfg = Config()
    cfg.model = llama_cfg(checkpoint_activations=True)
    r = dry_run(cfg, 8)
    spec = spec_for(cfg.model)
    assert r["parameters"] == spec.param_count(cfg.model)
    mb = cfg.train.train_micro_batch_size_per_gpu
    assert r["estimate_bytes_per_rank"]["activations"] == spec.activation_bytes(cfg.model, mb, cfg.precision, True)
    # GPT-NeoX's layer through the same accounting: 34 s b h + 5 a s^2 b (the memory module's formula)
    from megatron_topo.zero_topo.memory import activation_bytes

    neox = ModelConfig(
        num_layers=3,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=32,
        vocab_size=128,
        norm="rmsnorm",
        use_bias_in_norms=False,
        activation="swiglu",
        intermediate_size=384,
    )
    assert mlp_width(neox) == 128  # swiglu: int(384 * 2/3) // 2
    got = spec_for(neox).activation_bytes(neox, 2, "bf16", False)
    s, b, h, f = 32, 2, 64, 128
    per_layer = s * b * (14 * h + 4 * h + 8 * f) + 5 * 4 * s * s * b
    assert got == 3 * per_layer + b * s * 128 * (2 + 4 + 4)
    assert (
        activation_bytes(64, 4, 3, 32, 128, 2, "bf16", False)
        == 3 * (s * b * h * 34 + 5 * 4 * s * s * b) + b * s * 128 * 10
    )


def test_activation_checkpointing_same_gradients():
    cfg = llama_cfg()
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    grads = []
    for ckpt in (False, True):
        model = build_model(cfg, seed=1)
        model.checkpoint_activations = ckpt
        model.train()
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "bad,needle",
    [
        ({}, "hidden_size: missing"),
        (dict(rms_norm_eps="abc"), "rms_norm_eps: expected a finite number > 0, got str 'abc'"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' (ours is silu)"),
        (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}), "rope_type 'llama3' is not supported"),
    ],
)
def test_unreadable_hf_llama_config_is_one_line(bad, needle):
    from megatron_topo.config.hf_config import model_keys_from_hf

    hf = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "vocab_size": 50,
    }
    hf = {} if not bad else {**hf, **bad}
    with pytest.raises(ConfigError) as e:
        model_keys_from_hf({"model_type": "llama", **hf}, "hf/config.json")
    assert "\n" not in str(e.value) and needle in str(e.value) and str(e.value).startswith("hf/config.json: ")


def test_flops_are_gpt_neox_formula_with_the_layers_own_weights():
    from megatron_topo.metrics import flops_per_iteration
    from megatron_topo.model.gpt_neox import gpt_flops

    # MHA + an MLP of inner width 8h/3 has GPT-NeoX's 12 h^2 matmul weights per layer: the same count
    cfg = ModelConfig(
        num_layers=3,
        hidden_size=96,
        num_attention_heads=4,
        seq_length=64,
        vocab_size=500,
        norm="rmsnorm",
        use_bias_in_norms=False,
        mlp_type="llama",
        activation="silu",
        intermediate_size=256,
    )
    spec = spec_for(cfg)
    assert spec.layer_matmul_params(cfg) == 12 * 96 * 96
    assert spec.forward_flops(cfg, 8, passes=3.0) == pytest.approx(gpt_flops(3.0, 8, 64, 3, 96, 500), rel=1e-12)
    # grouped-query attention removes 2 h (h - kv width) weights per layer, and the logged TFLOPS follow
    gqa = ModelConfig(**{**vars(cfg), "num_kv_heads": 1})
    assert spec.layer_matmul_params(gqa) == 12 * 96 * 96 - 2 * 96 * (96 - 24)
    assert flops_per_iteration(gqa, 8, True) == pytest.approx(spec.forward_flops(gqa, 8, passes=4.0), rel=1e-12)
    assert flops_per_iteration(gqa, 8, True) < flops_per_iteration(cfg, 8, True)
