"""Helpers for trainer tests: an in-memory dataset and configs built in code."""

from __future__ import annotations

import numpy as np
import torch

from megatron_topo.config import Config, ModelConfig
from megatron_topo.topology import Topology
from megatron_topo.training import Runtime


class RandomTokens:
    """Deterministic pseudo-random samples: sample i depends only on i."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(self.seed * 1_000_003 + i)
        # a learnable pattern (next token = previous + 1 mostly) so the loss actually falls
        start = rng.integers(0, self.vocab)
        seq = (start + np.arange(self.seq + 1)) % self.vocab
        noise = rng.random(self.seq + 1) < 0.1
        seq[noise] = rng.integers(0, self.vocab, noise.sum())
        return seq.astype(np.int64)


def small_config(tmp_path, **over) -> Config:
    cfg = Config()
    # the architecture and schedule stated explicitly (the defaults follow GPT-NeoX's since issue 15)
    cfg.model = ModelConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=16,
        vocab_size=64,
        rotary_pct=0.25,
        gpt_j_residual=True,
        no_weight_tying=True,
        init_method="small_init",
        output_layer_init_method="wang_init",
    )
    t = cfg.train
    t.lr_decay_style, cfg.data.split = "cosine", "949,50,1"
    t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, t.train_iters = 2, 1, 5
    t.optimizer.params.lr, t.optimizer.params.eps = 1e-2, 1e-4
    t.warmup, t.weight_decay, t.gradient_clipping, t.precision = 0.2, 0.1, 1.0, "fp32"
    cfg.logging.log_dir = str(tmp_path / "run")
    cfg.logging.log_interval, cfg.logging.eval_interval, cfg.logging.eval_iters = 1, 0, 1
    cfg.logging.progress_bar = False
    for k, v in over.items():
        obj = cfg
        parts = k.split(".")
        for p in parts[:-1]:
            obj = getattr(obj, p)
        setattr(obj, parts[-1], v)
    return cfg


def local_runtime(rank: int, world: int, gcds=1, gpus=None) -> Runtime:
    topo = Topology(world, gcds, gpus or world // gcds)
    return Runtime(rank, world, rank, topo, torch.device("cpu"), world > 1)


def datasets(cfg):
    return RandomTokens(4096, cfg.model.seq_length, cfg.model.vocab_size), RandomTokens(
        256, cfg.model.seq_length, cfg.model.vocab_size, seed=1
    )
