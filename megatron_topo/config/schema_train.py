"""The ``train`` section of the config: batch, schedule, optimizer and the fp16/bf16 precision
blocks, each field declared once with its checks (``option``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .deepspeed import SchedulerBlock
from .options import option


@dataclass
class OptimizerParams:
    lr: float = option(6e-4, "peak learning rate", ge=0.0, le=10.0)
    betas: list[float] = option(doc="Adam (beta1, beta2)", factory=lambda: [0.9, 0.95], ge=0.0, lt=1.0, length=2)
    eps: float = option(1e-8, "Adam epsilon", gt=0.0, le=1.0)
    weight_decay: Optional[float] = option(
        None, "DeepSpeed's place for weight_decay (the same setting; give one)", ge=0.0, le=10.0, neox="implemented"
    )


@dataclass
class OptimizerBlock:
    type: str = option(
        "AdamW",
        "Adam and AdamW both decay weights decoupled, as GPT-NeoX's FusedAdam",
        choices=("AdamW", "Adam"),
        ignore_case=True,
    )
    params: OptimizerParams = field(default_factory=OptimizerParams)


@dataclass
class Fp16Block:
    enabled: bool = option(False, "fp16 mixed precision with loss scaling")
    loss_scale: float = option(0.0, "static loss scale (0: dynamic)", ge=0.0, le=2.0**127)
    initial_scale_power: int = option(16, "dynamic scaling starts at 2**N", ge=0, le=127)
    loss_scale_window: int = option(1000, "clean steps before the scale grows", ge=1, le=1 << 30)
    hysteresis: int = option(2, "overflows tolerated before the scale backs off", ge=1, le=1 << 16)
    min_loss_scale: float = option(1.0, "lowest dynamic loss scale", gt=0.0, le=2.0**127)
    fp16: Optional[bool] = option(None, "GPT-NeoX's duplicate of enabled (true enables fp16 too)", neox="implemented")
    type: Optional[str] = option(
        None,
        "GPT-NeoX: bfloat16 selects bf16 mixed precision (as GPT-NeoX derives precision), fp16 is the same as enabled",
        choices=("bfloat16", "fp16"),
        neox="implemented",
    )
    consecutive_hysteresis: bool = option(
        False, "DeepSpeed: refill the hysteresis after every step without overflow (false: when the scale grows)"
    )
    auto_cast: bool = option(
        False,
        "DeepSpeed casts floating-point module inputs to fp16: the model's inputs are "
        "token ids and compute runs in the configured precision either way",
        neox="accepted",
    )


_BF16_SCALING = (
    "an fp16 loss-scaling setting in the bf16 block (GPT-NeoX's RWKV files copy the fp16 block): "
    "DeepSpeed's bf16 block does not read it and bf16 trains without loss scaling"
)


@dataclass
class Bf16Block:
    enabled: bool = option(False, "bf16 mixed precision")
    bf16: Optional[bool] = option(
        None, "a copy of fp16.fp16 in the bf16 block: DeepSpeed's bf16 block reads enabled only", neox="accepted"
    )
    # (the fp16 block's bounds: a copied value is checked as it would be there)
    loss_scale: Optional[float] = option(None, _BF16_SCALING, ge=0.0, le=2.0**127, neox="accepted")
    initial_scale_power: Optional[int] = option(None, _BF16_SCALING, ge=0, le=127, neox="accepted")
    loss_scale_window: Optional[int] = option(None, _BF16_SCALING, ge=1, le=1 << 30, neox="accepted")
    hysteresis: Optional[int] = option(None, _BF16_SCALING, ge=1, le=1 << 16, neox="accepted")
    min_loss_scale: Optional[float] = option(None, _BF16_SCALING, gt=0.0, le=2.0**127, neox="accepted")


PRECISIONS = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16", "half")


@dataclass
class TrainConfig:
    train_micro_batch_size_per_gpu: int = option(4, "samples per rank per micro-batch", ge=1, le=1 << 16)
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step", ge=1, le=1 << 14)
    train_iters: int = option(100, "optimizer steps to train", ge=1, le=1 << 40)
    seed: int = option(1234, "seed of initialisation and data order", ge=0, le=2**32 - 1)
    optimizer: OptimizerBlock = field(default_factory=OptimizerBlock)
    train_batch_size: Optional[int] = option(
        None,
        "DeepSpeed's global batch = micro-batch x accumulation x world size; the accumulation count is derived from it",
        ge=1,
        le=1 << 40,
        neox="implemented",
    )
    weight_decay: float = option(0.1, "decoupled weight decay", ge=0.0, le=10.0, neox="implemented")
    gradient_clipping: float = option(
        1.0, "clip the global gradient norm to this (0: off)", ge=0.0, le=1e6, neox="implemented"
    )
    lr_decay_style: str = option(
        "linear",
        "learning-rate decay after warmup",
        choices=("linear", "cosine", "constant"),
        neox="implemented",
        why="exponential decay is not implemented",
    )
    lr_decay_iters: Optional[int] = option(
        None, "steps of warmup + decay (default: train_iters)", ge=1, le=1 << 40, neox="implemented"
    )
    warmup: float = option(
        0.01, "warmup as a fraction of lr_decay_iters (GPT-NeoX convention)", ge=0.0, le=1.0, neox="implemented"
    )
    min_lr: float = option(0.0, "learning rate at the end of the decay", ge=0.0, le=10.0, neox="implemented")
    warmup_iters: Optional[int] = option(
        None,
        "warmup in steps, as llemma's GPT-NeoX files give it (upstream "
        "GPT-NeoX does not declare it): sets warmup = warmup_iters / lr_decay_iters",
        ge=0,
        le=1 << 40,
        neox="implemented",
    )
    decay_lr_to: Optional[float] = option(
        None,
        "final learning rate as a fraction of optimizer.params.lr, as "
        "llemma's GPT-NeoX files give it (upstream GPT-NeoX does not declare "
        "it): sets min_lr = decay_lr_to x lr",
        ge=0.0,
        le=1.0,
        neox="implemented",
    )
    scheduler: Optional[SchedulerBlock] = option(
        None,
        "DeepSpeed scheduler block (WarmupLR, WarmupDecayLR, "
        "WarmupCosineLR): mapped onto lr, warmup, lr_decay_* and min_lr",
    )
    precision: Optional[str] = option(
        None, "fp32 | bf16 | fp16 (default: from the fp16/bf16 blocks, else fp32)", choices=PRECISIONS, ignore_case=True
    )
    fp16: Fp16Block = field(default_factory=Fp16Block)
    bf16: Bf16Block = field(default_factory=Bf16Block)
    max_bad_steps: int = option(5, "bf16/fp32: abort after this many consecutive non-finite steps", ge=1, le=1 << 20)
