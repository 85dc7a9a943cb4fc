"""The config dataclasses: one section per job (model, train, data, logging, checkpoint, topology,
zero_topo, distributed, system), each field declared once with its checks (``option``), and the
``Config`` that holds them; GPT-NeoX's flat keys are routed to the section that owns them."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from ..zero_topo import plan_space
from ..zero_topo.plan_space import PRESETS
from .deepspeed import SchedulerBlock, ZeroOptimizationBlock
from .neox import NeoxCompatConfig
from .options import _check_block, _check_split, _strip_optional, _tokenizer_names, option
from .precision import resolve_precision

INIT_METHODS = ("normal", "scaled_normal", "small_init", "wang_init")
MAX_VOCAB = 2**31 - 1  # token ids are int32 in datasets with >= 65500 ids (GPT-NeoX)


@dataclass
class ModelConfig:
    num_layers: int = option(2, "transformer layers (required in a config file)", ge=1, le=1 << 12, neox="implemented")
    hidden_size: int = option(64, "model width (required in a config file)", ge=1, le=1 << 18, neox="implemented")
    num_attention_heads: int = option(
        4, "attention heads (must divide hidden_size; required in a config file)", ge=1, le=1 << 14, neox="implemented"
    )
    seq_length: int = option(
        64, "tokens per training sample (required in a config file)", ge=1, le=1 << 20, neox="implemented"
    )
    max_position_embeddings: Optional[int] = option(
        None, "position limit (required in a config file; in code: seq_length)", ge=1, neox="implemented"
    )
    vocab_size: int = option(
        512,
        "padded vocabulary size; unset in a config file: the tokenizer's size padded "
        "to a multiple of make_vocab_size_divisible_by (GPT-NeoX's padded_vocab_size)",
        ge=1,
        le=MAX_VOCAB,
    )
    make_vocab_size_divisible_by: int = option(
        128, "pad the derived vocabulary to a multiple of this", ge=1, neox="implemented"
    )
    pos_emb: str = option(
        "rotary",
        "positional embedding (GPT-NeoX's default is learned)",
        choices=("rotary",),
        neox="accepted",
        why="only rotary embeddings are implemented; GPT-NeoX's own configs set pos_emb: rotary",
    )
    rotary_pct: float = option(
        1.0, "fraction of each head's dims that get rotary embeddings", ge=0.0, le=1.0, neox="implemented"
    )
    rotary_emb_base: int = option(10000, "rotary frequency base", ge=1, neox="implemented")
    gpt_j_residual: bool = option(False, "parallel attention + MLP residual (GPT-NeoX-20B, Pythia)", neox="implemented")
    no_weight_tying: bool = option(
        False,
        "untied input/output embeddings (false: the output layer uses the "
        "embedding's weight, sharded once by the embedding unit)",
        neox="implemented",
    )
    norm: str = option(
        "layernorm",
        "normalisation layer (rmsnorm: the llama architecture)",
        choices=("layernorm", "rmsnorm"),
        neox="implemented",
        why="scalenorm is not implemented",
    )
    layernorm_epsilon: float = option(1e-5, "LayerNorm epsilon", gt=0.0, neox="implemented")
    init_method: str = option(
        "normal",
        "weight init of the input-side layers",
        choices=INIT_METHODS,
        neox="implemented",
        why="orthogonal and xavier inits are not implemented",
    )
    output_layer_init_method: str = option(
        "scaled_normal",
        "weight init of the attention/MLP output projections (scaled_normal: init_method_std / sqrt(2 num_layers))",
        choices=INIT_METHODS,
        neox="implemented",
        why="orthogonal and xavier inits are not implemented",
    )
    init_method_std: float = option(0.02, "std of normal and scaled_normal", gt=0.0, neox="implemented")
    checkpoint_activations: bool = option(
        False, "recompute each layer's activations in the backward pass", neox="implemented"
    )
    checkpoint_num_layers: int = option(
        1, "layers per recomputed chunk", choices=(1,), neox="accepted", why="each layer is recomputed on its own"
    )
    attention_dropout: float = option(0.0, "dropout on attention probabilities", ge=0.0, lt=1.0, neox="implemented")
    hidden_dropout: float = option(0.0, "dropout on residual branches", ge=0.0, lt=1.0, neox="implemented")
    attention_config: Optional[list[Any]] = option(
        None, "GPT-NeoX's per-layer attention types (global/flash; checked with num_layers)", neox="accepted"
    )
    # ---- architecture (model/spec.py): GPT-NeoX's keys pick and shape the model spec
    arch: Optional[str] = option(
        None,
        "model spec: gpt_neox | llama (default: llama when norm is rmsnorm, "
        "activation is swiglu/silu or mlp_type is llama, else gpt_neox)",
        choices=("gpt_neox", "llama"),
    )
    activation: str = option(
        "gelu",
        "MLP activation: gelu (gpt_neox), swiglu (gated, GPT-NeoX's ParallelMLP), silu (with mlp_type: llama)",
        choices=("gelu", "swiglu", "silu"),
        neox="implemented",
        why="other activations are not implemented",
    )
    mlp_type: str = option(
        "regular",
        "MLP kind: llama is GPT-NeoX's LLaMAParallelMLP (SiLU-gated, no biases, "
        "width intermediate_size or 8h/3 rounded up to 256)",
        choices=("regular", "llama"),
        neox="implemented",
    )
    intermediate_size: Optional[int] = option(
        None,
        "MLP width before GPT-NeoX's sizing rule (gpt_neox: 4 x "
        "hidden_size; swiglu: the inner width is int(2/3 x it) / 2, rounded "
        "to mlp_multiple_of)",
        ge=1,
        neox="implemented",
    )
    mlp_multiple_of: int = option(
        1, "round the MLP width up to a multiple of this (GPT-NeoX's ParallelMLP)", ge=1, neox="implemented"
    )
    num_kv_heads: Optional[int] = option(
        None,
        "key/value heads: grouped-query (1: multi-query) attention in the "
        "llama architecture (gpt_neox: must equal num_attention_heads)",
        ge=1,
        neox="implemented",
    )
    attention_type: Optional[str] = option(
        None,
        "GPT-NeoX's attention kind (llemma): the kind follows num_kv_heads",
        choices=("multihead", "groupedquery", "multiquery"),
        neox="accepted",
    )
    sliding_window_width: Optional[int] = option(
        None,
        "llama: each token attends to itself and the W - 1 tokens before it (HF Mistral's sliding window)",
        ge=1,
        neox="implemented",
    )
    rms_norm_epsilon: float = option(1e-8, "RMSNorm epsilon (GPT-NeoX's default)", gt=0.0, neox="implemented")
    use_bias_in_norms: bool = option(True, "norm biases (LayerNorm; RMSNorm has none: set false)", neox="implemented")
    use_bias_in_attn_linear: bool = option(True, "attention projection biases (gpt_neox: always)", neox="implemented")
    use_bias_in_mlp: bool = option(True, "MLP biases (gpt_neox: always; mlp_type llama: never)", neox="implemented")
    gpt_j_tied: bool = option(
        False,
        "one LayerNorm for both parallel branches",
        choices=(False,),
        neox="accepted",
        why="the parallel residual has a LayerNorm per branch, as GPT-NeoX-20B and Pythia",
    )
    output_layer_parallelism: str = option(
        "column", "tensor-parallel split of the output layer", choices=("column",), neox="accepted"
    )

    def __post_init__(self):
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length


@dataclass
class OptimizerParams:
    lr: float = option(6e-4, "peak learning rate", ge=0.0)
    betas: list[float] = option(doc="Adam (beta1, beta2)", factory=lambda: [0.9, 0.95], ge=0.0, lt=1.0, length=2)
    eps: float = option(1e-8, "Adam epsilon", gt=0.0)
    weight_decay: Optional[float] = option(
        None, "DeepSpeed's place for weight_decay (the same setting; give one)", ge=0.0, neox="implemented"
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
    loss_scale: float = option(0.0, "static loss scale (0: dynamic)", ge=0.0)
    initial_scale_power: int = option(16, "dynamic scaling starts at 2**N", ge=0, le=127)
    loss_scale_window: int = option(1000, "clean steps before the scale grows", ge=1)
    hysteresis: int = option(2, "overflows tolerated before the scale backs off", ge=1)
    min_loss_scale: float = option(1.0, "lowest dynamic loss scale", gt=0.0)
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
    loss_scale: Optional[float] = option(None, _BF16_SCALING, neox="accepted")
    initial_scale_power: Optional[int] = option(None, _BF16_SCALING, neox="accepted")
    loss_scale_window: Optional[int] = option(None, _BF16_SCALING, neox="accepted")
    hysteresis: Optional[int] = option(None, _BF16_SCALING, neox="accepted")
    min_loss_scale: Optional[float] = option(None, _BF16_SCALING, neox="accepted")


PRECISIONS = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16", "half")


@dataclass
class TrainConfig:
    train_micro_batch_size_per_gpu: int = option(4, "samples per rank per micro-batch", ge=1, le=1 << 16)
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step", ge=1, le=1 << 14)
    train_iters: int = option(100, "optimizer steps to train", ge=1)
    seed: int = option(1234, "seed of initialisation and data order", ge=0, le=2**32 - 1)
    optimizer: OptimizerBlock = field(default_factory=OptimizerBlock)
    train_batch_size: Optional[int] = option(
        None,
        "DeepSpeed's global batch = micro-batch x accumulation x world size; the accumulation count is derived from it",
        ge=1,
        neox="implemented",
    )
    weight_decay: float = option(0.1, "decoupled weight decay", ge=0.0, neox="implemented")
    gradient_clipping: float = option(1.0, "clip the global gradient norm to this (0: off)", ge=0.0, neox="implemented")
    lr_decay_style: str = option(
        "linear",
        "learning-rate decay after warmup",
        choices=("linear", "cosine", "constant"),
        neox="implemented",
        why="exponential decay is not implemented",
    )
    lr_decay_iters: Optional[int] = option(
        None, "steps of warmup + decay (default: train_iters)", ge=1, neox="implemented"
    )
    warmup: float = option(
        0.01, "warmup as a fraction of lr_decay_iters (GPT-NeoX convention)", ge=0.0, le=1.0, neox="implemented"
    )
    min_lr: float = option(0.0, "learning rate at the end of the decay", ge=0.0, neox="implemented")
    warmup_iters: Optional[int] = option(
        None,
        "warmup in steps, as llemma's GPT-NeoX files give it (upstream "
        "GPT-NeoX does not declare it): sets warmup = warmup_iters / lr_decay_iters",
        ge=0,
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
    max_bad_steps: int = option(5, "bf16/fp32: abort after this many consecutive non-finite steps", ge=1)


@dataclass
class DataConfig:
    data_path: Optional[str] = option("builtin", "dataset PREFIX (PREFIX.bin/.idx) cut by split, or 'builtin'")
    train_data_paths: Optional[list[str]] = option(None, "train dataset prefixes (blended; overrides data_path)")
    valid_data_paths: Optional[list[str]] = option(None, "validation dataset prefixes")
    test_data_paths: Optional[list[str]] = option(None, "test dataset prefixes")
    train_data_weights: Optional[list[float]] = option(None, "blend weight per train path", gt=0.0)
    split: str = option(
        "969,30,1", "train,valid,test shares of data_path's documents", check=_check_split, neox="implemented"
    )
    tokenizer_type: str = option("ByteLevel", "tokenizer (GPT-NeoX names)", choices=_tokenizer_names, ignore_case=True)
    vocab_file: Optional[str] = option(
        None, "tokenizer file (HFTokenizer, SPMTokenizer, GPT2BPETokenizer)", neox="implemented"
    )
    merge_file: Optional[str] = option(
        None,
        "GPT-2 merges.txt (GPT2BPETokenizer, HFGPT2Tokenizer; HFTokenizer, "
        "SPMTokenizer and CharLevelTokenizer ignore it, as in GPT-NeoX: noted)",
        neox="implemented",
    )
    data_impl: str = option(
        "mmap",
        "indexed dataset format",
        choices=("mmap", "infer"),
        neox="accepted",
        why="only the mmap format is read; convert cached datasets with tools/preprocess_data.py",
    )
    data_cache_dir: Optional[str] = option(None, "index caches and the built-in corpus (default: data_cache)")
    num_workers: int = option(
        0,
        "data loader processes: accepted, batches are read in the training process from memory-mapped files",
        ge=0,
        neox="accepted",
    )
    builtin_corpus_bytes: int = option(4_000_000, "cap on stdlib source read for data_path: builtin", ge=1)


@dataclass
class LoggingConfig:
    log_interval: int = option(10, "steps per metrics record", ge=1)
    log_dir: str = option("runs/default", "metrics.jsonl, config.yml and tensorboard/ go here")
    tensorboard_dir: Optional[str] = option(None, "default: {log_dir}/tensorboard")
    eval_interval: int = option(100, "steps between evaluations (0: never; the one way to turn evaluation off)", ge=0)
    eval_iters: int = option(10, "micro-batches per evaluation (>= 1 while eval_interval > 0)", ge=0, le=1 << 14)
    progress_bar: bool = option(True, "tqdm progress bar on rank 0")


@dataclass
class CheckpointConfig:
    save: Optional[str] = option(None, "checkpoint directory to save into", neox="implemented")
    load: Optional[str] = option(
        None,
        "checkpoint (save directory or global_stepN) to resume from, or a "
        "HuggingFace GPT-NeoX folder (then as finetune_from)",
        neox="implemented",
    )
    checkpoint_factor: int = option(0, "save every N steps (0: only at the end when `save` is set)", ge=0)
    keep_last: int = option(2, "newest checkpoints kept (0: all)", ge=0)
    keep_last_n_checkpoints: Optional[int] = option(None, "GPT-NeoX's name of keep_last", ge=0, neox="implemented")
    finetune_from: Optional[str] = option(
        None,
        "start from these weights at step 0 with a fresh optimizer: a "
        "HuggingFace GPT-NeoX folder (config.json + safetensors/bin) or one "
        "of our checkpoints",
    )
    finetune: bool = option(False, "with load: weights only, step 0, fresh optimizer (GPT-NeoX)", neox="implemented")
    no_load_optim: bool = option(False, "with load: do not load the optimizer state (GPT-NeoX)", neox="implemented")
    extra_save_iters: Optional[list[int]] = option(
        None,
        "also save at these steps (GPT-NeoX; Pythia's log-spaced checkpoints; 0: before the first step of a fresh run)",
        ge=0,
        neox="implemented",
    )
    auto_resume: bool = option(False, "no `load`: resume from `save` when it holds a checkpoint, else start fresh")
    save_interval_minutes: float = option(0.0, "also save every N minutes of training (rank 0's clock; 0: off)", ge=0.0)
    load_unverified: bool = option(
        False,
        "load a checkpoint whose meta.json records no size and SHA-256 for its "
        "rank files (their bytes cannot be verified; refused otherwise)",
    )
    finetune_architecture_change: bool = option(
        False,
        "finetune_from one of our checkpoints into a model whose "
        "architecture keys differ from the saved ones (refused otherwise)",
    )


@dataclass
class TopologyConfig:
    gcds_per_gpu: int = option(1, "ranks per GPU package (2 on MI250X)", ge=1)
    gpus_per_node: Optional[int] = option(None, "default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE / world", ge=1)


@dataclass
class ZeroTopoConfig:
    preset: str = option(
        "ddp",
        "sharding preset (docs/design.md §4.2); auto: the fastest legal plan that "
        "fits, from the performance and memory models (needs a system: block)",
        choices=PRESETS + ("auto",),
    )
    weight_factor: Optional[int] = option(None, "ranks the 16-bit weights are split over", ge=1)
    grad_factor: Optional[int] = option(None, "ranks the gradients are split over", ge=1)
    optimizer_factor: Optional[int] = option(None, "ranks the fp32 master + Adam moments are split over", ge=1)
    secondary_degree: Optional[int] = option(None, "ranks of the secondary (hpZ) weight copy (0: none)", ge=0)
    weight_bits: Optional[int] = option(None, "bits of the weight all-gather", choices=plan_space.WEIGHT_BITS)
    secondary_bits: Optional[int] = option(None, "bits of the secondary copy", choices=plan_space.SECONDARY_BITS)
    grad_bits: Optional[int] = option(None, "bits of the gradient reduce-scatter", choices=plan_space.GRAD_BITS)
    combine_bits: Optional[int] = option(
        None,
        "bits of the once-per-step cross-replica gradient combine "
        "(16: the compute dtype; 8: INT8 reduce-scatter + all-gather, fp32 sums)",
        choices=plan_space.COMBINE_BITS,
    )
    publish_bits: Optional[int] = option(
        None,
        "bits of the post-step weight all-gather (8: INT8; each rank's own shard and the fp32 master stay exact)",
        choices=plan_space.PUBLISH_BITS,
    )
    error_feedback: bool = option(
        False,
        "add each low-bit gradient quantization's residual (in-node reduction, "
        "quantized combine) to the next one; fp32 residuals, kept in checkpoints",
    )
    quant_block_size: int = option(
        plan_space.QUANT_BLOCK_SIZE, "elements per weight quantization scale", check=_check_block
    )
    grad_quant_block_size: int = option(
        plan_space.GRAD_QUANT_BLOCK_SIZE, "elements per gradient quantization scale", check=_check_block
    )
    inter_node_reduce: str = option("allreduce", "cross-replica combine", choices=plan_space.INTER_NODE_REDUCES)
    prefetch: bool = option(True, "gather the next unit's weights while computing this one")
    bucket_size: int = option(
        0,
        "reserved",
        choices=(0,),
        why="units (one per layer) are the communication buckets; coalescing is not implemented",
    )
    kernels: str = option(
        "auto",
        "quantization kernels (auto: triton on GPUs, cpu_fast on CPUs)",
        choices=("auto", "triton", "cpu_fast", "reference"),
    )
    auto_trials: int = option(
        4,
        "preset auto: time this many of the plans modelled within auto_trial_window of "
        "the fastest for a few steps before training and train with the fastest measured "
        "(0 or 1: the model's choice, untimed)",
        ge=0,
    )
    auto_trial_steps: int = option(
        3,
        "preset auto: timed optimizer steps per plan and pass (after one warm-up "
        "step; every plan gets two passes, the second in reverse order); per pass the "
        "median of the slowest rank's steps, the fastest pass decides",
        ge=1,
    )
    auto_trial_passes: int = option(
        4,
        "preset auto: the most passes a plan is timed; after the two passes of "
        "every plan, the two fastest get more while within 15 % of each other "
        "(1: one pass, no reverse pass)",
        ge=1,
    )
    auto_trial_window: float = option(
        0.25,
        "preset auto: time only plans modelled within this fraction of the "
        "fastest (0.25: the step models' validated error per plan)",
        ge=0.0,
    )
    # bitwise-reproducible cross-replica sums (all-gather + sum in rank order, W x the traffic):
    # any world size then equals one process with the same global batch, bit for bit
    deterministic: bool = option(False, "bitwise-reproducible cross-replica sums (W x the traffic)")


AUTO_TRIAL_KEYS = ("auto_trials", "auto_trial_steps", "auto_trial_passes", "auto_trial_window")  # preset auto only


@dataclass
class SystemConfig:
    """Machine description used by the planner and the performance model (not by training)."""

    name: str = option("local_cpu", "machine name")
    device_memory_gib: float = option(64.0, "memory per device", gt=0.0)
    memory_reserve_gib: Optional[float] = option(
        None,
        "memory per device kept free for what the engine's tensors do not count: the GPU context, "
        "NCCL/RCCL buffers, the caching allocator's fragmentation (default: 8 % of device_memory_gib; each "
        "configs/ system file states its own and where it comes from)",
        ge=0.0,
    )
    peak_tflops: float = option(191.5, "per device, advertised dense fp16/bf16", gt=0.0)
    gemm_tflops: float = option(125.0, "per device, measured large GEMM", gt=0.0)
    bw_intra_gpu_gbs: float = option(200.0, "GB/s per direction between the GCDs of one package", gt=0.0)
    bw_intra_node_gbs: float = option(50.0, "GB/s per direction between packages of one node", gt=0.0)
    bw_inter_node_gbs: float = option(25.0, "GB/s per direction per NIC", gt=0.0)
    nics_per_node: int = option(4, "NICs per node", ge=1)
    latency_intra_gpu_us: float = option(2.0, "per-message latency between GCDs of a package", ge=0.0)
    latency_intra_node_us: float = option(5.0, "per-message latency inside a node", ge=0.0)
    latency_inter_node_us: float = option(10.0, "per-message latency between nodes", ge=0.0)
    latency_small_message_us: float = option(
        5.0,
        "per ring step of a tiny collective: the quantization scales "
        "DeepSpeed sends apart from their payload (perf model, stack deepspeed)",
        ge=0.0,
    )
    # added for the performance model (megatron_topo/analysis/perf_model/)
    compute_efficiency: float = option(0.40, "achieved fraction of peak_tflops in GEMM-heavy training", gt=0.0, le=1.0)
    hbm_bw_gbs: float = option(1600.0, "device memory bandwidth, for memory-bound steps (optimizer)", gt=0.0)
    # which step model ranks plans (preset: auto, tools/plan.py)
    step_model: str = option(
        "device",
        "device: GPUs (megatron_topo.perf_model.estimate_step); emulated_cpu: gloo "
        "ranks sharing CPU cores (emulation.predict.estimate_emulated: compute, quantization "
        "and transport all cost CPU time)",
        choices=("device", "emulated_cpu"),
    )
    quant_ns_per_element: float = option(0.0, "emulated_cpu: CPU ns per element through a quantization kernel", ge=0.0)
    cpu_transport_gbs: float = option(0.84, "emulated_cpu: GB/s of gloo's copying, machine-wide", gt=0.0)
    cpu_call_us: float = option(0.0, "emulated_cpu: CPU us per ring step of a collective call", ge=0.0)
    cpu_optimizer_ns_per_param: float = option(
        0.0, "emulated_cpu: CPU ns per optimizer-shard parameter per step", ge=0.0
    )


@dataclass
class DistributedConfig:
    backend: str = option("auto", "auto: nccl on GPUs, gloo on CPU", choices=("auto", "nccl", "gloo", "mpi"))
    collective_timeout_s: float = option(600.0, "a collective waiting longer than this fails the run", gt=0.0)
    device: str = option("auto", "auto: cuda when a GPU is visible, else cpu", choices=("auto", "cpu", "cuda"))
    trace_collectives: Optional[str] = option(
        None,
        "a directory: every rank writes rank_{r}.jsonl there, one JSON "
        "line per collective as it is issued (seq, op, group, bytes, dtype), "
        "flushed at once: the last collective of every rank after a hang",
    )


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
        # DeepSpeed "auto" keys (HF Trainer files) -> the value taken from the rest of the config
        self.auto_values: dict = {}
        # which of train_batch_size / micro-batch / accumulation a config file set (DeepSpeed derives the
        # others once the world size is known); None: built in code, micro-batch and accumulation hold
        self.batch_given: Optional[frozenset] = None

    # ---- derived
    @property
    def precision(self) -> str:
        return resolve_precision(self.train)

    def to_flat_yaml(self) -> str:
        """The effective config as a YAML file that loads back into the same Config."""
        return yaml.safe_dump(flat_dict(self), sort_keys=False)


# Sections whose fields are top-level YAML keys (GPT-NeoX is flat) and blocks that are nested.
_FLAT_SECTIONS = ("model", "train", "data", "logging", "checkpoint", "neox")
_BLOCK_SECTIONS = ("topology", "zero_topo", "zero_optimization", "distributed", "system")


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
