"""The ``data``, ``logging`` and ``checkpoint`` sections of the config: what a run reads and what it
writes, each field declared once with its checks (``option``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .options import _check_split, _tokenizer_names, option


@dataclass
class DataConfig:
    data_path: Optional[str] = option("builtin", "dataset PREFIX (PREFIX.bin/.idx) cut by split, or 'builtin'")
    train_data_paths: Optional[list[str]] = option(None, "train dataset prefixes (blended; overrides data_path)")
    valid_data_paths: Optional[list[str]] = option(None, "validation dataset prefixes")
    test_data_paths: Optional[list[str]] = option(None, "test dataset prefixes")
    train_data_weights: Optional[list[float]] = option(None, "blend weight per train path", gt=0.0, le=1e12)
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


_PROFILE = (
    "torch.profiler trace per rank (CPU, + CUDA on a GPU) of the window's steps: "
    "{tensorboard_dir}/profile/rank{R}_steps{a}-{b}.pt.trace.json; on a GPU also NVTX ranges for nsys"
)
_WINDOW = "steps done before the window (GPT-NeoX's iteration): steps start+1..stop of metrics.jsonl"
_BACKWARD = "with profile, on a GPU: an NVTX range per backward op (autograd node) of the window"
_MEMORY = "CUDA memory history of the window, dumped per rank as a snapshot pickle (refused on CPU)"
_MEMORY_PATH = "folder of the memory snapshots (default: {tensorboard_dir}/profile)"


@dataclass
class LoggingConfig:
    log_interval: int = option(10, "steps per metrics record", ge=1)
    log_dir: str = option("runs/default", "metrics.jsonl, config.yml and tensorboard/ go here")
    tensorboard_dir: Optional[str] = option(None, "default: {log_dir}/tensorboard")
    eval_interval: int = option(100, "steps between evaluations (0: never; the one way to turn evaluation off)", ge=0)
    eval_iters: int = option(10, "micro-batches per evaluation (>= 1 while eval_interval > 0)", ge=0, le=1 << 14)
    progress_bar: bool = option(True, "tqdm progress bar on rank 0")
    # profiling (GPT-NeoX's keys; megatron_topo/training/profiling.py, docs/profiling.md)
    profile: bool = option(False, _PROFILE, neox="implemented")
    profile_step_start: Optional[int] = option(None, _WINDOW + " (default 10)", ge=0, neox="implemented")
    profile_step_stop: Optional[int] = option(
        None, "end of the window, exclusive (default 12)", ge=1, neox="implemented"
    )
    profile_backward: bool = option(False, _BACKWARD, neox="implemented")
    memory_profiling: bool = option(False, _MEMORY, neox="implemented")
    memory_profiling_path: Optional[str] = option(None, _MEMORY_PATH, neox="implemented")


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
    save_interval_minutes: float = option(
        0.0, "also save every N minutes of training (rank 0's clock; 0: off)", ge=0.0, le=525600.0
    )
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
