"""A GPT-NeoX / DeepSpeed checkpoint folder given to finetune_from / load is recognised: the
layer_XX-model_00 files of a model-parallel-1 run are imported (weights bit for bit, step 0, a
fresh optimizer), anything else is refused in one line naming the conversion path. The folder is
built here with torch.save of GPT-NeoX's layer state-dict keys (its GPT2ModelPipe layer list:
0 embedding, 2..L+1 transformer layers, L+3 final norm, L+4 final_linear)."""

from __future__ import annotations

import os

import pytest
import torch

from megatron_topo.config import ConfigError, ModelConfig, load_config
from megatron_topo.model import build_model

ARCH = dict(
    num_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    max_position_embeddings=16,
    vocab_size=64,
    rotary_pct=0.25,
    gpt_j_residual=True,
    no_weight_tying=True,
)


def neox_layer_files(model, layers: int) -> dict:
    """{file name: state dict} as GPT-NeoX's pipeline engine saves a model-parallel-1 run."""
    sd = {k: v.detach().clone().half() for k, v in model.state_dict().items()}
    files = {"layer_00-model_00-model_states.pt": {"word_embeddings.weight": sd["embed_in.weight"]}}
    for i in range(layers):
        pre = f"layers.{i}."
        layer = {k[len(pre) :]: v for k, v in sd.items() if k.startswith(pre) and "rotary" not in k}
        layer["attention.rotary_emb.inv_freq"] = torch.ones(2)  # a buffer GPT-NeoX saves too
        files[f"layer_{i + 2:02d}-model_00-model_states.pt"] = layer
    files[f"layer_{layers + 3:02d}-model_00-model_states.pt"] = {
        "norm.weight": sd["head.final_layer_norm.weight"],
        "norm.bias": sd["head.final_layer_norm.bias"],
    }
    files[f"layer_{layers + 4:02d}-model_00-model_states.pt"] = {"final_linear.weight": sd["head.embed_out.weight"]}
    return files


def write_neox(root, files, step=7):
    d = root / f"global_step{step}"
    d.mkdir(parents=True)
    for name, sd in files.items():
        torch.save(sd, d / name)
    torch.save({"iteration": step, "module": None}, d / "mp_rank_00_model_states.pt")
    (root / "latest").write_text(f"global_step{step}")
    return str(root)


def config(tmp_path, extra):
    p = tmp_path / "ft.yml"
    p.write_text(
        "".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in ARCH.items())
        + "train_micro_batch_size_per_gpu: 2\ntrain_iters: 2\nprecision: fp32\nlog_interval: 1\n"
        f"eval_interval: 0\nprogress_bar: false\nlog_dir: {tmp_path / 'run'}\n" + extra
    )
    return str(p)


@pytest.fixture
def neox(tmp_path):
    torch.manual_seed(5)
    model = build_model(ModelConfig(**ARCH), seed=3)
    with torch.no_grad():
        for p in model.parameters():  # off the init defaults, exactly representable in fp16
            p.copy_((p + torch.randn_like(p) * 0.05).half().float())
    files = neox_layer_files(model, ARCH["num_layers"])
    assert {k for sd in files.values() for k in sd} >= {
        "word_embeddings.weight",
        "attention.query_key_value.weight",
        "mlp.dense_4h_to_h.bias",
        "norm.weight",
        "final_linear.weight",
    }
    return model, write_neox(tmp_path / "neox_ck", files)


def test_neox_layer_files_are_imported_bit_for_bit(neox, tmp_path):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets

    model, ck = neox
    cfg = load_config([config(tmp_path, f"finetune_from: {ck}\n")])
    tr = Trainer(cfg, Runtime(0, 1, 0, Topology(1, 1, 1), torch.device("cpu"), False), datasets=datasets(cfg))
    assert tr.state.step == 0
    got = tr.engine.full_parameters()
    want = dict(model.named_parameters())
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k].float(), v.detach()), k
    tr.train()
    assert tr.state.step == 2
    # load + finetune: true is the same start
    cfg2 = load_config([config(tmp_path, f"load: {ck}\nfinetune: true\n")])
    assert cfg2.checkpoint.load == ck


def test_other_neox_checkpoints_are_refused_naming_the_conversion(neox, tmp_path):
    _, ck = neox
    with pytest.raises(ConfigError) as e:  # resuming needs DeepSpeed's optimizer shards
        load_config([config(tmp_path, f"load: {ck}\n")])
    assert str(e.value).startswith(f"load {ck}: a GPT-NeoX/DeepSpeed checkpoint (global_step7); its optimizer state")
    assert "set finetune: true" in str(e.value) and "\n" not in str(e.value)
    torch.save(
        {"word_embeddings.weight": torch.zeros(32, 32)},
        os.path.join(ck, "global_step7", "layer_00-model_01-model_states.pt"),
    )
    with pytest.raises(ConfigError) as e:
        load_config([config(tmp_path, f"finetune_from: {ck}\n")])
    assert str(e.value) == (
        f"finetune_from {ck}: a GPT-NeoX checkpoint of model-parallel size 2 (global_step7); only "
        f"model-parallel-1 checkpoints are imported here: convert it with GPT-NeoX's "
        f"tools/ckpts/convert_neox_to_hf.py (it merges model-parallel shards) and give the HF "
        f"folder as finetune_from"
    )


def test_a_neox_checkpoint_of_another_shape_is_one_line(neox, tmp_path):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets

    _, ck = neox
    p = config(tmp_path, f"finetune_from: {ck}\n")
    text = open(p).read()
    open(p, "w").write(text.replace("num_layers: 2", "num_layers: 1"))
    cfg = load_config([p])
    with pytest.raises(
        ConfigError,
        match=r"GPT-NeoX layer 3 tensor 'input_layernorm.weight' has no place in this "
        r"model \(num_layers 1",
    ):
        Trainer(cfg, Runtime(0, 1, 0, Topology(1, 1, 1), torch.device("cpu"), False), datasets=datasets(cfg))
