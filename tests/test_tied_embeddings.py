"""Tied input/output embeddings (GPT-NeoX's default, ``no_weight_tying: false``): the shared weight
is sharded once, by the embedding unit, which the head gathers whenever it computes. Every plan
equals the unsharded tied reference; sharded init keeps the tie and the reference's values."""

import torch

from megatron_topo.config import ModelConfig, ZeroTopoConfig
from megatron_topo.zero_topo.sharding import PRESETS

from .dist_utils import run_distributed
from .engine_cases import make_engine, reference, tiny_cfg, train_steps

UNQUANTIZED = dict(weight_bits=16, secondary_bits=16, grad_bits=16)


def _run(rank, world):
    out = {}
    for name in PRESETS:
        eng = make_engine(rank, world, ZeroTopoConfig(preset=name, **UNQUANTIZED), cfg=tiny_cfg(no_weight_tying=False))
        m = eng.module
        assert m.head.embed_out.weight is m.embed_in.weight
        train_steps(eng, rank)
        out[name] = eng.full_parameters()
        assert m.head.embed_out.weight is m.embed_in.weight
        eng.remove_hooks()
    return out


def test_tied_embeddings_match_the_tied_reference_under_every_plan():
    world = 8
    got = run_distributed(_run, world)
    ref = reference(world, cfg=tiny_cfg(no_weight_tying=False))
    assert "head.embed_out.weight" not in ref  # one parameter, under its first name
    for name in PRESETS:
        for rank in (0, world - 1):
            assert got[rank][name].keys() == ref.keys(), name
            for pname, want in ref.items():
                torch.testing.assert_close(
                    got[rank][name][pname], want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} rank {rank} {pname}: {m}"
                )


def _sharded_init(rank, world):
    from megatron_topo.model import build_model
    from megatron_topo.topology import Topology
    from megatron_topo.zero_topo.comm import Comm
    from megatron_topo.zero_topo.engine import ZeroTopoEngine
    from megatron_topo.zero_topo.sharding import resolve_plan

    cfg = ModelConfig(**{**tiny_cfg().__dict__, "no_weight_tying": False})
    model = build_model(cfg, device="meta")
    model.init_buffers("cpu")
    topo = Topology(world, 2, world // 2)
    eng = ZeroTopoEngine(
        model,
        model.shard_units(),
        resolve_plan(ZeroTopoConfig(preset="topo"), topo),
        Comm(topo, rank),
        device="cpu",
        init=lambda u: model.init_parameters(u, 5),
    )
    assert model.head.embed_out.weight is model.embed_in.weight
    return eng.full_parameters()


def test_sharded_init_keeps_the_tie_and_the_values():
    from megatron_topo.model import build_model

    got = run_distributed(_sharded_init, 4)[0]
    want = dict(
        build_model(ModelConfig(**{**tiny_cfg().__dict__, "no_weight_tying": False}), seed=5).named_parameters()
    )
    assert got.keys() == want.keys()
    for n, p in want.items():
        assert torch.equal(got[n], p.detach()), n


def _train_tied(rank, world, tmp, load, steps):
    from megatron_topo.topology import Topology
    from megatron_topo.training import Runtime, Trainer

    from .train_utils import datasets, small_config

    cfg = small_config(tmp, **{"train.train_iters": steps})
    cfg.model.no_weight_tying = False
    cfg.zero_topo.preset = "topo" if world > 1 else "ddp"
    cfg.zero_topo.quant_block_size = cfg.zero_topo.grad_quant_block_size = 64
    cfg.logging.log_dir = str(tmp / f"run{world}")
    cfg.checkpoint.save, cfg.checkpoint.load = str(tmp / f"ck{world}"), load
    if load is not None:  # resharded onto another world size: the global batch changes on purpose
        cfg.train.train_batch_size = cfg.train.train_micro_batch_size_per_gpu * world
    rt = Runtime(
        rank, world, rank, Topology(world, 2 if world > 1 else 1, max(1, world // 2)), torch.device("cpu"), world > 1
    )
    tr = Trainer(cfg, rt, datasets=datasets(cfg))
    tr.train()
    return {n: p.clone() for n, p in tr.engine.full_parameters().items()}


def test_tied_run_checkpoints_reshards_and_exports(tmp_path):
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from megatron_topo.model import build_model

    first = run_distributed(_train_tied, 2, tmp_path, None, 2)[0]
    resumed = run_distributed(_train_tied, 4, tmp_path, str(tmp_path / "ck2"), 4)[0]  # 2 -> 4 ranks
    assert resumed.keys() == first.keys() and "head.embed_out.weight" not in first
    assert not torch.equal(resumed["embed_in.weight"], first["embed_in.weight"])  # it trained on
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "hf"
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(repo, "tools/convert_to_hf.py"),
            "--checkpoint",
            str(tmp_path / "ck4"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert hf.config.tie_word_embeddings
    from .train_utils import small_config

    cfg = small_config(tmp_path).model
    cfg.no_weight_tying = False
    ours = build_model(cfg)
    ours.load_state_dict(resumed, strict=False)
    assert ours.head.embed_out.weight is ours.embed_in.weight
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-5, atol=1e-5)


def test_memory_formula_counts_the_tied_weight_once():
    from megatron_topo.config import load_config
    from megatron_topo.dryrun import dry_run
    from megatron_topo.model import build_model, num_params, unit_numels
    from megatron_topo.zero_topo import memory
    from megatron_topo.zero_topo.sharding import Plan

    cfg = tiny_cfg(no_weight_tying=False)
    assert sum(unit_numels(cfg)) == num_params(build_model(cfg, device="meta"))
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = load_config(
        [os.path.join(repo, "configs/tiny.yml"), os.path.join(repo, "configs/topo.yml")],
        ["no_weight_tying=false", "topology.gcds_per_gpu=2", "topology.gpus_per_node=2"],
    )
    r = dry_run(full, 8, 3)
    assert r["model_state_bytes_per_rank"] == memory.state_bytes(
        unit_numels(full.model), Plan(**r["plan"]), 8, full.precision
    )
