"""Which config keys tools/fsdp_baseline.py implements, and the one line that refuses the others.

fsdp_baseline loads train.py's config (the same files compose), but it trains only: no checkpoint is
read or written, nothing is evaluated, profiled or traced, and its sharding is ``--mode`` (FSDP2),
not the ``zero_topo`` plan. A key it does not implement, set to a value that would act in train.py,
is refused before any rank joins a process group (a comparison run that silently starts from
scratch, or saves nothing, is a wrong answer). Every field of the schema is in exactly one of
:data:`IMPLEMENTED` (used by fsdp_baseline as train.py uses it, or, for ``neox.*``, accepted by the
loader only with the values the trainer does anyway) and :data:`INERT` (refused unless its value
changes nothing); tests/test_hostile_inputs_r9_fsdp.py enumerates the schema against both."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..config.schema import _BLOCK_SECTIONS, _FLAT_SECTIONS, Config

# sections used whole: the model (build_model), the topology, GPT-NeoX's accepted no-op keys (the
# loader refuses their other values), and the generation block (read by tools/generate.py only;
# train.py names it in a note line, fsdp_baseline prints the same notes)
WHOLE_SECTIONS = ("model", "topology", "neox", "generation")

IMPLEMENTED = frozenset(
    {
        # train: batch, schedule, optimizer (torch AdamW: Adam and AdamW are the same decoupled decay here)
        "train.train_micro_batch_size_per_gpu",
        "train.gradient_accumulation_steps",
        "train.train_batch_size",
        "train.train_iters",
        "train.seed",
        "train.optimizer.type",
        "train.optimizer.params.lr",
        "train.optimizer.params.betas",
        "train.optimizer.params.eps",
        "train.optimizer.params.weight_decay",
        "train.weight_decay",
        "train.gradient_clipping",
        "train.lr_decay_style",
        "train.lr_decay_iters",
        "train.warmup",
        "train.min_lr",
        "train.warmup_iters",
        "train.decay_lr_to",
        "train.scheduler",
        "train.precision",
        "train.fp16.enabled",
        "train.bf16.enabled",
        # bf16's loss-scaling keys: accepted by train.py too, with no effect (bf16 needs no scaling)
        "train.bf16.loss_scale",
        "train.bf16.initial_scale_power",
        "train.bf16.loss_scale_window",
        "train.bf16.hysteresis",
        "train.bf16.min_loss_scale",
        # data: the training set (build_datasets), as train.py builds it
        "data.data_path",
        "data.train_data_paths",
        "data.train_data_weights",
        "data.split",
        "data.tokenizer_type",
        "data.vocab_file",
        "data.merge_file",
        "data.data_impl",
        "data.data_cache_dir",
        "data.num_workers",
        "data.builtin_corpus_bytes",
        # logging: metrics.jsonl
        "logging.log_dir",
        "logging.log_interval",
        "distributed.collective_timeout_s",
    }
)


def _given(cfg: Config, key: str) -> bool:
    """Whether a config file or --set gave ``key`` (as a file spells it)."""
    return key in (getattr(cfg, "origin", None) or {})


def _eval_reached(cfg: Config) -> bool:
    """Whether a step of the run reaches eval_interval (train.py evaluates there)."""
    return 0 < cfg.logging.eval_interval <= cfg.train.train_iters


def _eval_on(cfg: Config) -> bool:
    """Whether the config asks for an evaluation that a step reaches (train.py's default interval,
    not asked for, is not an evaluation the comparison run was meant to make)."""
    return _given(cfg, "eval_interval") and _eval_reached(cfg)


def _loading(cfg: Config) -> bool:
    return bool(cfg.checkpoint.load or cfg.checkpoint.finetune_from)


# key -> whether its value changes nothing in this run (True: accepted; False: refused). A key acts
# only when train.py would act on it; a modifier of save/load is inert while save/load is unset (the
# start-of-run notes name it, as train.py's do).
INERT: dict[str, Callable[[Config, object], bool]] = {
    "checkpoint.save": lambda c, v: v is None,
    "checkpoint.load": lambda c, v: v is None,
    "checkpoint.finetune_from": lambda c, v: v is None,
    "checkpoint.auto_resume": lambda c, v: not v,
    "checkpoint.checkpoint_factor": lambda c, v: not c.checkpoint.save,
    "checkpoint.keep_last": lambda c, v: not c.checkpoint.save,
    "checkpoint.keep_last_n_checkpoints": lambda c, v: not c.checkpoint.save,
    "checkpoint.extra_save_iters": lambda c, v: not c.checkpoint.save,
    "checkpoint.save_interval_minutes": lambda c, v: not c.checkpoint.save,
    "checkpoint.finetune": lambda c, v: not _loading(c),
    "checkpoint.no_load_optim": lambda c, v: not _loading(c),
    "checkpoint.load_unverified": lambda c, v: not _loading(c),
    "checkpoint.finetune_architecture_change": lambda c, v: not _loading(c),
    # evaluation: none (eval_interval 0, or beyond train_iters: no step reaches it)
    "logging.eval_interval": lambda c, v: not _eval_on(c),
    "logging.eval_iters": lambda c, v: not _eval_on(c),
    # validation data given while a step reaches eval_interval (given or train.py's default): an evaluation asked for
    "data.valid_data_paths": lambda c, v: v is None or not _eval_reached(c),
    "data.test_data_paths": lambda c, v: v is None or not _eval_reached(c),
    "logging.tensorboard_dir": lambda c, v: v is None,
    "logging.progress_bar": lambda c, v: not v or not _given(c, "progress_bar"),  # no bar: a line per logged step
    "logging.profile": lambda c, v: not v,
    "logging.profile_backward": lambda c, v: not v,
    "logging.profile_step_start": lambda c, v: not (c.logging.profile or c.logging.memory_profiling),
    "logging.profile_step_stop": lambda c, v: not (c.logging.profile or c.logging.memory_profiling),
    "logging.memory_profiling": lambda c, v: not v,
    "logging.memory_profiling_path": lambda c, v: not c.logging.memory_profiling,
    "distributed.trace_collectives": lambda c, v: v is None,
    "distributed.backend": lambda c, v: v in ("auto", "gloo"),  # gloo, always
    "distributed.device": lambda c, v: v == "cpu" or (v == "auto" and not torch.cuda.is_available()),  # CPU only
    "distributed.rendezvous_timeout_s": lambda c, v: v == _default("distributed.rendezvous_timeout_s"),
    # fp16 runs under train.py with its loss scaler; fsdp_baseline has none
    "train.max_bad_steps": lambda c, v: v == _default("train.max_bad_steps"),
    # the zero_topo block is the engine's plan; fsdp_baseline's is --mode. The quantizer's block sizes
    # and kernels act only when a bits key asks for quantization, and those keys are refused here
    "zero_topo.quant_block_size": lambda c, v: True,
    "zero_topo.grad_quant_block_size": lambda c, v: True,
    "zero_topo.kernels": lambda c, v: True,
}
# refused at their default too: distributed.device auto means the GPU where one is visible (train.py's choice)
CHECKED_AT_DEFAULT = frozenset({"distributed.device"})
for _f in ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale", "type"):
    INERT[f"train.fp16.{_f}"] = lambda c, v, _k=_f: v == _default(f"train.fp16.{_k}")
for _f in ("consecutive_hysteresis", "auto_cast"):
    INERT[f"train.fp16.{_f}"] = lambda c, v, _k=_f: v == _default(f"train.fp16.{_k}")


def _walk(obj, prefix: str):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _walk(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", v


def schema_keys(cfg: Config):
    """(section-qualified dotted key, value) of every field of ``cfg``; an absent optional block
    (``system``, ``zero_optimization``) is one key ``SECTION`` with value None."""
    for sec in _FLAT_SECTIONS + _BLOCK_SECTIONS:
        obj = getattr(cfg, sec)
        if obj is None or not dataclasses.is_dataclass(obj):
            yield sec, obj
        else:
            yield from _walk(obj, sec + ".")


_DEFAULTS: dict = {}
# blocks absent by default (None): the machine description (train.py's memory check and preset auto)
# and DeepSpeed's zero_optimization (a ZeRO stage for the engine)
_OPTIONAL_BLOCKS = ("system", "zero_optimization")


def _default(key: str):
    if not _DEFAULTS:
        _DEFAULTS.update(schema_keys(Config()))
    return _DEFAULTS.get(key)


def implemented(key: str) -> bool:
    """Whether fsdp_baseline uses ``key`` as train.py does (a block's fields count as the block)."""
    return key.split(".")[0] in WHOLE_SECTIONS or any(key == k or key.startswith(k + ".") for k in IMPLEMENTED)


def _shown(key: str) -> str:
    sec, _, rest = key.partition(".")
    return rest if sec in _FLAT_SECTIONS and rest else key  # as the config file spells it


def unimplemented(cfg: Config) -> list[str]:
    """The keys of ``cfg`` (as a config file spells them) that fsdp_baseline does not implement and
    whose value would act: every key outside IMPLEMENTED whose value differs from the default, unless
    INERT says the value changes nothing; zero_topo keys other than the quantizer's sizes; a
    ``system`` or ``zero_optimization`` block; precision fp16 (no loss scaler)."""
    out = []
    for key, value in schema_keys(cfg):
        sec = key.split(".")[0]
        if sec in WHOLE_SECTIONS or implemented(key):
            continue
        if sec in _OPTIONAL_BLOCKS and getattr(cfg, sec) is not None:  # a block given: named once
            if sec not in out:
                out.append(sec)
            continue
        if key in INERT:
            untouched = value == _default(key) and not _given(cfg, _shown(key)) and key not in CHECKED_AT_DEFAULT
            if not INERT[key](cfg, value) and not untouched:
                out.append(_shown(key))
        elif value != _default(key):
            out.append(_shown(key))
    if cfg.precision == "fp16":
        out.append("precision fp16 (train.py scales the loss; fsdp_baseline has no loss scaler: use bf16 or fp32)")
    return out


def refusal(keys: list[str]) -> str:
    return (
        f"fsdp_baseline does not implement {', '.join(keys)}: it trains only (the model, batch, optimizer, "
        f"schedule, data, precision bf16/fp32, topology, log_dir and log_interval of train.py's config; no "
        f"checkpoint load/save, evaluation, TensorBoard, profiling, trace or zero_topo plan: --mode picks the "
        f"sharding); remove them (save/load: null, eval_interval: 0) or run train.py"
    )
