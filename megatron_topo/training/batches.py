"""What each step consumes: the datasets, the micro-batches of a global step, the loss and the
learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..config import Config


def learning_rate(cfg: Config, step: int) -> float:
    """GPT-NeoX AnnealingLR: linear warmup over ``warmup * lr_decay_iters`` steps, then cosine or
    linear decay to ``min_lr`` at ``lr_decay_iters``. ``step`` counts optimizer steps from 1."""
    t = cfg.train
    max_lr, min_lr = t.optimizer.params.lr, t.min_lr
    decay_iters = t.lr_decay_iters or t.train_iters
    warmup = int(t.warmup * decay_iters)
    if warmup > 0 and step <= warmup:
        return max_lr * step / warmup
    if t.lr_decay_style == "constant":
        return max_lr
    if step >= decay_iters:
        return min_lr
    ratio = (step - warmup) / max(1, decay_iters - warmup)
    if t.lr_decay_style == "linear":
        return max_lr - (max_lr - min_lr) * ratio
    return min_lr + (max_lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1.0)


class Batches:
    """Micro-batches of global step ``s``: micro-batch j = m * world + rank covers samples
    ``consumed + j * mb .. + mb`` so any (world, accumulation) split of a global batch sees the
    same micro-batches."""

    def __init__(self, dataset, mb: int, accum: int, world: int, rank: int, device):
        self.ds, self.mb, self.accum, self.world, self.rank, self.device = dataset, mb, accum, world, rank, device

    def micro(self, consumed: int, m: int):
        j = m * self.world + self.rank
        start = consumed + j * self.mb
        rows = [np.asarray(self.ds[(start + i) % len(self.ds)], dtype=np.int64) for i in range(self.mb)]
        t = torch.from_numpy(np.stack(rows)).to(self.device)
        return t[:, :-1], t[:, 1:]


def loss_fn(logits, labels):
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def dataset_num_samples(cfg: Config, world_size: int) -> tuple[int, int, int]:
    """(train, valid, test) sample counts a run on ``world_size`` ranks draws: the sizes its
    index caches are built for (tools/prepare_data.py builds the same ones ahead of a job)."""
    t, lg = cfg.train, cfg.logging
    gb = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * world_size
    evals = (t.train_iters // max(1, lg.eval_interval) + 1) * lg.eval_iters * gb
    return t.train_iters * gb, evals, lg.eval_iters * gb


def build_data(cfg: Config, rank: int, world_size: int, barrier=None):
    """(train, valid, test) datasets of this run; rank 0 builds the index caches, the others wait
    at ``barrier``."""
    from ..data import build_datasets

    t = cfg.train
    return build_datasets(
        cfg.data,
        seq_length=cfg.model.seq_length,
        seed=t.seed,
        num_samples=dataset_num_samples(cfg, world_size),
        vocab_size=cfg.model.vocab_size,
        is_builder=rank == 0,
        barrier=barrier,
    )


def check_eval_data(cfg: Config, train_ds, valid_ds) -> None:
    """Evaluation (eval_interval > 0) needs a validation dataset: a split whose share rounds to 0
    of the documents gives none (the config checks catch a share of 0 and no valid_data_paths)."""
    from ..data import DataError

    lg, d = cfg.logging, cfg.data
    if not lg.eval_interval or lg.eval_interval > cfg.train.train_iters or valid_ds is not None:
        return  # no evaluation, or no step reaches one (a note says so)
    indexed = getattr(train_ds, "indexed", None)  # a GPTDataset cut from data_path by split
    where = (
        f"{d.data_path}: split '{d.split}' gives the validation split 0 of the {len(indexed):,} documents"
        if indexed is not None and not d.train_data_paths
        else "the validation dataset is empty"
    )
    raise DataError(
        f"{where}, but eval_interval {lg.eval_interval} evaluates on it; give validation a larger "
        f"share or more data, or set eval_interval: 0 to turn evaluation off"
    )
