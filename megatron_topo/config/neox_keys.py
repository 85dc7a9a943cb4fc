"""Keys GPT-NeoX (megatron/neox_arguments/neox_args.py, deepspeed_args.py) and DeepSpeed declare that
this trainer does not read, each with the reason: a config that names one gets "GPT-NeoX key X is
not supported here: reason" instead of an unknown-key error suggesting a look-alike key.

A key declared in schema.py wins over this table (the loader looks there first), so a key that
becomes implemented needs no edit here to work; ``neox_table`` lists it once, as declared."""
from __future__ import annotations

_MOE = "mixture of experts is not implemented"
_MUP = "muP is not implemented"
_TE = "Transformer Engine layers are not used (attention and MLP are plain torch modules)"
_MAMBA = "Mamba blocks are not implemented"
_RWKV = "RWKV blocks are not implemented"
_GEN = "a text-generation/evaluation setting of GPT-NeoX's generate.py/eval.py; use tools/generate.py's options"
_SET = "set by GPT-NeoX itself while it runs, not by a config"
_RUNNER = "a DeepSpeed runner (deepspeed launcher) option: this trainer is launched by torchrun or srun"
_POST = "post-training (SFT/DPO/KTO/reward-model) data and losses are not implemented: pre-training only"
_COMET = "Comet logging is not implemented: metrics go to metrics.jsonl and TensorBoard"
_PROFILE = "the profiler hooks are not implemented; use torch.profiler around train.py"
_DS_BLOCK = "this DeepSpeed block is not read"

NEOX_UNSUPPORTED = {
    # parallelism
    "pipe_partition_method": "pipeline parallelism is not implemented: ZeRO sharding replaces it",
    "world_size": "the world size comes from the launcher (torchrun/srun)",
    "is_pipe_parallel": _SET,
    "expert_interval": _MOE,
    "num_experts": _MOE + " (DeepSpeed MoE's expert count in GPT-NeoX's older MoE files)",
    # model
    "scalenorm_epsilon": "ScaleNorm is not implemented (norm: layernorm or rmsnorm)",
    "rpe_num_buckets": "relative position embeddings (pos_emb: rpe) are not implemented",
    "rpe_max_distance": "relative position embeddings (pos_emb: rpe) are not implemented",
    "opt_pos_emb_offset": "learned position embeddings (OPT) are not implemented",
    "fp16_lm_cross_entropy": "the loss is computed in fp32",
    "gmlp_attn_dim": "gMLP blocks are not implemented",
    "use_qk_layernorm": "query/key LayerNorm is not implemented",
    "expansion_factor": "the MLP width is 4 x hidden_size, or intermediate_size / mlp_multiple_of for the gated MLP",
    "use_flashattn_swiglu": "the fused flash-attention SwiGLU kernel is not used (SwiGLU is a plain torch module)",
    "precompute_model_name": _POST,
    "dim_att": _RWKV, "head_size": _RWKV, "ffn_dim": _RWKV,
    "mamba_selective_scan_fusion": _MAMBA, "mamba_causal_conv_fusion": _MAMBA, "mamba_inner_func_fusion": _MAMBA,
    "mamba_use_bias_in_conv": _MAMBA, "mamba_use_bias_in_linears": _MAMBA,
    "te_columnparallel": _TE, "te_rowparallel": _TE, "te_layernorm_mlp": _TE, "te_mha": _TE, "te_fp8_format": _TE,
    "te_fp8_wgrad": _TE, "te_fp8_amax_history_len": _TE, "te_fp8_amax_compute_algo": _TE, "te_fp8_margin": _TE,
    "te_fp8_mha": _TE,
    "moe_type": _MOE, "moe_top_k": _MOE, "moe_router_type": _MOE, "moe_jitter_eps": _MOE, "moe_lbl_in_fp32": _MOE,
    "moe_aux_loss_coeff": _MOE, "moe_z_loss_coeff": _MOE, "moe_expert_model_parallel_size": _MOE,
    "moe_token_dropping": _MOE, "moe_train_capacity_factor": _MOE, "moe_eval_capacity_factor": _MOE,
    "moe_min_capacity": _MOE, "moe_use_residual": _MOE, "moe_expert_parallel_size": _MOE,
    "enable_expert_tensor_parallelism": _MOE, "moe_glu": _MOE, "moe_num_experts_per_tok": _MOE,
    # optimizer: GPT-NeoX derives these from the DeepSpeed blocks
    "optimizer_type": "GPT-NeoX derives it from the optimizer block: set optimizer.type",
    "use_bnb_optimizer": "bitsandbytes optimizers are not used (Adam(W) in fp32 master weights)",
    "zero_stage": "GPT-NeoX derives it from the zero_optimization block: set zero_optimization.stage",
    "zero_reduce_scatter": "GPT-NeoX derives it from zero_optimization.reduce_scatter",
    "zero_contiguous_gradients": "GPT-NeoX derives it from zero_optimization.contiguous_gradients",
    "zero_reduce_bucket_size": "GPT-NeoX derives it from zero_optimization.reduce_bucket_size",
    "zero_allgather_bucket_size": "GPT-NeoX derives it from zero_optimization.allgather_bucket_size",
    "lr": "GPT-NeoX derives it from the optimizer block: set optimizer.params.lr",
    "communication_data_type": "gradient reduces run in the compute dtype, or int8/int4 per plan "
                               "(zero_topo.grad_bits)",
    # logging
    "wandb_init_all_ranks": "Weights & Biases logging is not implemented",
    "git_hash": _SET,
    "log_grad_pct_zeros": "gradient sparsity logging is not implemented",
    "gradient_noise_scale_n_batches": "gradient noise scale logging is not implemented",
    "gradient_noise_scale_cpu_offload": "gradient noise scale logging is not implemented",
    "use_comet": _COMET, "comet_workspace": _COMET, "comet_project": _COMET, "comet_experiment_name": _COMET,
    "comet_tags": _COMET, "comet_others": _COMET,
    "memory_profiling": _PROFILE, "memory_profiling_path": _PROFILE, "profile": _PROFILE,
    "profile_step_start": _PROFILE, "profile_step_stop": _PROFILE, "profile_backward": _PROFILE,
    # other
    "local_rank": "the rank comes from the launcher (torchrun/srun)",
    "rank": "the rank comes from the launcher (torchrun/srun)",
    "lazy_mpu_init": "an external DDP manager is not supported",
    "short_seq_prob": "short-sequence sampling (BERT data) is not implemented",
    "adlr_autoresume": "ADLR auto-resume is not implemented; use auto_resume: true",
    "adlr_autoresume_interval": "ADLR auto-resume is not implemented; use auto_resume: true",
    "onnx_safe": "ONNX export is not implemented (tools/convert_to_hf.py exports HF folders)",
    "deepscale": "deprecated in GPT-NeoX and DeepSpeed",
    "deepscale_config": "deprecated in GPT-NeoX and DeepSpeed",
    "user_script": _SET, "iteration": _SET, "do_train": _SET, "do_valid": _SET, "do_test": _SET,
    "save_iters": "GPT-NeoX derives it from checkpoint_factor and extra_save_iters: set those",
    "global_num_gpus": _SET, "config_files": _SET,
    "padded_vocab_size": "derived from the tokenizer: set vocab_size (or nothing: it is derived like GPT-NeoX's)",
    # data
    "valid_data_weights": "validation sets are not blended: each is evaluated",
    "test_data_weights": "test sets are not blended: each is evaluated",
    "weighted_sampler_alpha": "blend weights come from train_data_weights",
    "train_label_data_paths": _POST, "valid_label_data_paths": _POST, "test_label_data_paths": _POST,
    "pos_train_data_paths": _POST, "neg_train_data_paths": _POST, "pos_valid_data_paths": _POST,
    "neg_valid_data_paths": _POST, "pos_test_data_paths": _POST, "neg_test_data_paths": _POST,
    "train_reward_data_paths": _POST, "valid_reward_data_paths": _POST, "test_reward_data_paths": _POST,
    "train_impl": _POST, "dpo_fp32": _POST, "dpo_beta": _POST, "dpo_reference_free": _POST, "kto_fp32": _POST,
    "kto_desirable_weight": _POST, "kto_undesirable_weight": _POST, "kto_beta": _POST, "z_loss": _POST,
    "allow_chopped": "samples always have seq_length + 1 tokens from the concatenated documents",
    "pack_impl": "documents are always packed (concatenated) into samples",
    "dataset_impl": "documents are always packed (concatenated) into samples (gpt2 dataset)",
    "enforce_sample_length": "samples always have seq_length + 1 tokens",
    "sequential": "the sample order is a seeded shuffle (GPT-NeoX's default)",
    "s3_chunk_size": "S3 upload of checkpoints is not implemented; copy the save folder",
    # training
    "batch_size": "GPT-NeoX derives it from train_micro_batch_size_per_gpu: set that",
    "exit_interval": "stop a run with SIGTERM/SIGUSR1 (it saves and exits) or set train_iters",
    "deepspeed_activation_checkpointing": "use checkpoint_activations: true (DeepSpeed's checkpointing is not used)",
    "checkpoint_in_cpu": "activation checkpoints stay on the device",
    "gas": "GPT-NeoX overwrites it with gradient_accumulation_steps: set that",
    "clip_grad": "GPT-NeoX derives it from gradient_clipping: set that",
    "hysteresis": "set fp16.hysteresis (the fp16 block)",
    "dynamic_loss_scale": "GPT-NeoX derives it from fp16.loss_scale (0: dynamic)",
    "loss_scale": "set fp16.loss_scale (the fp16 block)",
    "loss_scale_window": "set fp16.loss_scale_window (the fp16 block)",
    "min_scale": "set fp16.min_loss_scale (the fp16 block)",
    "char_level_ppl": "character-level perplexity is not computed",
    "coord_check": _MUP, "save_base_shapes": _MUP, "base_shapes_file": _MUP, "mup_init_scale": _MUP,
    "mup_attn_temp": _MUP, "mup_output_temp": _MUP, "mup_embedding_mult": _MUP, "mup_rp_embedding_mult": _MUP,
    "mup_width_scale": _MUP,
    "lora": "LoRA fine-tuning is not implemented (fine-tuning trains every weight)",
    # text generation / evaluation (GPT-NeoX's training ignores them too)
    "text_gen_type": _GEN, "temperature": _GEN, "top_p": _GEN, "top_k": _GEN, "return_logits": _GEN,
    "maximum_tokens": _GEN, "prompt_end": _GEN, "sample_input_file": _GEN, "sample_output_file": _GEN,
    "num_samples": _GEN, "recompute": _GEN, "eval_results_prefix": _GEN, "eval_tasks": _GEN,
    # DeepSpeed config blocks
    "curriculum_seqlen": "curriculum learning is not implemented",
    "flops_profiler": _DS_BLOCK + "; TFLOPs per GPU are in metrics.jsonl (tflops_per_gpu)",
    "autotuning": "DeepSpeed's autotuner is not used; zero_topo.preset: auto picks the plan",
    "sparse_attention": "sparse attention is not implemented (dense causal attention only)",
    "data_efficiency": "DeepSpeed's data-efficiency library is not used",
    "tensorboard": "DeepSpeed's monitor block is not read: TensorBoard logs go to tensorboard_dir",
    "wandb": "DeepSpeed's monitor block is not read; Weights & Biases logging is not implemented",
    "csv_monitor": "DeepSpeed's monitor block is not read: metrics go to metrics.jsonl",
    "elasticity": "DeepSpeed elasticity is not used; checkpoints load under any world size",
    "compression_training": "DeepSpeed's compression library is not used",
    "checkpoint": "DeepSpeed's checkpoint block is not read (checkpoints load under any plan and world size)",
    "pipeline": "pipeline parallelism is not implemented: ZeRO sharding replaces it",
    # DeepSpeed runner
    "include": _RUNNER, "exclude": _RUNNER, "num_nodes": _RUNNER, "num_gpus": _RUNNER, "master_addr": _RUNNER,
    "force_multi": _RUNNER, "detect_nvlink_pairs": _RUNNER, "autotuning_run": _RUNNER, "no_ssh_check": _RUNNER,
}
