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


def option(default=dataclasses.MISSING, doc: str = "", *, factory=None, ge=None, gt=None, le=None, lt=None,
           choices=None, ignore_case: bool = False, allow_inf: bool = False, length=None, why: str = "",
           check=None):
    """A config field with its checks: bounds (``ge``/``gt``/``le``/``lt``; on each item of a
    list), ``choices`` (a tuple, or a callable returning one), ``length`` of a list, non-finite
    floats refused unless ``allow_inf``; ``why`` is appended to a choices error; ``check(value)``
    returns an error text or None for rules a bound cannot say."""
    meta = dict(doc=doc, ge=ge, gt=gt, le=le, lt=lt, choices=choices, ignore_case=ignore_case,
                allow_inf=allow_inf, length=length, why=why, check=check)
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


def _tokenizer_names() -> tuple:
    from .data.tokenizer import TOKENIZERS

    return tuple(TOKENIZERS)


# ----------------------------------------------------------------------------------- sections
INIT_METHODS = ("small_init", "wang_init", "normal")
MAX_VOCAB = 2**31 - 1  # token ids are int32 in datasets with >= 65500 ids (GPT-NeoX)


@dataclass
class ModelConfig:
    num_layers: int = option(2, "transformer layers", ge=1)
    hidden_size: int = option(64, "model width", ge=1)
    num_attention_heads: int = option(4, "attention heads (must divide hidden_size)", ge=1)
    seq_length: int = option(64, "tokens per training sample", ge=1)
    max_position_embeddings: Optional[int] = option(None, "position limit (default: seq_length)", ge=1)
    vocab_size: int = option(512, "GPT-NeoX's padded vocabulary size", ge=1, le=MAX_VOCAB)
    rotary_pct: float = option(0.25, "fraction of each head's dims that get rotary embeddings", ge=0.0, le=1.0)
    rotary_emb_base: int = option(10000, "rotary frequency base", ge=1)
    gpt_j_residual: bool = option(True, "parallel attention + MLP residual (GPT-NeoX-20B)")
    no_weight_tying: bool = option(True, "untied input/output embeddings (false: the output layer uses the "
                                   "embedding's weight, sharded once by the embedding unit)")
    norm: str = option("layernorm", "normalisation layer", choices=("layernorm",))
    layernorm_epsilon: float = option(1e-5, "LayerNorm epsilon", gt=0.0)
    init_method: str = option("small_init", "weight init of the input-side layers", choices=INIT_METHODS)
    output_layer_init_method: str = option("wang_init", "weight init of the output-side layers",
                                           choices=INIT_METHODS)
    checkpoint_activations: bool = option(False, "recompute each layer's activations in the backward pass")
    attention_dropout: float = option(0.0, "dropout on attention probabilities", ge=0.0, lt=1.0)
    hidden_dropout: float = option(0.0, "dropout on residual branches", ge=0.0, lt=1.0)

    def __post_init__(self):
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length


@dataclass
class OptimizerParams:
    lr: float = option(6e-4, "peak learning rate", ge=0.0)
    betas: list[float] = option(doc="Adam (beta1, beta2)", factory=lambda: [0.9, 0.95], ge=0.0, lt=1.0, length=2)
    eps: float = option(1e-8, "Adam epsilon", gt=0.0)


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


@dataclass
class Bf16Block:
    enabled: bool = option(False, "bf16 mixed precision")


PRECISIONS = ("fp32", "bf16", "fp16", "float32", "bfloat16", "float16", "half")


@dataclass
class TrainConfig:
    train_micro_batch_size_per_gpu: int = option(4, "samples per rank per micro-batch", ge=1)
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step", ge=1)
    train_iters: int = option(100, "optimizer steps to train", ge=1)
    seed: int = option(1234, "seed of initialisation and data order", ge=0, le=2**32 - 1)
    optimizer: OptimizerBlock = field(default_factory=OptimizerBlock)
    weight_decay: float = option(0.01, "decoupled weight decay", ge=0.0)
    gradient_clipping: float = option(1.0, "clip the global gradient norm to this (0: off)", ge=0.0)
    lr_decay_style: str = option("cosine", "learning-rate decay after warmup", choices=("cosine", "linear", "constant"))
    lr_decay_iters: Optional[int] = option(None, "steps of warmup + decay (default: train_iters)", ge=1)
    warmup: float = option(0.01, "warmup as a fraction of lr_decay_iters (GPT-NeoX convention)", ge=0.0, le=1.0)
    min_lr: float = option(0.0, "learning rate at the end of the decay", ge=0.0)
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
    split: str = option("949,50,1", "train,valid,test shares of data_path's documents", check=_check_split)
    tokenizer_type: str = option("ByteLevel", "tokenizer (GPT-NeoX names)", choices=_tokenizer_names,
                                 ignore_case=True)
    vocab_file: Optional[str] = option(None, "tokenizer file (HFTokenizer, SPMTokenizer, GPT2BPETokenizer)")
    data_cache_dir: Optional[str] = option(None, "index caches and the built-in corpus (default: data_cache)")
    num_workers: int = option(0, "data loader processes", choices=(0,),
                              why="batches are read in the training process from memory-mapped files; "
                              "worker processes are not implemented")
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
    save: Optional[str] = option(None, "checkpoint directory to save into")
    load: Optional[str] = option(None, "checkpoint (save directory or global_stepN) to resume from")
    checkpoint_factor: int = option(0, "save every N steps (0: only at the end when `save` is set)", ge=0)
    keep_last: int = option(2, "newest checkpoints kept (0: all)", ge=0)
    auto_resume: bool = option(False, "no `load`: resume from `save` when it holds a checkpoint, else start fresh")
    save_interval_minutes: float = option(0.0, "also save every N minutes of training (rank 0's clock; 0: off)",
                                          ge=0.0)


@dataclass
class TopologyConfig:
    gcds_per_gpu: int = option(1, "ranks per GPU package (2 on MI250X)", ge=1)
    gpus_per_node: Optional[int] = option(None, "default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE / world", ge=1)


PRESETS = ("ddp", "zero1", "zero2", "zero3", "zeropp", "mics", "topo", "paro_iig", "paro_nig")


@dataclass
class ZeroTopoConfig:
    preset: str = option("ddp", "sharding preset (DESIGN §4)", choices=PRESETS)
    weight_factor: Optional[int] = option(None, "ranks the 16-bit weights are split over", ge=1)
    grad_factor: Optional[int] = option(None, "ranks the gradients are split over", ge=1)
    optimizer_factor: Optional[int] = option(None, "ranks the fp32 master + Adam moments are split over", ge=1)
    secondary_degree: Optional[int] = option(None, "ranks of the secondary (hpZ) weight copy (0: none)", ge=0)
    weight_bits: Optional[int] = option(None, "bits of the weight all-gather", choices=(16, 8))
    secondary_bits: Optional[int] = option(None, "bits of the secondary copy", choices=(16, 8))
    grad_bits: Optional[int] = option(None, "bits of the gradient reduce-scatter", choices=(16, 8, 4))
    quant_block_size: int = option(2048, "elements per weight quantization scale", check=_check_block)
    grad_quant_block_size: int = option(512, "elements per gradient quantization scale", check=_check_block)
    inter_node_reduce: str = option("allreduce", "cross-replica combine", choices=("allreduce", "reduce_scatter"))
    prefetch: bool = option(True, "gather the next unit's weights while computing this one")
    bucket_size: int = option(0, "reserved", choices=(0,),
                              why="units (one per layer) are the communication buckets; coalescing is not implemented")
    kernels: str = option("auto", "quantization kernels", choices=("auto", "triton", "reference"))
    # bitwise-reproducible cross-replica sums (all-gather + sum in rank order, W x the traffic):
    # any world size then equals one process with the same global batch, bit for bit
    deterministic: bool = option(False, "bitwise-reproducible cross-replica sums (W x the traffic)")


@dataclass
class ZeroOptimizationBlock:
    """DeepSpeed's ``zero_optimization`` keys, mapped onto presets (see zero_topo.plan)."""

    stage: int = option(0, "ZeRO stage", choices=(0, 1, 2, 3))
    zero_hpz_partition_size: int = option(1, "ZeRO++ hpZ secondary partition size", ge=1)
    zero_quantized_weights: bool = option(False, "ZeRO++ qwZ: 8-bit weight all-gather")
    zero_quantized_gradients: bool = option(False, "ZeRO++ qgZ: 4-bit gradient reduce-scatter")
    mics_shard_size: int = option(-1, "MiCS shard group size (-1: off)", ge=-1)
    overlap_comm: bool = option(True, "overlap communication with compute", choices=(True,),
                                why="the engine always overlaps; zero_topo.prefetch: false turns off weight prefetch")
    contiguous_gradients: bool = option(True, "contiguous gradient buffers", choices=(True,),
                                        why="each unit's gradients always live in one flat buffer")
    reduce_bucket_size: int = option(0, "DeepSpeed reduce bucket (elements)", choices=(0,),
                                     why="units (one per layer) are the communication buckets; the size is not settable")
    allgather_bucket_size: int = option(0, "DeepSpeed all-gather bucket (elements)", choices=(0,),
                                        why="units (one per layer) are the communication buckets; the size is not settable")


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
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    zero_topo: ZeroTopoConfig = field(default_factory=ZeroTopoConfig)
    zero_optimization: Optional[ZeroOptimizationBlock] = None
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    system: Optional[SystemConfig] = None

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
_FLAT_SECTIONS = ("model", "train", "data", "logging", "checkpoint")
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
    if t.fp16.enabled and t.bf16.enabled:
        raise ConfigError("fp16.enabled and bf16.enabled are both true; enable at most one")
    if t.fp16.enabled:
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


def _coerce(value, tp, where: str):
    """Check ``value`` against the annotation ``tp``; return it converted (ints to floats etc.)."""
    optional = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    base = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed; expected {_type_name(base)}")
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
def _merge_block(obj, data: dict, where: str, origin: dict, src: str):
    """Merge ``data`` into dataclass instance ``obj``; ``origin`` remembers which file set each key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for raw_key, value in data.items():
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
            _merge_block(child, value, path, origin, src)
            continue
        if path in origin:
            raise ConfigError(f"key '{path}' is set in both {origin[path]} and {src}; set it in one file")
        origin[path] = src
        setattr(obj, key, _coerce(value, tp, f"{src}: {path}"))


def merge_into(cfg: Config, data: dict, src: str, origin: dict) -> None:
    """Merge one YAML document (GPT-NeoX flat keys + nested blocks) into ``cfg``."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the top level must be a mapping of keys, got {type(data).__name__}")
    index = _key_index()
    for raw_key, value in data.items():
        key = _norm(raw_key)
        if key not in index:
            raise ConfigError(f"{src}: unknown key '{raw_key}'{_suggest(key, index)}")
        sec = index[key]
        if sec in _BLOCK_SECTIONS:
            block = getattr(cfg, sec)
            if block is None:
                block = _section_type(sec)()
                setattr(cfg, sec, block)
            _merge_block(block, value, sec, origin, src)
        else:
            _merge_block(getattr(cfg, sec), {key: value}, "", origin, src)


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
    return parse_yaml(_decode(path, raw), path) or {}


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
    """Merge YAML files in order, then ``--set`` overrides (which may replace earlier values)."""
    cfg = Config()
    origin: dict = {}
    for p in paths:
        merge_into(cfg, load_yaml(p), p, origin)
    for expr in overrides or []:
        data = parse_set(expr)
        # overrides win over files: forget who set the keys they touch
        for path in _paths(data):
            origin.pop(path, None)
            origin.pop(path.split(".", 1)[-1], None)
        merge_into(cfg, data, f"--set {expr}", origin)
    if "max_position_embeddings" not in origin:  # its default follows seq_length wherever that was set
        cfg.model.max_position_embeddings = cfg.model.seq_length
    validate(cfg)
    return cfg


def _paths(d: dict, prefix: str = ""):
    """Every dotted path in ``d``, prefixes included (a dict given to a scalar key names the key)."""
    for k, v in d.items():
        p = f"{prefix}{_norm(k)}"
        yield p
        if isinstance(v, dict):
            yield from _paths(v, p + ".")


def validate(cfg: Config) -> None:
    """Every declared field's bounds and choices (from its ``option`` metadata), then the rules
    that tie fields together."""
    for path, value, meta in _declared(cfg):
        _check_declared(path, value, meta)
    _cross_checks(cfg)


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


def _cross_checks(cfg: Config) -> None:
    """Rules between fields (a single field's rules live in its declaration)."""
    m, t, d = cfg.model, cfg.train, cfg.data
    resolve_precision(t)
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}"
        )
    if m.max_position_embeddings is not None and m.seq_length > m.max_position_embeddings:
        raise ConfigError(
            f"seq_length {m.seq_length} exceeds max_position_embeddings {m.max_position_embeddings}"
        )
    if not d.train_data_paths:
        for name in ("train_data_weights", "valid_data_paths", "test_data_paths"):
            if getattr(d, name):
                raise ConfigError(f"{name} is set but train_data_paths is not (with data_path, split cuts the "
                                  f"data); set train_data_paths too or drop {name}")
        if d.data_path is not None and float(str(d.split).replace("/", ",").split(",")[0] or 0) <= 0:
            raise ConfigError(f"split '{d.split}' gives the train split no share of {d.data_path}; "
                              f"the first number must be > 0, e.g. 949,50,1")
    elif d.train_data_weights is not None and len(d.train_data_weights) != len(d.train_data_paths):
        raise ConfigError(f"train_data_weights has {len(d.train_data_weights)} values for "
                          f"{len(d.train_data_paths)} train_data_paths; give one weight per path")
    if cfg.zero_optimization is not None and cfg.zero_topo.preset != "ddp":
        raise ConfigError(f"zero_optimization and zero_topo.preset={cfg.zero_topo.preset} both choose the "
                          f"sharding; keep one of them")


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
    print(describe_keys())
