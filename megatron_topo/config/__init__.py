"""Typed configuration: GPT-NeoX style YAML files merged in order into dataclasses.

Top-level keys use GPT-NeoX names (``num_layers``, ``train_micro_batch_size_per_gpu``, ...) and are
routed to the section that owns them; ``optimizer``, ``fp16``, ``bf16``, ``topology``, ``zero_topo``
and ``zero_optimization`` are nested blocks. ``-`` and ``_`` are equivalent in every key.

Every field is declared once, with its checks beside it (``option``, options.py): the bounds, the
valid choices and a one-line doc live in the dataclass field's metadata; :func:`validate` checks
every field from that metadata and :func:`describe_keys` (``python train.py --list-keys``) lists
them. Only rules that tie several fields together are written by hand (checks.py).

Modules: options (field declaration and checks, errors), schema (the sections and ``Config``),
neox / deepspeed (GPT-NeoX and DeepSpeed keys and their mapping), yaml_io (reading files and
``--set``), loader (merging, aliases, ``load_config``), checks (validation), output (effective
config, key listing, NeoX table).

Errors are one line (``ConfigError``): unknown keys name the file and the closest valid key, a
key set in two files names both, a wrong type names the expected type, a value out of range or
not among the choices names what is valid.
"""

from .checks import check_batch_size, validate
from .deepspeed import SCHEDULERS, OffloadBlock, SchedulerBlock, SchedulerParams, ZeroOptimizationBlock
from .loader import load_config, merge_into, no_effect_settings, padded_vocab_size, resolve_vocab_size
from .neox import NEOX_DEFAULT_DIFFERS, NEOX_IMPLEMENTED, REJECTED_KEYS, NeoxCompatConfig
from .options import ConfigError, ConfigErrors, attention_config_layers, option, raise_problems
from .output import (
    check_log_dir,
    check_run_outputs,
    describe_keys,
    neox_table,
    neox_table_markdown,
    note_lines,
    write_effective_config,
)
from .schema import (
    INIT_METHODS,
    MAX_VOCAB,
    PRECISIONS,
    PRESETS,
    Bf16Block,
    CheckpointConfig,
    Config,
    DataConfig,
    DistributedConfig,
    Fp16Block,
    LoggingConfig,
    ModelConfig,
    OptimizerBlock,
    OptimizerParams,
    SystemConfig,
    TopologyConfig,
    TrainConfig,
    ZeroTopoConfig,
    flat_dict,
    resolve_precision,
)
from .yaml_io import MAX_YAML_VALUES, load_yaml, parse_set, parse_yaml

__all__ = [
    "Bf16Block",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "ConfigErrors",
    "DataConfig",
    "DistributedConfig",
    "Fp16Block",
    "INIT_METHODS",
    "LoggingConfig",
    "MAX_VOCAB",
    "MAX_YAML_VALUES",
    "ModelConfig",
    "NEOX_DEFAULT_DIFFERS",
    "NEOX_IMPLEMENTED",
    "NeoxCompatConfig",
    "OffloadBlock",
    "OptimizerBlock",
    "OptimizerParams",
    "PRECISIONS",
    "PRESETS",
    "REJECTED_KEYS",
    "SCHEDULERS",
    "SchedulerBlock",
    "SchedulerParams",
    "SystemConfig",
    "TopologyConfig",
    "TrainConfig",
    "ZeroOptimizationBlock",
    "ZeroTopoConfig",
    "attention_config_layers",
    "check_batch_size",
    "describe_keys",
    "flat_dict",
    "load_config",
    "load_yaml",
    "merge_into",
    "neox_table",
    "neox_table_markdown",
    "no_effect_settings",
    "note_lines",
    "option",
    "padded_vocab_size",
    "parse_set",
    "parse_yaml",
    "raise_problems",
    "resolve_precision",
    "resolve_vocab_size",
    "validate",
    "write_effective_config",
    "check_log_dir",
    "check_run_outputs",
]
