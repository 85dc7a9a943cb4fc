"""GPT-NeoX compatibility: the top-level NeoX / DeepSpeed keys accepted because their valid values
are what this trainer does anyway, the keys refused outright, and the tables behind
docs/neox_compat.md (which keys are implemented, where a default differs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .deepspeed import DataTypesBlock
from .options import option

_ANY_BOOL = (
    "a kernel-fusion or bookkeeping choice; attention runs through scaled_dot_product_attention and the "
    "math is the same either way"
)
_PARALLEL_WHY = (
    "not used, the model is computed whole on every rank and ZeRO sharding (zero_topo.preset / "
    "zero_optimization) splits its states instead; the math is the same"
)


def _mapping(v) -> Optional[str]:
    return None if isinstance(v, dict) else "expected a mapping of DeepSpeed's keys"


@dataclass
class NeoxCompatConfig:
    """GPT-NeoX / DeepSpeed top-level keys that are accepted because their valid values are what this
    trainer does anyway (no effect); other values are refused with the reason."""

    pipe_parallel_size: int = option(1, "pipeline stages: " + _PARALLEL_WHY, ge=0, neox="accepted")
    model_parallel_size: int = option(
        1,
        "tensor-parallel degree: " + _PARALLEL_WHY + "; the derived vocabulary is "
        "still padded to make_vocab_size_divisible_by x model_parallel_size, as in "
        "GPT-NeoX",
        ge=1,
        neox="accepted",
    )
    scaled_upper_triang_masked_softmax_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    scaled_masked_softmax_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    bias_gelu_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    bias_dropout_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    rope_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    layernorm_fusion: bool = option(False, _ANY_BOOL, neox="accepted")
    apply_query_key_layer_scaling: bool = option(False, "the same softmax in fp32 either way", neox="accepted")
    attention_softmax_in_fp32: bool = option(
        False, "softmax accumulates in fp32 in every attention kernel used", neox="accepted"
    )
    use_cpu_initialization: bool = option(
        False, "init is sharded unit by unit on the device either way", neox="accepted"
    )
    partition_activations: bool = option(
        False, "without tensor parallelism there is nothing to partition", neox="accepted"
    )
    contiguous_checkpointing: bool = option(False, "memory layout of recomputed activations", neox="accepted")
    synchronize_each_layer: bool = option(False, "a profiling aid: layers are not synchronised", neox="accepted")
    steps_per_print: int = option(10, "DeepSpeed's print interval: metrics follow log_interval", ge=1, neox="accepted")
    wall_clock_breakdown: bool = option(False, "step timings are always in metrics.jsonl", neox="accepted")
    distributed_backend: str = option(
        "nccl",
        "the backend follows distributed.backend (auto: nccl on GPUs, gloo on CPU)",
        choices=("nccl", "gloo", "mpi"),
        neox="accepted",
    )
    deepspeed: bool = option(True, "always true in GPT-NeoX", neox="accepted")
    launcher: str = option("pdsh", "DeepSpeed runner: this trainer is launched by torchrun or srun", neox="accepted")
    deepspeed_slurm: bool = option(False, "the launcher is read from the environment (torchrun/srun)", neox="accepted")
    deepspeed_mpi: bool = option(False, "the launcher is read from the environment (torchrun/srun)", neox="accepted")
    hostfile: Optional[str] = option(None, "DeepSpeed runner host list (unused: torchrun/srun)", neox="accepted")
    master_port: int = option(
        29500, "DeepSpeed runner port (torchrun/srun set MASTER_PORT)", ge=0, le=65535, neox="accepted"
    )
    zero_allow_untested_optimizer: bool = option(False, "Adam(W) is the optimizer", neox="accepted")
    prescale_gradients: bool = option(
        False,
        "gradients are averaged in fp32 after the reduce",
        choices=(False,),
        neox="accepted",
        why="pre-scaling is not implemented",
    )
    gradient_predivide_factor: float = option(
        1.0,
        "gradients are averaged after the reduce",
        choices=(1.0,),
        neox="accepted",
        why="pre-division is not implemented",
    )
    fp32_allreduce: bool = option(False, "gradient reduces accumulate in fp32 (or int8/int4 per plan)", neox="accepted")
    mmap_warmup: bool = option(False, "reading is memory-mapped and lazy", neox="accepted")
    use_shared_fs: bool = option(
        True,
        "index caches are built by rank 0 on the shared file system",
        choices=(True,),
        neox="accepted",
        why="node-local index building is not implemented",
    )
    eod_mask_loss: bool = option(
        False,
        "mask the loss on end-of-document tokens",
        choices=(False,),
        neox="accepted",
        why="not implemented: every target token counts",
    )
    checkpoint_scale: str = option(
        "linear",
        "checkpoint spacing",
        choices=("linear",),
        neox="accepted",
        why="checkpoints are every checkpoint_factor steps (log spacing not implemented)",
    )
    no_save_optim: bool = option(
        False,
        "checkpoints always hold the optimizer",
        choices=(False,),
        neox="accepted",
        why="a checkpoint without optimizer states could not resume",
    )
    no_save_rng: bool = option(
        False,
        "checkpoints always hold the RNG state",
        choices=(False,),
        neox="accepted",
        why="a checkpoint without RNG state could not resume exactly",
    )
    no_load_rng: bool = option(False, "RNG state is loaded on an exact resume", neox="accepted")
    override_lr_scheduler: bool = option(False, "the schedule always comes from the config", neox="accepted")
    use_checkpoint_lr_scheduler: bool = option(
        False,
        "the schedule always comes from the config",
        choices=(False,),
        neox="accepted",
        why="the schedule is computed from the config's keys",
    )
    use_wandb: bool = option(
        False,
        "Weights & Biases logging is not implemented: metrics go to metrics.jsonl and TensorBoard",
        neox="accepted",
    )
    checkpoint_validation_with_forward_pass: bool = option(
        False,
        "save a forward pass's logits with each checkpoint and compare them after loading",
        choices=(False,),
        neox="accepted",
        why="not implemented",
    )
    wandb_project: Optional[str] = option(None, "unused (wandb is not implemented)", neox="accepted")
    wandb_group: Optional[str] = option(None, "unused (wandb is not implemented)", neox="accepted")
    wandb_team: Optional[str] = option(None, "unused (wandb is not implemented)", neox="accepted")
    wandb_host: Optional[str] = option(None, "unused (wandb is not implemented)", neox="accepted")
    log_grad_norm: bool = option(False, "the gradient norm is always logged (grad_norm)", neox="accepted")
    log_param_norm: bool = option(
        False, "parameter norm logging", choices=(False,), neox="accepted", why="not implemented"
    )
    log_optimizer_states: bool = option(
        False, "optimizer-state norm logging", choices=(False,), neox="accepted", why="not implemented"
    )
    sparse_gradients: bool = option(
        False,
        "DeepSpeed's sparse embedding gradients",
        choices=(False,),
        neox="accepted",
        why="not implemented: embedding gradients are dense",
    )
    memory_breakdown: bool = option(
        False, "DeepSpeed's memory printout: peak memory is in metrics.jsonl (peak_mem_bytes)", neox="accepted"
    )
    dump_state: bool = option(False, "DeepSpeed's debugging printout of its state", neox="accepted")
    zero_force_ds_cpu_optimizer: bool = option(
        True,
        "DeepSpeed's CPU-optimizer check: Adam(W) runs on the device (offload is not implemented)",
        neox="accepted",
    )
    aio: Optional[dict] = option(
        None,
        "DeepSpeed's async I/O settings for NVMe offload (offload is not implemented)",
        check=_mapping,
        neox="accepted",
    )
    data_types: Optional[DataTypesBlock] = option(None, "DeepSpeed's data_types block (grad_accum_dtype)")
    comms_logger: Optional[dict] = option(
        None,
        "DeepSpeed's communication logger: not implemented; per-step communication volumes are in metrics.jsonl",
        check=_mapping,
        neox="accepted",
    )
    comment: Optional[str] = option(
        None,
        "a DeepSpeed runner option (srun --comment): this trainer is launched by torchrun or srun, which take it",
        neox="accepted",
    )
    account: Optional[str] = option(
        None,
        "a DeepSpeed runner option (srun --account): this trainer is launched by torchrun or srun, which take it",
        neox="accepted",
    )
    log_gradient_noise_scale: bool = option(
        False, "gradient noise scale logging", choices=(False,), neox="accepted", why="not implemented"
    )


# GPT-NeoX / DeepSpeed keys that are refused outright (no value of them is what this trainer does)
REJECTED_KEYS = {
    "sparsity_config": "sparse attention is not implemented (dense causal attention only)",
    "num_unique_layers": "layer sharing is not implemented",
    "param_sharing_style": "layer sharing is not implemented",
    "label_data_paths": "label datasets are not implemented: targets are the inputs shifted by one",
    "soft_prompt_tuning": "soft prompt tuning is not implemented",
    "use_mup": "muP is not implemented",
    "s3_path": "S3 upload of checkpoints is not implemented; copy the save folder",
    "moe_num_experts": "mixture of experts is not implemented",
    "curriculum_learning": "curriculum learning is not implemented",
    "sequence_parallel": "ZeRO sharding replaces tensor/sequence parallelism here; drop it",
    "weight_by_num_documents": "blend weights come from train_data_weights",
    "activation_checkpointing": "use checkpoint_activations: true (DeepSpeed's block is not read)",
    "amp": "use precision: bf16 or fp16 (Apex AMP is not used)",
}


# GPT-NeoX / DeepSpeed keys declared in schema.py / deepspeed.py without a ``neox`` mark that do what they do there
NEOX_IMPLEMENTED = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_iters",
    "seed",
    "optimizer.type",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "precision",
    "fp16.enabled",
    "fp16.loss_scale",
    "fp16.initial_scale_power",
    "fp16.loss_scale_window",
    "fp16.hysteresis",
    "fp16.min_loss_scale",
    "bf16.enabled",
    "data_path",
    "train_data_paths",
    "valid_data_paths",
    "test_data_paths",
    "train_data_weights",
    "tokenizer_type",
    "log_interval",
    "log_dir",
    "tensorboard_dir",
    "eval_interval",
    "eval_iters",
    "checkpoint_factor",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "scheduler.params.cos_min_ratio",
)
# where this trainer's default is deliberately not GPT-NeoX's (everything else matches)
NEOX_DEFAULT_DIFFERS = {
    "pos_emb": "GPT-NeoX defaults to learned; only rotary is implemented (its own configs set rotary)",
    "tokenizer_type": "GPT-NeoX defaults to GPT2BPETokenizer; so does a config that names vocab_file or "
    "merge_file here; without tokenizer files ours is ByteLevel (GPT2BPETokenizer needs them)",
    "num_workers": "GPT-NeoX defaults to 2 loader workers; batches are read in-process here",
    "pipe_parallel_size": "GPT-NeoX defaults to 0; ZeRO sharding replaces pipelining",
    "data_path": "GPT-NeoX has no default; ours is 'builtin' (the Python standard library's source)",
    "train_iters": "GPT-NeoX has no default (its model files, e.g. llama/7B.yml, leave it to a training file); "
    "ours is 100",
    "train_micro_batch_size_per_gpu": "GPT-NeoX has no default (it needs this or train_batch_size); ours is 4, "
    'and a DeepSpeed "auto" left unfilled takes it, named in the note line',
}
