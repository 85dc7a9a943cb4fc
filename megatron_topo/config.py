"""Typed configuration: GPT-NeoX style YAML files merged in order into dataclasses.

Top-level keys use GPT-NeoX names (``num_layers``, ``train_micro_batch_size_per_gpu``, ...) and are
routed to the section that owns them; ``optimizer``, ``fp16``, ``bf16``, ``topology``, ``zero_topo``
and ``zero_optimization`` are nested blocks. ``-`` and ``_`` are equivalent in every key.

Every field is declared once, with its checks beside it: ``option(default, doc, ge=, gt=, le=,
lt=, choices=, ...)`` puts the bounds, the valid choices and a one-line doc into the dataclass
field's metadata; :func:`validate` checks every field from that metadata and :func:`describe_keys`
(``python train.py --list-keys``) lists them. Only rules that tie several fields together are
written by hand (``_cross_checks``).

Errors are one line (``ConfigError``): unknown keys name the file and the closest valid key, a
key set in two files names both, a wrong type names the expected type, a value out of range or
not among the choices names what is valid. YAML is read with YAML 1.2 scalars (``on``/``no``/
``0755``/``1:30`` stay strings; only ``true``/``false`` are booleans), with a bound on how far
aliases may expand.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import reprlib
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml


class ConfigError(ValueError):
    """A bad configuration value; the message is one line meant for the user."""


class ConfigErrors(ConfigError):
    """Several problems of the given files at once: one line each (``problems``)."""

    def __init__(self, problems: list):
        self.problems = list(dict.fromkeys(problems))  # in order, each once
        super().__init__("\n".join(self.problems))


def raise_problems(problems: list) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigErrors(problems)


def option(default=dataclasses.MISSING, doc: str = "", *, factory=None, ge=None, gt=None, le=None, lt=None,
           choices=None, ignore_case: bool = False, allow_inf: bool = False, length=None, why: str = "",
           check=None, neox: str = ""):
    """A config field with its checks: bounds (``ge``/``gt``/``le``/``lt``; on each item of a
    list), ``choices`` (a tuple, or a callable returning one), ``length`` of a list, non-finite
    floats refused unless ``allow_inf``; ``why`` is appended to a choices error; ``check(value)``
    returns an error text or None for rules a bound cannot say. ``neox``: how a GPT-NeoX /
    DeepSpeed key of that name is handled, for the compatibility table (docs/neox_compat.md):
    ``implemented`` (it does what it does there) or ``accepted`` (valid values change nothing
    because they are what this trainer does anyway; others are refused with ``why``)."""
    meta = dict(doc=doc, ge=ge, gt=gt, le=le, lt=lt, choices=choices, ignore_case=ignore_case,
                allow_inf=allow_inf, length=length, why=why, check=check, neox=neox)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _check_split(split: str) -> Optional[str]:
    parts = [s.strip() for s in str(split).replace("/", ",").split(",")]
    try:
        nums = [float(s) for s in parts if s != ""]
    except ValueError:
        nums = []
    if not nums or len(nums) > 3 or any(not (math.isfinite(x) and x >= 0) for x in nums) or sum(nums) <= 0:
        return "expected up to 3 non-negative numbers with a positive sum, e.g. 949,50,1"
    return None


def _check_block(b: int) -> Optional[str]:
    return None if 64 <= b <= 8192 and not b & (b - 1) else "use a power of two in [64, 8192]"


def _check_attention_config(v) -> Optional[str]:
    """GPT-NeoX's ``[[["global"], N], ...]``: only global (dense causal) attention, which is also
    what ``flash`` computes; the layer count is checked against num_layers separately."""
    bad = "expected [[[types], count], ...] with types global or flash, e.g. [[[\"global\"], 12]]"
    if not isinstance(v, list) or not v:
        return bad
    for item in v:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and item[0]
                and isinstance(item[1], int) and not isinstance(item[1], bool) and item[1] >= 1):
            return bad
        other = [t for t in item[0] if t not in ("global", "flash")]
        if other:
            return (f"attention type {other[0]!r} is not supported; only dense causal attention is implemented "
                    f"(global, or flash: the same attention, which scaled_dot_product_attention runs as a "
                    f"flash kernel where it can)")
    return None


def attention_config_layers(v) -> int:
    return sum(len(types) * n for types, n in v)


def _tokenizer_names() -> tuple:
    from .data.tokenizer import TOKENIZERS

    return tuple(TOKENIZERS)


# ----------------------------------------------------------------------------------- sections
INIT_METHODS = ("normal", "scaled_normal", "small_init", "wang_init")
MAX_VOCAB = 2**31 - 1  # token ids are int32 in datasets with >= 65500 ids (GPT-NeoX)


@dataclass
class ModelConfig:
    num_layers: int = option(2, "transformer layers", ge=1, neox="implemented")
    hidden_size: int = option(64, "model width", ge=1, neox="implemented")
    num_attention_heads: int = option(4, "attention heads (must divide hidden_size)", ge=1, neox="implemented")
    seq_length: int = option(64, "tokens per training sample", ge=1, neox="implemented")
    max_position_embeddings: Optional[int] = option(None, "position limit (default: seq_length)", ge=1,
                                                    neox="implemented")
    vocab_size: int = option(512, "padded vocabulary size; unset in a config file: the tokenizer's size padded "
                             "to a multiple of make_vocab_size_divisible_by (GPT-NeoX's padded_vocab_size)",
                             ge=1, le=MAX_VOCAB)
    make_vocab_size_divisible_by: int = option(128, "pad the derived vocabulary to a multiple of this", ge=1,
                                               neox="implemented")
    pos_emb: str = option("rotary", "positional embedding (GPT-NeoX's default is learned)", choices=("rotary",),
                          neox="accepted", why="only rotary embeddings are implemented; GPT-NeoX's own configs "
                          "set pos_emb: rotary")
    rotary_pct: float = option(1.0, "fraction of each head's dims that get rotary embeddings", ge=0.0, le=1.0,
                               neox="implemented")
    rotary_emb_base: int = option(10000, "rotary frequency base", ge=1, neox="implemented")
    gpt_j_residual: bool = option(False, "parallel attention + MLP residual (GPT-NeoX-20B, Pythia)",
                                  neox="implemented")
    no_weight_tying: bool = option(False, "untied input/output embeddings (false: the output layer uses the "
                                   "embedding's weight, sharded once by the embedding unit)", neox="implemented")
    norm: str = option("layernorm", "normalisation layer", choices=("layernorm",), neox="accepted",
                       why="rmsnorm and scalenorm are not implemented")
    layernorm_epsilon: float = option(1e-5, "LayerNorm epsilon", gt=0.0, neox="implemented")
    init_method: str = option("normal", "weight init of the input-side layers", choices=INIT_METHODS,
                              neox="implemented", why="orthogonal and xavier inits are not implemented")
    output_layer_init_method: str = option("scaled_normal", "weight init of the attention/MLP output projections "
                                           "(scaled_normal: init_method_std / sqrt(2 num_layers))",
                                           choices=INIT_METHODS, neox="implemented",
                                           why="orthogonal and xavier inits are not implemented")
    init_method_std: float = option(0.02, "std of normal and scaled_normal", gt=0.0, neox="implemented")
    checkpoint_activations: bool = option(False, "recompute each layer's activations in the backward pass",
                                          neox="implemented")
    checkpoint_num_layers: int = option(1, "layers per recomputed chunk", choices=(1,), neox="accepted",
                                        why="each layer is recomputed on its own")
    attention_dropout: float = option(0.0, "dropout on attention probabilities", ge=0.0, lt=1.0, neox="implemented")
    hidden_dropout: float = option(0.0, "dropout on residual branches", ge=0.0, lt=1.0, neox="implemented")
    attention_config: Optional[list[Any]] = option(None, "GPT-NeoX's per-layer attention types (global/flash; "
                                                   "checked with num_layers)", neox="accepted")
    activation: str = option("gelu", "MLP activation", choices=("gelu",), neox="accepted",
                             why="the MLP is GPT-NeoX's gelu MLP; other activations are not implemented")
    mlp_type: str = option("regular", "MLP kind", choices=("regular",), neox="accepted",
                           why="the gated llama MLP is not implemented")
    intermediate_size: Optional[int] = option(None, "MLP width (must be 4 x hidden_size)", ge=1, neox="accepted")
    num_kv_heads: Optional[int] = option(None, "key/value heads (must equal num_attention_heads)", ge=1,
                                         neox="accepted")
    use_bias_in_norms: bool = option(True, "LayerNorm biases", choices=(True,), neox="accepted",
                                     why="norms always have biases")
    use_bias_in_attn_linear: bool = option(True, "attention projection biases", choices=(True,), neox="accepted",
                                           why="the attention projections always have biases")
    gpt_j_tied: bool = option(False, "one LayerNorm for both parallel branches", choices=(False,), neox="accepted",
                              why="the parallel residual has a LayerNorm per branch, as GPT-NeoX-20B and Pythia")
    output_layer_parallelism: str = option("column", "tensor-parallel split of the output layer",
                                           choices=("column",), neox="accepted")

    def __post_init__(self):
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length


@dataclass
class OptimizerParams:
    lr: float = option(6e-4, "peak learning rate", ge=0.0)
    betas: list[float] = option(doc="Adam (beta1, beta2)", factory=lambda: [0.9, 0.95], ge=0.0, lt=1.0, length=2)
    eps: float = option(1e-8, "Adam epsilon", gt=0.0)
    weight_decay: Optional[float] = option(None, "DeepSpeed's place for weight_decay (the same setting; give one)",
                                           ge=0.0, neox="implemented")


@dataclass
class OptimizerBlock:
    type: str = option("AdamW", "Adam and AdamW both decay weights decoupled, as GPT-NeoX's FusedAdam",
                       choices=("AdamW", "Adam"), ignore_case=True)
    params: OptimizerParams = field(default_factory=OptimizerParams)


@dataclass
class Fp16Block:
    enabled: bool = option(False, "fp16 mixed precision with loss scaling")
    loss_scale: float = option(0.0, "static loss scale (0: dynamic)", ge=0.0)
    initial_scale_power: int = option(16, "dynamic scaling starts at 2**N", ge=0, le=127)
    loss_scale_window: int = option(1000, "clean steps before the scale grows", ge=1)
    hysteresis: int = option(2, "overflows tolerated before the scale backs off", ge=1)
    min_loss_scale: float = option(1.0, "lowest dynamic loss scale", gt=0.0)
    fp16: Optional[bool] = option(None, "GPT-NeoX's duplicate of enabled (true enables fp16 too)", neox="implemented")


@dataclass
class Bf16Block:
    enabled: bool = option(False, "bf16 mixed precision")


SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


@dataclass
class SchedulerParams:
    """DeepSpeed's scheduler params; mapped onto lr, warmup, lr_decay_iters, lr_decay_style, min_lr."""

    warmup_min_lr: float = option(0.0, "WarmupLR/WarmupDecayLR: lr at step 0", choices=(0.0,),
                                  why="warmup starts from 0 as in GPT-NeoX")
    warmup_max_lr: Optional[float] = option(None, "WarmupLR/WarmupDecayLR: peak lr (sets optimizer.params.lr)",
                                            ge=0.0)
    warmup_num_steps: int = option(1000, "warmup steps", ge=0)
    warmup_type: str = option("linear", "warmup shape (DeepSpeed's default is log)", choices=("linear",),
                              why="warmup is linear as in GPT-NeoX; set warmup_type: linear")
    total_num_steps: Optional[int] = option(None, "WarmupDecayLR/WarmupCosineLR: warmup + decay steps "
                                            "(sets lr_decay_iters)", ge=1)
    warmup_min_ratio: float = option(0.0, "WarmupCosineLR: lr at step 0 / peak", choices=(0.0,),
                                     why="warmup starts from 0 as in GPT-NeoX")
    cos_min_ratio: float = option(0.0001, "WarmupCosineLR: final lr / peak (sets min_lr)", ge=0.0, le=1.0)
    last_batch_iteration: int = option(-1, "resume position", choices=(-1,),
                                       why="the schedule position comes from the checkpoint's step")


@dataclass
class SchedulerBlock:
    type: str = option("WarmupLR", "DeepSpeed scheduler", choices=SCHEDULERS, neox="implemented",
                       why="OneCycle and LRRangeTest are not implemented")
    params: SchedulerParams = field(default_factory=SchedulerParams)


PRECISIONS = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16", "half")


@dataclass
class TrainConfig:
    train_micro_batch_size_per_gpu: int = option(4, "samples per rank per micro-batch", ge=1)
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step", ge=1)
    train_iters: int = option(100, "optimizer steps to train", ge=1)
    seed: int = option(1234, "seed of initialisation and data order", ge=0, le=2**32 - 1)
    optimizer: OptimizerBlock = field(default_factory=OptimizerBlock)
    train_batch_size: Optional[int] = option(None, "DeepSpeed's global batch: must equal micro-batch x "
                                             "accumulation x world size (checked at start)", ge=1,
                                             neox="implemented")
    weight_decay: float = option(0.1, "decoupled weight decay", ge=0.0, neox="implemented")
    gradient_clipping: float = option(1.0, "clip the global gradient norm to this (0: off)", ge=0.0,
                                      neox="implemented")
    lr_decay_style: str = option("linear", "learning-rate decay after warmup",
                                 choices=("linear", "cosine", "constant"), neox="implemented",
                                 why="exponential decay is not implemented")
    lr_decay_iters: Optional[int] = option(None, "steps of warmup + decay (default: train_iters)", ge=1,
                                           neox="implemented")
    warmup: float = option(0.01, "warmup as a fraction of lr_decay_iters (GPT-NeoX convention)", ge=0.0, le=1.0,
                           neox="implemented")
    min_lr: float = option(0.0, "learning rate at the end of the decay", ge=0.0, neox="implemented")
    scheduler: Optional[SchedulerBlock] = option(None, "DeepSpeed scheduler block (WarmupLR, WarmupDecayLR, "
                                                 "WarmupCosineLR): mapped onto lr, warmup, lr_decay_* and min_lr")
    precision: Optional[str] = option(None, "fp32 | bf16 | fp16 (default: from the fp16/bf16 blocks, else fp32)",
                                      choices=PRECISIONS, ignore_case=True)
    fp16: Fp16Block = field(default_factory=Fp16Block)
    bf16: Bf16Block = field(default_factory=Bf16Block)
    max_bad_steps: int = option(5, "bf16/fp32: abort after this many consecutive non-finite steps", ge=1)


@dataclass
class DataConfig:
    data_path: Optional[str] = option("builtin", "dataset PREFIX (PREFIX.bin/.idx) cut by split, or 'builtin'")
    train_data_paths: Optional[list[str]] = option(None, "train dataset prefixes (blended; overrides data_path)")
    valid_data_paths: Optional[list[str]] = option(None, "validation dataset prefixes")
    test_data_paths: Optional[list[str]] = option(None, "test dataset prefixes")
    train_data_weights: Optional[list[float]] = option(None, "blend weight per train path", gt=0.0)
    split: str = option("969,30,1", "train,valid,test shares of data_path's documents", check=_check_split,
                        neox="implemented")
    tokenizer_type: str = option("ByteLevel", "tokenizer (GPT-NeoX names)", choices=_tokenizer_names,
                                 ignore_case=True)
    vocab_file: Optional[str] = option(None, "tokenizer file (HFTokenizer, SPMTokenizer, GPT2BPETokenizer)",
                                       neox="implemented")
    merge_file: Optional[str] = option(None, "GPT-2 merges.txt (GPT2BPETokenizer, HFGPT2Tokenizer)",
                                       neox="implemented")
    data_impl: str = option("mmap", "indexed dataset format", choices=("mmap", "infer"), neox="accepted",
                            why="only the mmap format is read; convert cached datasets with tools/preprocess_data.py")
    data_cache_dir: Optional[str] = option(None, "index caches and the built-in corpus (default: data_cache)")
    num_workers: int = option(0, "data loader processes: accepted, batches are read in the training process "
                              "from memory-mapped files", ge=0, neox="accepted")
    builtin_corpus_bytes: int = option(4_000_000, "cap on stdlib source read for data_path: builtin", ge=1)


@dataclass
class LoggingConfig:
    log_interval: int = option(10, "steps per metrics record", ge=1)
    log_dir: str = option("runs/default", "metrics.jsonl, config.yml and tensorboard/ go here")
    tensorboard_dir: Optional[str] = option(None, "default: {log_dir}/tensorboard")
    eval_interval: int = option(100, "steps between evaluations (0: never)", ge=0)
    eval_iters: int = option(10, "micro-batches per evaluation (0: no validation set)", ge=0)
    progress_bar: bool = option(True, "tqdm progress bar on rank 0")


@dataclass
class CheckpointConfig:
    save: Optional[str] = option(None, "checkpoint directory to save into", neox="implemented")
    load: Optional[str] = option(None, "checkpoint (save directory or global_stepN) to resume from, or a "
                                 "HuggingFace GPT-NeoX folder (then as finetune_from)", neox="implemented")
    checkpoint_factor: int = option(0, "save every N steps (0: only at the end when `save` is set)", ge=0)
    keep_last: int = option(2, "newest checkpoints kept (0: all)", ge=0)
    keep_last_n_checkpoints: Optional[int] = option(None, "GPT-NeoX's name of keep_last", ge=0, neox="implemented")
    finetune_from: Optional[str] = option(None, "start from these weights at step 0 with a fresh optimizer: a "
                                          "HuggingFace GPT-NeoX folder (config.json + safetensors/bin) or one "
                                          "of our checkpoints")
    finetune: bool = option(False, "with load: weights only, step 0, fresh optimizer (GPT-NeoX)", neox="implemented")
    no_load_optim: bool = option(False, "with load: do not load the optimizer state (GPT-NeoX)", neox="implemented")
    auto_resume: bool = option(False, "no `load`: resume from `save` when it holds a checkpoint, else start fresh")
    save_interval_minutes: float = option(0.0, "also save every N minutes of training (rank 0's clock; 0: off)",
                                          ge=0.0)


@dataclass
class TopologyConfig:
    gcds_per_gpu: int = option(1, "ranks per GPU package (2 on MI250X)", ge=1)
    gpus_per_node: Optional[int] = option(None, "default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE / world", ge=1)


_ANY_BOOL = "a kernel-fusion or bookkeeping choice; attention runs through scaled_dot_product_attention and the " \
    "math is the same either way"
_PARALLEL_WHY = "ZeRO sharding replaces pipeline and tensor parallelism here (zero_topo.preset / zero_optimization); " \
    "set it to 1"


@dataclass
class NeoxCompatConfig:
    """GPT-NeoX / DeepSpeed top-level keys that are accepted because their valid values are what this
    trainer does anyway (no effect); other values are refused with the reason."""

    pipe_parallel_size: int = option(1, "pipeline stages", choices=(0, 1), neox="accepted", why=_PARALLEL_WHY)
    model_parallel_size: int = option(1, "tensor-parallel degree", choices=(1,), neox="accepted", why=_PARALLEL_WHY)
    scaled_upper_triang_masked_softmax_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    scaled_masked_softmax_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    bias_gelu_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    bias_dropout_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    rope_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    layernorm_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    apply_query_key_layer_scaling: bool = option(False, "the same softmax in fp32 either way", neox="accepted")
    attention_softmax_in_fp32: bool = option(False, "softmax accumulates in fp32 in every attention kernel used",
                                             neox="accepted")
    use_cpu_initialization: bool = option(False, "init is sharded unit by unit on the device either way",
                                          neox="accepted")
    partition_activations: bool = option(False, "without tensor parallelism there is nothing to partition",
                                         neox="accepted")
    contiguous_checkpointing: bool = option(False, "memory layout of recomputed activations", neox="accepted")
    synchronize_each_layer: bool = option(False, "a profiling aid: layers are not synchronised", neox="accepted")
    steps_per_print: int = option(10, "DeepSpeed's print interval: metrics follow log_interval", ge=1, neox="accepted")
    wall_clock_breakdown: bool = option(False, "step timings are always in metrics.jsonl", neox="accepted")
    distributed_backend: str = option("nccl", "the backend follows distributed.backend (auto: nccl on GPUs, gloo "
                                      "on CPU)", choices=("nccl", "gloo", "mpi"), neox="accepted")
    deepspeed: bool = option(True, "always true in GPT-NeoX", neox="accepted")
    launcher: str = option("pdsh", "DeepSpeed runner: this trainer is launched by torchrun or srun", neox="accepted")
    deepspeed_slurm: bool = option(False, "the launcher is read from the environment (torchrun/srun)",
                                   neox="accepted")
    deepspeed_mpi: bool = option(False, "the launcher is read from the environment (torchrun/srun)",
                                 neox="accepted")
    hostfile: Optional[str] = option(None, "DeepSpeed runner host list (unused: torchrun/srun)", neox="accepted")
    master_port: int = option(29500, "DeepSpeed runner port (torchrun/srun set MASTER_PORT)", neox="accepted")
    zero_allow_untested_optimizer: bool = option(False, "Adam(W) is the optimizer", neox="accepted")
    prescale_gradients: bool = option(False, "gradients are averaged in fp32 after the reduce", choices=(False,),
                                      neox="accepted", why="pre-scaling is not implemented")
    gradient_predivide_factor: float = option(1.0, "gradients are averaged after the reduce", choices=(1.0,),
                                              neox="accepted", why="pre-division is not implemented")
    fp32_allreduce: bool = option(False, "gradient reduces accumulate in fp32 (or int8/int4 per plan)",
                                  neox="accepted")
    mmap_warmup: bool = option(False, "reading is memory-mapped and lazy", neox="accepted")
    use_shared_fs: bool = option(True, "index caches are built by rank 0 on the shared file system",
                                 choices=(True,), neox="accepted", why="node-local index building is not implemented")
    eod_mask_loss: bool = option(False, "mask the loss on end-of-document tokens", choices=(False,), neox="accepted",
                                 why="not implemented: every target token counts")
    checkpoint_scale: str = option("linear", "checkpoint spacing", choices=("linear",), neox="accepted",
                                   why="checkpoints are every checkpoint_factor steps (log spacing not implemented)")
    no_save_optim: bool = option(False, "checkpoints always hold the optimizer", choices=(False,), neox="accepted",
                                 why="a checkpoint without optimizer states could not resume")
    no_save_rng: bool = option(False, "checkpoints always hold the RNG state", choices=(False,), neox="accepted",
                               why="a checkpoint without RNG state could not resume exactly")
    no_load_rng: bool = option(False, "RNG state is loaded on an exact resume", neox="accepted")
    override_lr_scheduler: bool = option(False, "the schedule always comes from the config", neox="accepted")
    use_checkpoint_lr_scheduler: bool = option(False, "the schedule always comes from the config", choices=(False,),
                                               neox="accepted", why="the schedule is computed from the config's keys")
    use_wandb: bool = option(False, "Weights & Biases logging", choices=(False,), neox="accepted",
                             why="metrics go to metrics.jsonl and TensorBoard; wandb is not implemented")
    wandb_project: Optional[str] = option(None, "unused (use_wandb must be false)", neox="accepted")
    wandb_group: Optional[str] = option(None, "unused (use_wandb must be false)", neox="accepted")
    wandb_team: Optional[str] = option(None, "unused (use_wandb must be false)", neox="accepted")
    wandb_host: Optional[str] = option(None, "unused (use_wandb must be false)", neox="accepted")
    log_grad_norm: bool = option(False, "the gradient norm is always logged (grad_norm)", neox="accepted")
    log_param_norm: bool = option(False, "parameter norm logging", choices=(False,), neox="accepted",
                                  why="not implemented")
    log_optimizer_states: bool = option(False, "optimizer-state norm logging", choices=(False,), neox="accepted",
                                        why="not implemented")
    log_gradient_noise_scale: bool = option(False, "gradient noise scale logging", choices=(False,), neox="accepted",
                                            why="not implemented")


PRESETS = ("ddp", "zero1", "zero2", "zero3", "zeropp", "mics", "topo", "paro_iig", "paro_nig")


@dataclass
class ZeroTopoConfig:
    preset: str = option("ddp", "sharding preset (DESIGN §4); auto: the fastest legal plan that fits, from the "
                         "performance and memory models (needs a system: block)", choices=PRESETS + ("auto",))
    weight_factor: Optional[int] = option(None, "ranks the 16-bit weights are split over", ge=1)
    grad_factor: Optional[int] = option(None, "ranks the gradients are split over", ge=1)
    optimizer_factor: Optional[int] = option(None, "ranks the fp32 master + Adam moments are split over", ge=1)
    secondary_degree: Optional[int] = option(None, "ranks of the secondary (hpZ) weight copy (0: none)", ge=0)
    weight_bits: Optional[int] = option(None, "bits of the weight all-gather", choices=(16, 8))
    secondary_bits: Optional[int] = option(None, "bits of the secondary copy", choices=(16, 8))
    grad_bits: Optional[int] = option(None, "bits of the gradient reduce-scatter", choices=(16, 8, 4))
    combine_bits: Optional[int] = option(None, "bits of the once-per-step cross-replica gradient combine "
                                         "(16: the compute dtype; 8: INT8 reduce-scatter + all-gather, fp32 sums)",
                                         choices=(16, 8))
    publish_bits: Optional[int] = option(None, "bits of the post-step weight all-gather (8: INT8; each rank's "
                                         "own shard and the fp32 master stay exact)", choices=(16, 8))
    error_feedback: bool = option(False, "add each low-bit gradient quantization's residual (in-node reduction, "
                                  "quantized combine) to the next one; fp32 residuals, kept in checkpoints")
    quant_block_size: int = option(2048, "elements per weight quantization scale", check=_check_block)
    grad_quant_block_size: int = option(512, "elements per gradient quantization scale", check=_check_block)
    inter_node_reduce: str = option("allreduce", "cross-replica combine", choices=("allreduce", "reduce_scatter"))
    prefetch: bool = option(True, "gather the next unit's weights while computing this one")
    bucket_size: int = option(0, "reserved", choices=(0,),
                              why="units (one per layer) are the communication buckets; coalescing is not implemented")
    kernels: str = option("auto", "quantization kernels (auto: triton on GPUs, cpu_fast on CPUs)",
                          choices=("auto", "triton", "cpu_fast", "reference"))
    # bitwise-reproducible cross-replica sums (all-gather + sum in rank order, W x the traffic):
    # any world size then equals one process with the same global batch, bit for bit
    deterministic: bool = option(False, "bitwise-reproducible cross-replica sums (W x the traffic)")


_NO_BUCKETS = "no effect: units (one per layer) are the communication buckets"
_NO_STAGE3 = "no effect: weights are gathered unit by unit (one layer) and freed after use; prefetch is one unit ahead"


@dataclass
class OffloadBlock:
    """DeepSpeed's offload_optimizer / offload_param."""

    device: str = option("none", "where to offload", choices=("none",), neox="accepted",
                         why="CPU/NVMe offload is not implemented; shard the states over more ranks instead "
                         "(zero3, topo, or a larger optimizer_factor)")
    pin_memory: bool = option(False, "no effect without offload", neox="accepted")
    nvme_path: Optional[str] = option(None, "no effect without offload", neox="accepted")
    buffer_count: int = option(4, "no effect without offload", ge=0, neox="accepted")
    buffer_size: int = option(100_000_000, "no effect without offload", ge=0, neox="accepted")
    max_in_cpu: int = option(1_000_000_000, "no effect without offload", ge=0, neox="accepted")
    fast_init: bool = option(False, "no effect without offload", neox="accepted")
    pipeline_read: bool = option(False, "no effect without offload", neox="accepted")
    pipeline_write: bool = option(False, "no effect without offload", neox="accepted")
    ratio: float = option(1.0, "no effect without offload", ge=0.0, le=1.0, neox="accepted")


@dataclass
class ZeroOptimizationBlock:
    """DeepSpeed's ``zero_optimization`` keys, mapped onto presets (see zero_topo.plan)."""

    stage: int = option(0, "ZeRO stage", choices=(0, 1, 2, 3), neox="implemented")
    zero_hpz_partition_size: int = option(1, "ZeRO++ hpZ secondary partition size", ge=1, neox="implemented")
    zero_quantized_weights: bool = option(False, "ZeRO++ qwZ: 8-bit weight all-gather", neox="implemented")
    zero_quantized_gradients: bool = option(False, "ZeRO++ qgZ: 4-bit gradient reduce-scatter", neox="implemented")
    zero_quantized_nontrainable_weights: bool = option(False, "every weight is trainable", neox="accepted")
    mics_shard_size: int = option(-1, "MiCS shard group size (-1: off)", ge=-1, neox="implemented")
    mics_hierarchical_params_gather: bool = option(False, "MiCS two-level weight gather: the shard group's gather "
                                                   "is already hierarchy-aware", neox="accepted")
    overlap_comm: bool = option(True, "overlap communication with compute", choices=(True,), neox="accepted",
                                why="the engine always overlaps; zero_topo.prefetch: false turns off weight prefetch")
    contiguous_gradients: bool = option(True, "contiguous gradient buffers", choices=(True,), neox="accepted",
                                        why="each unit's gradients always live in one flat buffer")
    reduce_scatter: bool = option(True, "gradients are reduce-scattered wherever the plan shards them "
                                  "(grad_factor > 1), all-reduced otherwise", neox="accepted")
    allgather_partitions: bool = option(True, "weights are all-gathered per unit", neox="accepted")
    reduce_bucket_size: int = option(500_000_000, _NO_BUCKETS, ge=0, neox="accepted")
    allgather_bucket_size: int = option(500_000_000, _NO_BUCKETS, ge=0, neox="accepted")
    round_robin_gradients: bool = option(False, "no effect: gradient shards are contiguous per unit", neox="accepted")
    sub_group_size: int = option(1_000_000_000, "no effect: the optimizer steps one unit's shard at a time", ge=0,
                                 neox="accepted")
    stage3_max_live_parameters: int = option(1_000_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_max_reuse_distance: int = option(1_000_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_prefetch_bucket_size: int = option(50_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_param_persistence_threshold: int = option(100_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_model_persistence_threshold: int = option(2**63 - 1, _NO_STAGE3, ge=0, neox="accepted")
    stage3_gather_16bit_weights_on_model_save: bool = option(False, "no effect: checkpoints hold fp32 masters, "
                                                             "tools/convert_to_hf.py exports", neox="accepted")
    stage3_gather_fp16_weights_on_model_save: bool = option(False, "old name of the key above", neox="accepted")
    elastic_checkpoint: bool = option(False, "checkpoints always load under any plan and world size", neox="accepted")
    load_from_fp32_weights: bool = option(True, "checkpoints always load the fp32 masters", neox="accepted")
    ignore_unused_parameters: bool = option(True, "every parameter is used", neox="accepted")
    legacy_stage1: bool = option(False, "no effect", neox="accepted")
    cpu_offload: bool = option(False, "old DeepSpeed name of offload_optimizer", choices=(False,), neox="accepted",
                               why="CPU offload is not implemented; shard the states over more ranks instead")
    offload_optimizer: Optional[OffloadBlock] = option(None, "DeepSpeed offload optimizer block (device none only)")
    offload_param: Optional[OffloadBlock] = option(None, "DeepSpeed offload param block (device none only)")


@dataclass
class SystemConfig:
    """Machine description used by the planner and the performance model (not by training)."""

    name: str = option("local_cpu", "machine name")
    device_memory_gib: float = option(64.0, "memory per device", gt=0.0)
    peak_tflops: float = option(191.5, "per device, advertised dense fp16/bf16", gt=0.0)
    gemm_tflops: float = option(125.0, "per device, measured large GEMM", gt=0.0)
    bw_intra_gpu_gbs: float = option(200.0, "GB/s per direction between the GCDs of one package", gt=0.0)
    bw_intra_node_gbs: float = option(50.0, "GB/s per direction between packages of one node", gt=0.0)
    bw_inter_node_gbs: float = option(25.0, "GB/s per direction per NIC", gt=0.0)
    nics_per_node: int = option(4, "NICs per node", ge=1)
    latency_intra_gpu_us: float = option(2.0, "per-message latency between GCDs of a package", ge=0.0)
    latency_intra_node_us: float = option(5.0, "per-message latency inside a node", ge=0.0)
    latency_inter_node_us: float = option(10.0, "per-message latency between nodes", ge=0.0)
    latency_small_message_us: float = option(5.0, "per ring step of a tiny collective (quantization scales)", ge=0.0)
    # added for the performance model (megatron_topo/perf_model.py)
    compute_efficiency: float = option(0.40, "achieved fraction of peak_tflops in GEMM-heavy training",
                                       gt=0.0, le=1.0)
    hbm_bw_gbs: float = option(1600.0, "device memory bandwidth, for memory-bound steps (optimizer)", gt=0.0)
    # which step model ranks plans (preset: auto, tools/plan.py)
    step_model: str = option("device", "device: GPUs (megatron_topo.perf_model.estimate_step); emulated_cpu: gloo "
                             "ranks sharing CPU cores (emulation.predict.estimate_emulated: compute, quantization "
                             "and transport all cost CPU time)", choices=("device", "emulated_cpu"))
    quant_ns_per_element: float = option(0.0, "emulated_cpu: CPU ns per element through a quantization kernel",
                                         ge=0.0)
    cpu_transport_gbs: float = option(0.84, "emulated_cpu: GB/s of gloo's copying, machine-wide", gt=0.0)
    cpu_call_us: float = option(0.0, "emulated_cpu: CPU us per ring step of a collective call", ge=0.0)
    cpu_optimizer_ns_per_param: float = option(0.0, "emulated_cpu: CPU ns per optimizer-shard parameter per step",
                                               ge=0.0)


@dataclass
class DistributedConfig:
    backend: str = option("auto", "auto: nccl on GPUs, gloo on CPU", choices=("auto", "nccl", "gloo", "mpi"))
    collective_timeout_s: float = option(600.0, "a collective waiting longer than this fails the run", gt=0.0)
    device: str = option("auto", "auto: cuda when a GPU is visible, else cpu", choices=("auto", "cpu", "cuda"))


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    neox: NeoxCompatConfig = field(default_factory=NeoxCompatConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    zero_topo: ZeroTopoConfig = field(default_factory=ZeroTopoConfig)
    zero_optimization: Optional[ZeroOptimizationBlock] = None
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    system: Optional[SystemConfig] = None

    def __post_init__(self):
        # ``key=value`` of accepted settings that change nothing here (load_config fills it)
        self.no_effect: list[str] = []

    # ---- derived
    @property
    def precision(self) -> str:
        return resolve_precision(self.train)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_flat_yaml(self) -> str:
        """The effective config as a YAML file that loads back into the same Config."""
        return yaml.safe_dump(flat_dict(self), sort_keys=False)


# Sections whose fields are top-level YAML keys (GPT-NeoX is flat) and blocks that are nested.
_FLAT_SECTIONS = ("model", "train", "data", "logging", "checkpoint", "neox")

# GPT-NeoX / DeepSpeed keys that are refused outright (no value of them is what this trainer does)
REJECTED_KEYS = {
    "sparsity_config": "sparse attention is not implemented (dense causal attention only)",
    "num_unique_layers": "layer sharing is not implemented",
    "param_sharing_style": "layer sharing is not implemented",
    "sliding_window_width": "sliding-window attention is not implemented",
    "label_data_paths": "label datasets are not implemented: targets are the inputs shifted by one",
    "soft_prompt_tuning": "soft prompt tuning is not implemented",
    "use_mup": "muP is not implemented",
    "s3_path": "S3 upload of checkpoints is not implemented; copy the save folder",
    "moe_num_experts": "mixture of experts is not implemented",
    "curriculum_learning": "curriculum learning is not implemented",
    "sequence_parallel": "ZeRO sharding replaces tensor/sequence parallelism here; drop it",
    "weight_by_num_documents": "blend weights come from train_data_weights",
    "extra_save_iters": "checkpoints are saved every checkpoint_factor steps and every save_interval_minutes",
    "activation_checkpointing": "use checkpoint_activations: true (DeepSpeed's block is not read)",
    "amp": "use precision: bf16 or fp16 (Apex AMP is not used)",
}

_BLOCK_SECTIONS = ("topology", "zero_topo", "zero_optimization", "distributed", "system")


def _norm(key: str) -> str:
    return str(key).replace("-", "_")


def _key_index() -> dict[str, str]:
    index = {}
    for sec in _FLAT_SECTIONS:
        cls = _section_type(sec)
        for f in dataclasses.fields(cls):
            index[f.name] = sec
    for sec in _BLOCK_SECTIONS:
        index[sec] = sec
    return index


def _section_type(sec: str):
    hints = typing.get_type_hints(Config)
    return _strip_optional(hints[sec])


def _strip_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def resolve_precision(t: TrainConfig) -> str:
    if t.precision is not None:
        p = t.precision.lower()
        if p in ("float32", "fp32"):
            p = "fp32"
        elif p in ("bfloat16", "bf16"):
            p = "bf16"
        elif p in ("float16", "fp16", "half"):
            p = "fp16"
        else:
            raise ConfigError(f"precision: '{t.precision}' is not valid; use one of fp32, bf16, fp16")
        return p
    fp16 = t.fp16.enabled or bool(t.fp16.fp16)
    if fp16 and t.bf16.enabled:
        raise ConfigError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if fp16:
        return "fp16"
    if t.bf16.enabled:
        return "bf16"
    return "fp32"


# ------------------------------------------------------------------------------ type coercion
def _type_name(tp) -> str:
    tp = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (arg, *_) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(arg)}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "a boolean (true/false)", str: "a string"}.get(
        tp, str(tp)
    )


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def _short(value) -> str:
    """A bounded rendering of a config value for error messages (never walks a whole structure)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (_Int, _Float)):
        return value.text
    return _REPR.repr(value)


def _kind(value) -> str:
    return {_Int: "int", _Float: "float"}.get(type(value), type(value).__name__)


def _plain(value):
    """YAML's remembered-text ints/floats as plain ones, through lists and mappings."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _coerce(value, tp, where: str):
    """Check ``value`` against the annotation ``tp``; return it converted (ints to floats etc.)."""
    optional = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    base = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed; expected {_type_name(base)}")
    if base is Any:  # free-form (GPT-NeoX's attention_config): plain Python values, checked elsewhere
        return _plain(value)
    origin = typing.get_origin(base)
    bad = ConfigError(f"{where}: expected {_type_name(base)}, got {_kind(value)} {_short(value)}")
    if dataclasses.is_dataclass(base):
        if not isinstance(value, dict):
            raise bad
        return value  # merged field by field by the caller
    if origin in (list, tuple):
        (arg,) = typing.get_args(base)
        if isinstance(value, str) and arg is str:
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad
        return [_coerce(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
    if base is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if base is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):  # "5e8" quoted in JSON/YAML (DeepSpeed files do this)
            text = value.strip().replace("_", "")
            if re.fullmatch(r"[-+]?[0-9]+", text):
                return int(text)
            try:
                f = float(text)
            except ValueError:
                raise bad from None
            if math.isfinite(f) and f.is_integer():
                return int(f)
        raise bad
    if base is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # e.g. 1_000.5 or "6e-4" quoted
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if base is str:
        if isinstance(value, (_Int, _Float)):  # a path such as 0755 or 1e3 stays as written
            return value.text
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad
    return value


def _suggest(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


# ------------------------------------------------------------------------------- merging
def _collect(problems: Optional[list], fn, *args) -> None:
    """Run ``fn``; with a ``problems`` list, a ConfigError is recorded there instead of raised."""
    if problems is None:
        fn(*args)
        return
    try:
        fn(*args)
    except ConfigErrors as e:
        problems.extend(e.problems)
    except ConfigError as e:
        problems.append(str(e))


def _merge_block(obj, data: dict, where: str, origin: dict, src: str, problems: Optional[list] = None):
    """Merge ``data`` into dataclass instance ``obj``; ``origin`` remembers which file set each key;
    with ``problems``, every bad key is recorded there and the others are still merged."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    for raw_key, value in data.items():
        _collect(problems, _merge_key, obj, raw_key, value, where, origin, src, problems)


def _merge_key(obj, raw_key, value, where: str, origin: dict, src: str, problems: Optional[list]):
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    key = _norm(raw_key)
    path = f"{where}.{key}" if where else key
    if key not in names:
        raise ConfigError(
            f"{src}: unknown key '{path}'{_suggest(key, names)} (valid: {', '.join(sorted(names))})"
        )
    tp = hints[key]
    base = _strip_optional(tp)
    if dataclasses.is_dataclass(base) and isinstance(value, dict):
        child = getattr(obj, key)
        if child is None:
            child = base()
            setattr(obj, key, child)
        _merge_block(child, value, path, origin, src, problems)
        return
    if path in origin:
        raise ConfigError(f"key '{path}' is set in both {origin[path]} and {src}; set it in one file")
    origin[path] = src
    setattr(obj, key, _coerce(value, tp, f"{src}: {path}"))


def merge_into(cfg: Config, data: dict, src: str, origin: dict, problems: Optional[list] = None) -> None:
    """Merge one YAML document (GPT-NeoX flat keys + nested blocks) into ``cfg``; with ``problems``,
    every bad key is recorded there (one line each) and the rest is still merged."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the top level must be a mapping of keys, got {type(data).__name__}")
    index = _key_index()
    for raw_key, value in data.items():
        _collect(problems, _merge_top, cfg, index, raw_key, value, src, origin, problems)


def _merge_top(cfg, index, raw_key, value, src, origin, problems):
    key = _norm(raw_key)
    if key not in index:
        if key in REJECTED_KEYS:
            raise ConfigError(f"{src}: '{raw_key}' is not supported: {REJECTED_KEYS[key]}")
        raise ConfigError(f"{src}: unknown key '{raw_key}'{_suggest(key, index)}")
    sec = index[key]
    if sec in _BLOCK_SECTIONS:
        block = getattr(cfg, sec)
        if block is None:
            block = _section_type(sec)()
            setattr(cfg, sec, block)
        _merge_block(block, value, sec, origin, src, problems)
    else:
        _merge_block(getattr(cfg, sec), {key: value}, "", origin, src, problems)


MAX_YAML_VALUES = 100_000  # a config has a few hundred; aliases may not expand past this


def _decode(path: str, raw: bytes) -> str:
    """UTF-8 (optionally with a BOM) or UTF-16/32 with a BOM, as YAML allows; else one line."""
    for bom, enc in ((b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"),
                     (b"\xef\xbb\xbf", "utf-8-sig"), (b"\xfe\xff", "utf-16"), (b"\xff\xfe", "utf-16")):
        if raw.startswith(bom):
            break
    else:
        enc = "utf-8"
    try:
        return raw.decode(enc)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid {enc.upper().replace('-SIG', '')} text (byte 0x{raw[e.start]:02x} at "
                          f"offset {e.start}); save the file as UTF-8") from None


def _expanded_size(obj, limit: int, memo: dict) -> int:
    """How many values ``obj`` holds once every alias is expanded (memoised: linear time)."""
    if id(obj) in memo:
        return memo[id(obj)]
    n = 1
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, list):
        items = obj
    else:
        items = ()
    for v in items:
        n += _expanded_size(v, limit, memo)
        if n > limit:
            break
    memo[id(obj)] = n
    return n


def parse_yaml(text: str, name: str):
    """Parse config YAML (safe, YAML 1.2 scalars, bounded alias expansion); ConfigError on failure."""
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = name
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{name}:{at} invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{name}: invalid YAML: nested too deeply") from None
    if _expanded_size(data, MAX_YAML_VALUES, {}) > MAX_YAML_VALUES:
        raise ConfigError(f"{name}: the YAML expands to more than {MAX_YAML_VALUES:,} values through its aliases "
                          f"(&anchor/*alias); a config needs a few hundred")
    return data


def load_yaml(path: str) -> dict:
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory; give a YAML file")
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    text = _decode(path, raw)
    if path.lower().endswith(".json"):  # a DeepSpeed (or GPT-NeoX JSON) config
        def pairs(items):
            seen = set()
            for k, _ in items:
                if _norm(k) in seen:
                    raise ConfigError(f"{path}: key '{k}' is repeated in one object")
                seen.add(_norm(k))
            return dict(items)

        def no_nan(c):
            raise ValueError(f"{c} is not a JSON number")
        try:
            data = json.loads(text, object_pairs_hook=pairs, parse_constant=no_nan)
        except RecursionError:
            raise ConfigError(f"{path}: invalid JSON: nested too deeply") from None
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            where = f" line {e.lineno}:" if hasattr(e, "lineno") else ""
            raise ConfigError(f"{path}:{where} invalid JSON: {getattr(e, 'msg', e)}") from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
        return data or {}
    return parse_yaml(text, path) or {}


class _Int(int):
    """An int read from YAML that remembers how it was written (``0755`` for a string field)."""

    text = ""


class _Float(float):
    text = ""


def _yaml_int(loader, node):
    text = loader.construct_scalar(node)
    t = text.replace("_", "")
    sign, body = (-1, t[1:]) if t[:1] == "-" else (1, t.lstrip("+"))
    v = int(body[2:], 8) if body.startswith("0o") else int(body[2:], 16) if body.startswith("0x") else int(body, 10)
    out = _Int(sign * v)
    out.text = text
    return out


def _yaml_float(loader, node):
    text = loader.construct_scalar(node)
    out = _Float(float(text.replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan")))
    out.text = text
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 core-schema scalars (``yes``/``on``/``0755``/``1:30`` are not
    booleans, octals or sexagesimals) that rejects a key repeated inside one mapping (including
    `a_b` vs `a-b`); merge keys (``<<: *base``) work, explicit keys overriding merged ones."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            k = _norm(key)
            if k in seen:
                raise ConfigError(
                    f"{self.name}: line {key_node.start_mark.line + 1}: key '{key}' is repeated "
                    f"(first set on line {seen[k] + 1})"
                )
            seen[k] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_CORE = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
         "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value"}  # YAML 1.1 only: dates and '=' stay strings
_UniqueKeyLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in _CORE] for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+(?:_[0-9]+)*|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+(?:_[0-9]+)*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


def parse_set(expr: str) -> dict:
    """``a.b.c=value`` -> {'a': {'b': {'c': value}}} with the value parsed as YAML."""
    if "=" not in expr:
        raise ConfigError(f"--set {expr!r}: expected dotted.key=value")
    key, raw = expr.split("=", 1)
    parts = key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ConfigError(f"--set {expr!r}: empty key name in {key.strip()!r}; expected dotted.key=value")
    try:
        value = parse_yaml(raw, f"--set {expr}") if raw != "" else ""
    except ConfigError as e:
        if "expands to more than" in str(e):
            raise
        value = raw  # not YAML: the text itself
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def load_config(paths: list[str], overrides: Optional[list[str]] = None) -> Config:
    """Merge config files in order (YAML: GPT-NeoX; ``.json``: a DeepSpeed config, the same
    top-level keys), then ``--set`` overrides (which may replace earlier values). Every problem
    of the files is reported at once (ConfigErrors, one line each)."""
    cfg = Config()
    origin: dict = {}
    problems: list = []
    for p in paths:
        try:
            data = load_yaml(p)
        except ConfigError as e:
            problems.append(str(e))
            continue
        _collect(problems, merge_into, cfg, data, p, origin, problems)
    for expr in overrides or []:
        try:
            data = parse_set(expr)
        except ConfigError as e:
            problems.append(str(e))
            continue
        # overrides win over files: forget who set the keys they touch
        for path in _paths(data):
            origin.pop(path, None)
            origin.pop(path.split(".", 1)[-1], None)
        _collect(problems, merge_into, cfg, data, f"--set {expr}", origin, problems)
    if "max_position_embeddings" not in origin:  # its default follows seq_length wherever that was set
        cfg.model.max_position_embeddings = cfg.model.seq_length
    _resolve_aliases(cfg, origin, problems)
    c = cfg.checkpoint
    hf_path = c.finetune_from or c.load
    if hf_path and not problems:
        from .hf_import import apply_hf_model_config, is_hf_folder

        if is_hf_folder(hf_path):  # the architecture comes from (and must agree with) its config.json
            try:
                problems.extend(apply_hf_model_config(cfg, hf_path, origin))
            except ConfigError as e:
                problems.append(str(e))
            origin.setdefault("vocab_size", hf_path)
    validate(cfg, problems)
    if not problems:
        _collect(problems, resolve_vocab_size, cfg, "vocab_size" in origin, "tokenizer_type" in origin)
    raise_problems(problems)
    cfg.no_effect = no_effect_settings(cfg, origin)
    return cfg


def no_effect_settings(cfg: Config, origin: dict) -> list[str]:
    """``key=value`` of every setting the files or ``--set`` gave a non-default value although it
    changes nothing here (fields marked ``neox="accepted"``): the trainer prints them in one
    note line at start, so no accepted key is a silent no-op."""
    index, out = _key_index(), []
    for path in origin:
        parts = path.split(".")
        obj = cfg if parts[0] in _BLOCK_SECTIONS else getattr(cfg, index.get(parts[0], ""), None)
        for name in parts[:-1] if parts[0] in _BLOCK_SECTIONS else []:
            obj = getattr(obj, name, None)
        if obj is None or not dataclasses.is_dataclass(obj):
            continue
        f = next((f for f in dataclasses.fields(obj) if f.name == parts[-1]), None)
        if f is None or f.metadata.get("neox") != "accepted":
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        value = getattr(obj, f.name)
        if value != default:
            out.append(f"{path}={value}")
    return sorted(out)


def _resolve_aliases(cfg: Config, origin: dict, problems: list) -> None:
    """GPT-NeoX / DeepSpeed spellings of our settings: keep_last_n_checkpoints,
    optimizer.params.weight_decay, the DeepSpeed scheduler block."""
    c, t = cfg.checkpoint, cfg.train
    if cfg.zero_optimization is not None and cfg.zero_topo.preset == "ddp" and "zero_topo.preset" in origin:
        problems.append(f"zero_optimization and zero_topo.preset=ddp (set in {origin['zero_topo.preset']}) both "
                        f"choose the sharding; keep one of them")
    if c.keep_last_n_checkpoints is not None:
        if "keep_last" in origin and c.keep_last != c.keep_last_n_checkpoints:
            problems.append(f"keep_last {c.keep_last} and keep_last_n_checkpoints {c.keep_last_n_checkpoints} "
                            f"are the same setting; give one")
        c.keep_last = c.keep_last_n_checkpoints
        c.keep_last_n_checkpoints = None
    wd = t.optimizer.params.weight_decay
    if wd is not None:
        if "weight_decay" in origin and wd != t.weight_decay:
            problems.append(f"weight_decay {_fmt(t.weight_decay)} and optimizer.params.weight_decay {_fmt(wd)} are "
                            f"the same setting; give one")
        t.weight_decay = wd
        t.optimizer.params.weight_decay = None
    sch = t.scheduler
    if sch is not None:
        bad = len(problems)
        for key in ("lr_decay_style", "lr_decay_iters", "warmup", "min_lr"):
            if key in origin:
                problems.append(f"scheduler ({sch.type}) and {key} both set the learning-rate schedule; keep one")
        for f in dataclasses.fields(sch.params):
            _collect(problems, _check_declared, f"scheduler.params.{f.name}", getattr(sch.params, f.name), f.metadata)
        _collect(problems, _check_declared, "scheduler.type", sch.type, dataclasses.fields(sch)[0].metadata)
        if len(problems) > bad:
            return
        sp = sch.params
        if sp.warmup_max_lr is not None:
            if "optimizer.params.lr" in origin and sp.warmup_max_lr != t.optimizer.params.lr:
                problems.append(f"scheduler.params.warmup_max_lr {_fmt(sp.warmup_max_lr)} differs from "
                                f"optimizer.params.lr {_fmt(t.optimizer.params.lr)}; they are the peak lr, give one")
            t.optimizer.params.lr = sp.warmup_max_lr
        total = sp.total_num_steps
        if sch.type == "WarmupLR":  # warmup, then constant
            t.lr_decay_style, total = "constant", t.train_iters
        elif total is None:
            problems.append(f"scheduler.params.total_num_steps is required by {sch.type}")
            total = t.train_iters
        else:
            t.lr_decay_style = "linear" if sch.type == "WarmupDecayLR" else "cosine"
            t.min_lr = 0.0 if sch.type == "WarmupDecayLR" else sp.cos_min_ratio * t.optimizer.params.lr
        if sch.type == "WarmupLR":
            t.lr_decay_iters, t.warmup = total, min(1.0, sp.warmup_num_steps / total)
        elif sp.warmup_num_steps > total:
            problems.append(f"scheduler.params.warmup_num_steps {sp.warmup_num_steps} exceeds the "
                            f"{'total_num_steps' if sch.type != 'WarmupLR' else 'train_iters'} {total}")
        else:
            t.lr_decay_iters, t.warmup = total, sp.warmup_num_steps / total
        cfg.train.scheduler = None  # mapped: the effective config states lr/warmup/decay


def padded_vocab_size(n: int, divisible_by: int, model_parallel: int = 1) -> int:
    """GPT-NeoX's rule: the tokenizer's size padded up to a multiple of divisible_by x tensor parallel."""
    m = divisible_by * model_parallel
    return -(-n // m) * m


def resolve_vocab_size(cfg: Config, explicit: bool, tokenizer_explicit: bool) -> None:
    """``vocab_size`` unset: the tokenizer's size padded like GPT-NeoX. Set: it must hold the ids
    of the tokenizer the config names by its files (``vocab_file``) when that can be built."""
    from .data import DataError, build_tokenizer

    d, m = cfg.data, cfg.model
    if explicit and not (tokenizer_explicit and d.vocab_file):  # file-less tokenizers: toy data may use fewer ids
        return
    char_vocab = m.vocab_size if explicit and str(d.tokenizer_type).lower() == "charleveltokenizer" else None
    try:
        tok = build_tokenizer(d.tokenizer_type, d.vocab_file, char_vocab, d.merge_file)
    except (DataError, OSError, ValueError) as e:
        if explicit:
            return  # the data pipeline reports an unusable tokenizer when it needs one
        raise ConfigError(f"vocab_size is unset and the tokenizer ({d.tokenizer_type}) cannot be built to derive it: "
                          f"{str(e).splitlines()[0]}; fix the tokenizer files or set vocab_size") from None
    n = tok.vocab_size
    if not explicit:
        m.vocab_size = padded_vocab_size(n, m.make_vocab_size_divisible_by, cfg.neox.model_parallel_size)
        if m.vocab_size > MAX_VOCAB:
            raise ConfigError(f"the tokenizer's {n} ids pad to {m.vocab_size}, over {MAX_VOCAB}")
    elif m.vocab_size < n:
        raise ConfigError(f"vocab_size {m.vocab_size} is smaller than the tokenizer's {n} ids ({d.tokenizer_type}); "
                          f"use at least {n}, e.g. {padded_vocab_size(n, m.make_vocab_size_divisible_by)} "
                          f"(or drop vocab_size: it is then derived like GPT-NeoX's)")


def _paths(d: dict, prefix: str = ""):
    """Every dotted path in ``d``, prefixes included (a dict given to a scalar key names the key)."""
    for k, v in d.items():
        p = f"{prefix}{_norm(k)}"
        yield p
        if isinstance(v, dict):
            yield from _paths(v, p + ".")


def validate(cfg: Config, problems: Optional[list] = None) -> None:
    """Every declared field's bounds and choices (from its ``option`` metadata), then the rules
    that tie fields together. Every problem is found: raised together (ConfigErrors, one line
    each), or appended to ``problems``."""
    own: list = []
    for path, value, meta in _declared(cfg):
        _collect(own, _check_declared, path, value, meta)
    _cross_checks(cfg, own)
    if problems is not None:
        problems.extend(own)
    else:
        raise_problems(own)


def _declared(cfg: Config, with_type: bool = False):
    """(dotted YAML path, value, metadata[, annotation]) of every field, in declaration order."""
    def walk(obj, prefix):
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            path = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                yield from walk(value, path + ".")
            else:
                yield (path, value, f.metadata, hints[f.name]) if with_type else (path, value, f.metadata)
    for sec in _FLAT_SECTIONS + _BLOCK_SECTIONS:
        obj = getattr(cfg, sec)
        if obj is not None:
            yield from walk(obj, "" if sec in _FLAT_SECTIONS else sec + ".")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _bounds_text(meta) -> str:
    ge, gt, le, lt = (meta.get(k) for k in ("ge", "gt", "le", "lt"))
    lo = ("[", ge) if ge is not None else ("(", gt) if gt is not None else None
    hi = (le, "]") if le is not None else (lt, ")") if lt is not None else None
    if lo and hi:
        return f"lie in {lo[0]}{_fmt(lo[1])}, {_fmt(hi[0])}{hi[1]}"
    if lo:
        return f"be {'>=' if lo[0] == '[' else '>'} {_fmt(lo[1])}"
    if hi:
        return f"be {'<=' if hi[1] == ']' else '<'} {_fmt(hi[0])}"
    return ""


def _check_declared(path: str, value, meta) -> None:
    if value is None or not meta:
        return
    if isinstance(value, list):
        n = meta.get("length")
        if n is not None and len(value) != n:
            raise ConfigError(f"{path} must have {n} values, got {len(value)}: {_short(value)}")
        for i, v in enumerate(value):
            _check_declared(f"{path}[{i}]", v, {**meta, "length": None})
        return
    if isinstance(value, float) and not math.isfinite(value) and not meta.get("allow_inf"):
        raise ConfigError(f"{path} must be a finite number, got {value}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ge, gt, le, lt = (meta.get(k) for k in ("ge", "gt", "le", "lt"))
        if ((ge is not None and not value >= ge) or (gt is not None and not value > gt)
                or (le is not None and not value <= le) or (lt is not None and not value < lt)):
            raise ConfigError(f"{path} must {_bounds_text(meta)}, got {_fmt(value)}")
    choices = meta.get("choices")
    if choices is not None:
        choices = tuple(choices() if callable(choices) else choices)
        fold = (lambda x: x.lower() if isinstance(x, str) else x) if meta.get("ignore_case") else (lambda x: x)
        if fold(value) not in [fold(c) for c in choices] or (isinstance(value, bool) != isinstance(choices[0], bool)):
            why = f" ({meta['why']})" if meta.get("why") else ""
            shown = f"'{value}'" if isinstance(value, str) else _fmt(value)
            raise ConfigError(f"{path}={shown} is not valid; use one of {', '.join(_fmt(c) for c in choices)}{why}")
    check = meta.get("check")
    if check is not None:
        err = check(value)
        if err:
            raise ConfigError(f"{path}={value!r} is not valid; {err}")


def _cross_checks(cfg: Config, problems: list) -> None:
    """Rules between fields (a single field's rules live in its declaration); each broken rule is
    appended to ``problems``."""
    m, t, d, c = cfg.model, cfg.train, cfg.data, cfg.checkpoint
    add = problems.append
    if t.precision is None or str(t.precision).lower() in PRECISIONS:  # (a bad name is the field's problem)
        _collect(problems, resolve_precision, t)
    if m.num_attention_heads and m.hidden_size % m.num_attention_heads:
        add(f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}")
    if m.max_position_embeddings is not None and m.seq_length > m.max_position_embeddings:
        add(f"seq_length {m.seq_length} exceeds max_position_embeddings {m.max_position_embeddings}")
    bad_attention = _check_attention_config(m.attention_config) if m.attention_config is not None else None
    if bad_attention:
        add(f"attention_config={_short(m.attention_config)} is not valid; {bad_attention}")
    elif m.attention_config is not None:
        n = attention_config_layers(m.attention_config)
        if n != m.num_layers:
            add(f"attention_config covers {n} layers but num_layers is {m.num_layers}; e.g. "
                f"[[[\"global\"], {m.num_layers}]]")
    if m.intermediate_size is not None and m.intermediate_size != 4 * m.hidden_size:
        add(f"intermediate_size {m.intermediate_size} is not valid; the MLP width is 4 x hidden_size = "
            f"{4 * m.hidden_size} (GPT-NeoX's regular MLP); drop the key or set it to {4 * m.hidden_size}")
    if m.num_kv_heads is not None and m.num_kv_heads != m.num_attention_heads:
        add(f"num_kv_heads {m.num_kv_heads} is not valid; grouped-query attention is not implemented, use "
            f"num_kv_heads = num_attention_heads ({m.num_attention_heads}) or drop it")
    if not d.train_data_paths:
        for name in ("train_data_weights", "valid_data_paths", "test_data_paths"):
            if getattr(d, name):
                add(f"{name} is set but train_data_paths is not (with data_path, split cuts the "
                    f"data); set train_data_paths too or drop {name}")
        if d.data_path is not None and _check_split(d.split) is None \
                and float(str(d.split).replace("/", ",").split(",")[0] or 0) <= 0:
            add(f"split '{d.split}' gives the train split no share of {d.data_path}; "
                f"the first number must be > 0, e.g. 969,30,1")
    elif d.train_data_weights is not None and len(d.train_data_weights) != len(d.train_data_paths):
        add(f"train_data_weights has {len(d.train_data_weights)} values for "
            f"{len(d.train_data_paths)} train_data_paths; give one weight per path")
    if cfg.zero_optimization is not None and cfg.zero_topo.preset != "ddp":
        add(f"zero_optimization and zero_topo.preset={cfg.zero_topo.preset} both choose the "
            f"sharding; keep one of them")
    if t.train_batch_size is not None:
        per = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps
        if per and t.train_batch_size % per:
            add(f"train_batch_size {t.train_batch_size} is not a multiple of train_micro_batch_size_per_gpu x "
                f"gradient_accumulation_steps = {per}: no world size gives it")
    if c.finetune_from and c.load:
        add(f"finetune_from ({c.finetune_from}) and load ({c.load}) both name the starting point; keep one "
            f"(load with finetune: true is the same as finetune_from)")


def check_batch_size(cfg: Config, world_size: int) -> None:
    """DeepSpeed's rule, checked once the world is known: train_batch_size = micro-batch x
    accumulation x world size."""
    t = cfg.train
    if t.train_batch_size is None:
        return
    got = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * world_size
    if got != t.train_batch_size:
        per = t.train_micro_batch_size_per_gpu * world_size
        hint = (f"gradient_accumulation_steps {t.train_batch_size // per} gives it" if t.train_batch_size % per == 0
                else f"no accumulation count gives it with micro-batch {t.train_micro_batch_size_per_gpu} on "
                     f"{world_size} ranks")
        raise ConfigError(
            f"train_batch_size {t.train_batch_size} != train_micro_batch_size_per_gpu {t.train_micro_batch_size_per_gpu}"
            f" x gradient_accumulation_steps {t.gradient_accumulation_steps} x world size {world_size} = {got}; "
            f"change one of them ({hint})")


# GPT-NeoX / DeepSpeed keys declared above without a ``neox`` mark that do what they do there
NEOX_IMPLEMENTED = (
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_iters", "seed", "optimizer.type",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "precision", "fp16.enabled",
    "fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window", "fp16.hysteresis",
    "fp16.min_loss_scale", "bf16.enabled", "data_path", "train_data_paths", "valid_data_paths", "test_data_paths",
    "train_data_weights", "tokenizer_type", "log_interval", "log_dir", "tensorboard_dir", "eval_interval",
    "eval_iters", "checkpoint_factor", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "scheduler.params.cos_min_ratio",
)
# where this trainer's default is deliberately not GPT-NeoX's (everything else matches)
NEOX_DEFAULT_DIFFERS = {
    "pos_emb": "GPT-NeoX defaults to learned; only rotary is implemented (its own configs set rotary)",
    "tokenizer_type": "GPT-NeoX defaults to GPT2BPETokenizer (needs vocab/merge files); ours is ByteLevel",
    "num_workers": "GPT-NeoX defaults to 2 loader workers; batches are read in-process here",
    "pipe_parallel_size": "GPT-NeoX defaults to 0; ZeRO sharding replaces pipelining",
    "data_path": "GPT-NeoX has no default; ours is 'builtin' (the Python standard library's source)",
}


def neox_table() -> list[tuple[str, str, str]]:
    """(key, status, why) for every GPT-NeoX / DeepSpeed key: implemented, accepted (valid values
    are what this trainer does anyway; others refused with the reason) or rejected."""
    cfg = Config(zero_optimization=ZeroOptimizationBlock(offload_optimizer=OffloadBlock(),
                                                         offload_param=OffloadBlock()),
                 system=SystemConfig())
    cfg.train.scheduler = SchedulerBlock()
    rows = []
    for path, _value, meta in _declared(cfg):
        status = meta.get("neox") or ("implemented" if path in NEOX_IMPLEMENTED else "")
        if path.startswith("neox."):
            path = path[len("neox."):]
        if not status:
            continue
        why = meta.get("doc", "")
        ch = meta.get("choices")
        if status == "accepted" and ch is not None:
            vals = ", ".join(_fmt(c) for c in (ch() if callable(ch) else ch))
            why = f"{why}; valid: {vals}" + (f"; other values refused: {meta['why']}" if meta.get("why") else "")
        elif meta.get("why") and ch is not None:
            why = f"{why}; other values refused: {meta['why']}"
        if path in NEOX_DEFAULT_DIFFERS:
            why += f" (default differs: {NEOX_DEFAULT_DIFFERS[path]})"
        rows.append((path, status, why))
    rows += [(k, "rejected", v) for k, v in REJECTED_KEYS.items()]
    return rows


def neox_table_markdown() -> str:
    rows = neox_table()
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("implemented", "accepted", "rejected")}
    out = [f"{counts['implemented']} implemented, {counts['accepted']} accepted, {counts['rejected']} rejected "
           f"(generated from megatron_topo/config.py: `python -m megatron_topo.config --neox-table`).", "",
           "| Key | Status | Why |", "|---|---|---|"]
    out += [f"| `{k}` | {s} | {w.replace('|', '/')} |" for k, s, w in rows]
    return "\n".join(out)


def describe_keys() -> str:
    """Every config key with its type, default, valid values and doc (``python -m megatron_topo.config``)."""
    cfg = Config(zero_optimization=ZeroOptimizationBlock(), system=SystemConfig())
    lines = []
    for path, value, meta, tp in _declared(cfg, with_type=True):
        valid = []
        if meta.get("choices") is not None:
            ch = meta["choices"]
            valid.append("one of " + ", ".join(_fmt(c) for c in (ch() if callable(ch) else ch)))
        b = _bounds_text(meta)
        if b:
            valid.append(b.replace("lie in ", "in ").replace("be ", ""))
        if meta.get("check") is _check_split:
            valid.append("up to 3 non-negative numbers")
        elif meta.get("check") is _check_block:
            valid.append("a power of two in [64, 8192]")
        if meta.get("length"):
            valid.append(f"{meta['length']} values")
        opt = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
        typ = re.sub(r"\b(an?) ", "", _type_name(tp)).replace(" (true/false)", "") + (" or null" if opt else "")
        default = "null" if value is None else _fmt(value) if not isinstance(value, list) else str(value)
        lines.append(f"{path:<42} {typ:<28} default {default:<14} {'; '.join(valid):<36} {meta.get('doc', '')}".rstrip())
    return "\n".join(lines)


def flat_dict(cfg: Config) -> dict:
    """Config as GPT-NeoX-style flat keys + nested blocks (what ``load_config`` reads back)."""
    out = {}
    for sec in _FLAT_SECTIONS:
        out.update(dataclasses.asdict(getattr(cfg, sec)))
    for sec in _BLOCK_SECTIONS:
        val = getattr(cfg, sec)
        if val is not None:
            out[sec] = dataclasses.asdict(val)
    return out


def write_effective_config(cfg: Config, directory: str, name: str = "config.yml") -> str:
    """Atomically write the effective config into ``directory``; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(cfg.to_flat_yaml())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def config_fingerprint(cfg: Config) -> str:
    return json.dumps(flat_dict(cfg), sort_keys=True)


if __name__ == "__main__":  # python -m megatron_topo.config: every key, its type, default and valid values
    import sys

    print(neox_table_markdown() if "--neox-table" in sys.argv[1:] else describe_keys())
