"""Typed configuration: GPT-NeoX style YAML files merged in order into dataclasses.

Top-level keys use GPT-NeoX names (``num_layers``, ``train_micro_batch_size_per_gpu``, ...) and are
routed to the section that owns them; ``optimizer``, ``fp16``, ``bf16``, ``topology``, ``zero_topo``
and ``zero_optimization`` are nested blocks. ``-`` and ``_`` are equivalent in every key.

Errors are one line (``ConfigError``): unknown keys name the file and the closest valid key, a
key set in two files names both, a wrong type names the expected type.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml


class ConfigError(ValueError):
    """A bad configuration value; the message is one line meant for the user."""


# ----------------------------------------------------------------------------------- sections
@dataclass
class ModelConfig:
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    max_position_embeddings: Optional[int] = None  # defaults to seq_length
    vocab_size: int = 512  # GPT-NeoX's padded vocabulary size
    rotary_pct: float = 0.25
    rotary_emb_base: int = 10000
    gpt_j_residual: bool = True  # parallel attention + MLP residual (GPT-NeoX-20B)
    no_weight_tying: bool = True
    norm: str = "layernorm"
    layernorm_epsilon: float = 1e-5
    init_method: str = "small_init"
    output_layer_init_method: str = "wang_init"
    checkpoint_activations: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0

    def __post_init__(self):
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length


@dataclass
class OptimizerParams:
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8


@dataclass
class OptimizerBlock:
    type: str = "AdamW"
    params: OptimizerParams = field(default_factory=OptimizerParams)


@dataclass
class Fp16Block:
    enabled: bool = False
    loss_scale: float = 0.0  # 0 = dynamic
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0


@dataclass
class Bf16Block:
    enabled: bool = False


@dataclass
class TrainConfig:
    train_micro_batch_size_per_gpu: int = 4
    gradient_accumulation_steps: int = 1
    train_iters: int = 100
    seed: int = 1234
    optimizer: OptimizerBlock = field(default_factory=OptimizerBlock)
    weight_decay: float = 0.01
    gradient_clipping: float = 1.0
    lr_decay_style: str = "cosine"
    lr_decay_iters: Optional[int] = None  # defaults to train_iters
    warmup: float = 0.01  # fraction of lr_decay_iters (GPT-NeoX convention)
    min_lr: float = 0.0
    precision: Optional[str] = None  # fp32 | bf16 | fp16; fp16/bf16 blocks may set it instead
    fp16: Fp16Block = field(default_factory=Fp16Block)
    bf16: Bf16Block = field(default_factory=Bf16Block)
    max_bad_steps: int = 5  # bf16/fp32: abort after this many consecutive non-finite steps


@dataclass
class DataConfig:
    data_path: Optional[str] = "builtin"
    train_data_paths: Optional[list[str]] = None
    valid_data_paths: Optional[list[str]] = None
    test_data_paths: Optional[list[str]] = None
    train_data_weights: Optional[list[float]] = None
    split: str = "949,50,1"
    tokenizer_type: str = "ByteLevel"
    vocab_file: Optional[str] = None
    data_cache_dir: Optional[str] = None
    num_workers: int = 0
    builtin_corpus_bytes: int = 4_000_000  # cap on stdlib source read for data_path: builtin


@dataclass
class LoggingConfig:
    log_interval: int = 10
    log_dir: str = "runs/default"
    tensorboard_dir: Optional[str] = None  # defaults to {log_dir}/tensorboard
    eval_interval: int = 100
    eval_iters: int = 10
    progress_bar: bool = True


@dataclass
class CheckpointConfig:
    save: Optional[str] = None
    load: Optional[str] = None
    checkpoint_factor: int = 0  # save every N steps (0: only at the end when `save` is set)
    keep_last: int = 2


@dataclass
class TopologyConfig:
    gcds_per_gpu: int = 1
    gpus_per_node: Optional[int] = None  # default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE / world


@dataclass
class ZeroTopoConfig:
    preset: str = "ddp"
    weight_factor: Optional[int] = None
    grad_factor: Optional[int] = None
    optimizer_factor: Optional[int] = None
    secondary_degree: Optional[int] = None
    weight_bits: Optional[int] = None
    secondary_bits: Optional[int] = None
    grad_bits: Optional[int] = None
    quant_block_size: int = 2048
    grad_quant_block_size: int = 512
    inter_node_reduce: str = "allreduce"
    prefetch: bool = True
    bucket_size: int = 0  # reserved: units are the buckets; >0 coalesces small units
    kernels: str = "auto"  # auto | triton | reference
    # bitwise-reproducible cross-replica sums (all-gather + sum in rank order, W x the traffic):
    # any world size then equals one process with the same global batch, bit for bit
    deterministic: bool = False


@dataclass
class ZeroOptimizationBlock:
    """DeepSpeed's ``zero_optimization`` keys, mapped onto presets (see zero_topo.plan)."""

    stage: int = 0
    zero_hpz_partition_size: int = 1
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    mics_shard_size: int = -1
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 0
    allgather_bucket_size: int = 0


@dataclass
class SystemConfig:
    """Machine description used by the planner and the performance model (not by training)."""

    name: str = "local_cpu"
    device_memory_gib: float = 64.0
    peak_tflops: float = 191.5  # per device, advertised dense fp16/bf16
    gemm_tflops: float = 125.0  # per device, measured large GEMM
    bw_intra_gpu_gbs: float = 200.0  # GB/s per direction between the GCDs of one package
    bw_intra_node_gbs: float = 50.0  # GB/s per direction between packages of one node
    bw_inter_node_gbs: float = 25.0  # GB/s per direction per NIC
    nics_per_node: int = 4
    latency_intra_gpu_us: float = 2.0
    latency_intra_node_us: float = 5.0
    latency_inter_node_us: float = 10.0
    latency_small_message_us: float = 5.0  # per ring step of a tiny collective (quantization scales)
    # added for the performance model (megatron_topo/perf_model.py)
    compute_efficiency: float = 0.40  # achieved fraction of peak_tflops in GEMM-heavy training
    hbm_bw_gbs: float = 1600.0  # device memory bandwidth, for memory-bound steps (optimizer)


@dataclass
class DistributedConfig:
    backend: str = "auto"  # auto: nccl on GPUs, gloo on CPU
    collective_timeout_s: float = 600.0
    device: str = "auto"  # auto | cpu | cuda


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


def _coerce(value, tp, where: str):
    """Check ``value`` against the annotation ``tp``; return it converted (ints to floats etc.)."""
    optional = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    base = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: null is not allowed; expected {_type_name(base)}")
    origin = typing.get_origin(base)
    bad = ConfigError(f"{where}: expected {_type_name(base)}, got {type(value).__name__} {value!r}")
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
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad
    if base is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 6e-4 as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if base is str:
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


def load_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path) as f:
            return yaml.load(f, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{at}: invalid YAML: {problem}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe loader that rejects a key repeated inside one file (including `a_b` vs `a-b`)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            k = _norm(key)
            if k in seen:
                raise ConfigError(
                    f"{self.name}: line {key_node.start_mark.line + 1}: key '{key}' is repeated "
                    f"(first set on line {seen[k] + 1})"
                )
            seen[k] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def parse_set(expr: str) -> dict:
    """``a.b.c=value`` -> {'a': {'b': {'c': value}}} with the value parsed as YAML."""
    if "=" not in expr:
        raise ConfigError(f"--set {expr!r}: expected dotted.key=value")
    key, raw = expr.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
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
    validate(cfg)
    return cfg


def _paths(d: dict, prefix: str = ""):
    for k, v in d.items():
        p = f"{prefix}{_norm(k)}"
        if isinstance(v, dict):
            yield from _paths(v, p + ".")
        else:
            yield p


def validate(cfg: Config) -> None:
    m, t = cfg.model, cfg.train
    resolve_precision(t)
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}"
        )
    if m.seq_length > m.max_position_embeddings:
        raise ConfigError(
            f"seq_length {m.seq_length} exceeds max_position_embeddings {m.max_position_embeddings}"
        )
    if not 0.0 <= m.rotary_pct <= 1.0:
        raise ConfigError(f"rotary_pct {m.rotary_pct} must lie in [0, 1]")
    if m.norm != "layernorm":
        raise ConfigError(f"norm '{m.norm}' is not supported; valid: layernorm")
    for name, val, valid in (
        ("init_method", m.init_method, INIT_METHODS),
        ("output_layer_init_method", m.output_layer_init_method, INIT_METHODS),
        ("lr_decay_style", t.lr_decay_style, ("cosine", "linear", "constant")),
        ("optimizer.type", t.optimizer.type.lower(), ("adamw", "adam")),
    ):
        if val not in valid:
            raise ConfigError(f"{name} '{val}' is not valid; use one of {', '.join(valid)}")
    for name in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_iters"):
        if getattr(t, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(t, name)}")
    if len(t.optimizer.params.betas) != 2:
        raise ConfigError(f"optimizer.params.betas must have 2 values, got {t.optimizer.params.betas}")
    if cfg.logging.log_interval < 1:
        raise ConfigError(f"log_interval must be >= 1, got {cfg.logging.log_interval}")


INIT_METHODS = ("small_init", "wang_init", "normal")


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
