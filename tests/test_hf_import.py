"""Continue training from a HuggingFace GPT-NeoX folder (finetune_from / load of an HF folder):
the architecture comes from its config.json, the weights go into the sharded engine unit by unit,
step 0 and a fresh optimizer; the engine's step-0 logits equal the HF model's."""

from __future__ import annotations

import os

import pytest
import torch

from megatron_topo.config import ConfigError, load_config

from .dist_utils import run_distributed

HF_KW = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    rotary_pct=0.25,
    max_position_embeddings=64,
    use_parallel_residual=True,
    tie_word_embeddings=False,
)


def make_hf(path, safe=True, **kw):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(7)
    hf = GPTNeoXForCausalLM(GPTNeoXConfig(**{**HF_KW, **kw})).eval()
    with torch.no_grad():  # every tensor off its default (zero biases, unit LayerNorms) so a mix-up shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(str(path))
    if not safe:  # the older pytorch_model.bin layout (transformers 5 only writes safetensors)
        os.remove(os.path.join(path, "model.safetensors"))
        torch.save({k: v.contiguous() for k, v in hf.state_dict().items()}, os.path.join(path, "pytorch_model.bin"))
    return hf


def write_cfg(tmp, hf_dir, preset, extra=""):
    p = tmp / f"ft_{preset}.yml"
    p.write_text(
        f"finetune_from: {hf_dir}\nseq_length: 16\ntrain_micro_batch_size_per_gpu: 2\ntrain_iters: 2\n"
        f"precision: fp32\noptimizer: {{params: {{lr: 1.0e-3, eps: 1.0e-4}}}}\n"
        f"log_dir: {tmp / ('run_' + preset)}\nlog_interval: 1\neval_interval: 0\nprogress_bar: false\n"
        f"zero_topo: {{preset: {preset}, weight_bits: 16, secondary_bits: 16, grad_bits: 16}}\n" + extra
    )
    return str(p)


def fresh_optimizer(tr) -> bool:
    opt = tr.engine.optimizer
    return all(
        float(opt.opt.state[p]["step"]) == 0
        and not opt.opt.state[p]["exp_avg"].any()
        and not opt.opt.state[p]["exp_avg_sq"].any()
        for p in opt.params
    )


def IDS(vocab):
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(3))


def _finetune(rank, world, cfg_path, topo_shape):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets

    cfg = load_config([cfg_path])
    rt = Runtime(rank, world, rank, Topology(world, *topo_shape), torch.device("cpu"), world > 1)
    tr = Trainer(cfg, rt, datasets=datasets(cfg))
    assert tr.state.step == 0 and tr.weights_from == cfg.checkpoint.finetune_from
    assert fresh_optimizer(tr)
    tr.engine.eval()
    with torch.no_grad():
        logits = tr.engine(IDS(cfg.model.vocab_size)).detach().clone()
    last = tr.train()
    return logits, tr.state.step, float(last["loss"]), tr.plan.preset, cfg.model


def _check(hf, results, preset):
    want = hf(IDS(HF_KW["vocab_size"])).logits
    for logits, step, loss, got_preset, model in results:
        torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
        assert step == 2 and loss == loss and got_preset == preset
        assert (
            model.num_layers,
            model.hidden_size,
            model.vocab_size,
            model.rotary_pct,
            model.gpt_j_residual,
            model.no_weight_tying,
        ) == (2, 32, 96, 0.25, True, True)  # taken from the HF config


def test_hf_folder_continues_under_topo_on_4_ranks(tmp_path):
    hf = make_hf(tmp_path / "hf")
    cfg = write_cfg(tmp_path, tmp_path / "hf", "topo")
    results = run_distributed(_finetune, 4, cfg, (2, 2))
    with torch.no_grad():
        _check(hf, results, "topo")


def test_hf_bin_folder_continues_under_ddp_on_1_rank_via_load(tmp_path):
    hf = make_hf(tmp_path / "hfbin", safe=False, use_parallel_residual=False, tie_word_embeddings=True)
    assert os.path.isfile(tmp_path / "hfbin" / "pytorch_model.bin")
    p = tmp_path / "ddp.yml"
    p.write_text(open(write_cfg(tmp_path, tmp_path / "hfbin", "ddp")).read().replace("finetune_from:", "load:"))
    cfg = load_config([str(p)])
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets

    tr = Trainer(cfg, Runtime(0, 1, 0, Topology(1, 1, 1), torch.device("cpu"), False), datasets=datasets(cfg))
    assert tr.state.step == 0 and not cfg.model.gpt_j_residual and not cfg.model.no_weight_tying
    tr.engine.eval()
    with torch.no_grad():
        got = tr.engine(IDS(96))
        torch.testing.assert_close(got, hf(IDS(96)).logits, rtol=1e-5, atol=1e-5)
    tr.train()
    assert tr.state.step == 2


def test_model_keys_that_differ_from_the_hf_config_are_named(tmp_path):
    make_hf(tmp_path / "hf")
    cfg = write_cfg(tmp_path, tmp_path / "hf", "ddp", "hidden_size: 64\nrotary_pct: 1.0\nnum_layers: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config([cfg])
    msg = str(e.value)
    assert "\n" not in msg and "hidden_size: config 64 vs HF 32" in msg and "rotary_pct: config 1.0 vs HF 0.25" in msg
    assert "num_layers" not in msg  # it agrees


def test_finetune_from_our_checkpoint_is_weights_only_at_step_0(tmp_path):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets, small_config

    rt = Runtime(0, 1, 0, Topology(1, 1, 1), torch.device("cpu"), False)
    cfg = small_config(tmp_path, **{"train.train_iters": 3})
    cfg.checkpoint.save = str(tmp_path / "ck")
    first = Trainer(cfg, rt, datasets=datasets(cfg))
    first.train()
    want = first.engine.full_parameters()
    for finetune, step in ((True, 0), (False, 3)):  # finetune: step 0; no_load_optim alone keeps the step
        cfg2 = small_config(tmp_path, **{"train.train_iters": 5})
        cfg2.logging.log_dir = str(tmp_path / f"run{finetune}")
        cfg2.checkpoint.load, cfg2.checkpoint.finetune, cfg2.checkpoint.no_load_optim = (
            str(tmp_path / "ck"),
            finetune,
            True,
        )
        tr = Trainer(cfg2, rt, datasets=datasets(cfg2))
        assert tr.state.step == step
        assert fresh_optimizer(tr)
        got = tr.engine.full_parameters()
        for n in want:
            assert torch.equal(got[n], want[n]), n
