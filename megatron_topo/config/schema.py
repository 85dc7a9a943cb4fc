"""The config dataclasses: one section per job (model, train, data, logging, checkpoint, topology,
zero_topo, distributed, system), each field declared once with its checks (``option``), and the
``Config`` that holds them; GPT-NeoX's flat keys are routed to the section that owns them.

The sections are declared in ``schema_model`` (model), ``schema_train`` (train and its optimizer
and precision blocks), ``schema_io`` (data, logging, checkpoint) and ``schema_parallel`` (topology,
zero_topo, system, distributed); this module holds ``Config`` and re-exports them."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Optional

import yaml

from ..zero_topo.plan_space import PRESETS
from .deepspeed import ZeroOptimizationBlock
from .neox import NeoxCompatConfig
from .options import _strip_optional
from .precision import resolve_precision
from .schema_generate import GenerationConfig
from .schema_io import CheckpointConfig, DataConfig, LoggingConfig
from .schema_model import INIT_METHODS, MAX_VOCAB, ModelConfig
from .schema_parallel import AUTO_TRIAL_KEYS, DistributedConfig, SystemConfig, TopologyConfig, ZeroTopoConfig
from .schema_train import PRECISIONS, Bf16Block, Fp16Block, OptimizerBlock, OptimizerParams, TrainConfig

# the sections and their constants are re-exported: callers import them from here
__all__ = [
    "AUTO_TRIAL_KEYS",
    "INIT_METHODS",
    "MAX_VOCAB",
    "PRECISIONS",
    "PRESETS",
    "Bf16Block",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DistributedConfig",
    "Fp16Block",
    "GenerationConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerBlock",
    "OptimizerParams",
    "SystemConfig",
    "TopologyConfig",
    "TrainConfig",
    "ZeroTopoConfig",
    "flat_dict",
    "resolve_precision",
]


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
    generation: GenerationConfig = field(default_factory=GenerationConfig)  # tools/generate.py CONFIG.yml

    def __post_init__(self):
        # ``key=value`` of accepted settings that change nothing here (load_config fills it)
        self.no_effect: list[str] = []
        # which file (or --set) gave each key that was given (load_config fills it)
        self.origin: dict = {}
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
_FLAT_SECTIONS = ("model", "train", "data", "logging", "checkpoint", "neox", "generation")
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
