"""DeepSpeed config blocks: ``scheduler`` (mapped onto the learning-rate keys), ``zero_optimization``
and its offload blocks (mapped onto presets by zero_topo.sharding), ``data_types``; llemma's
``warmup_iters`` / ``decay_lr_to`` (mapped onto warmup / min_lr)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .options import ConfigError, _check_declared, _collect, _fmt, option
from .precision import resolve_precision

if TYPE_CHECKING:
    from .schema import Config


SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


@dataclass
class SchedulerParams:
    """DeepSpeed's scheduler params; mapped onto lr, warmup, lr_decay_iters, lr_decay_style, min_lr."""

    warmup_min_lr: float = option(
        0.0, "WarmupLR/WarmupDecayLR: lr at step 0", choices=(0.0,), why="warmup starts from 0 as in GPT-NeoX"
    )
    warmup_max_lr: Optional[float] = option(
        None, "WarmupLR/WarmupDecayLR: peak lr (sets optimizer.params.lr)", ge=0.0, le=10.0
    )
    warmup_num_steps: int = option(1000, "warmup steps", ge=0, le=1 << 40)
    warmup_type: str = option(
        "linear",
        "warmup shape (DeepSpeed's default is log)",
        choices=("linear",),
        why="warmup is linear as in GPT-NeoX; set warmup_type: linear",
    )
    total_num_steps: Optional[int] = option(
        None, "WarmupDecayLR/WarmupCosineLR: warmup + decay steps (sets lr_decay_iters)", ge=1, le=1 << 40
    )
    warmup_min_ratio: float = option(
        0.0, "WarmupCosineLR: lr at step 0 / peak", choices=(0.0,), why="warmup starts from 0 as in GPT-NeoX"
    )
    cos_min_ratio: float = option(0.0001, "WarmupCosineLR: final lr / peak (sets min_lr)", ge=0.0, le=1.0)
    last_batch_iteration: int = option(
        -1, "resume position", choices=(-1,), why="the schedule position comes from the checkpoint's step"
    )


@dataclass
class SchedulerBlock:
    type: str = option(
        "WarmupLR",
        "DeepSpeed scheduler",
        choices=SCHEDULERS,
        neox="implemented",
        why="OneCycle and LRRangeTest are not implemented",
    )
    params: SchedulerParams = field(default_factory=SchedulerParams)


@dataclass
class DataTypesBlock:
    """DeepSpeed's data_types block (GPT-NeoX declares it in deepspeed_args.py; llemma's files set it)."""

    grad_accum_dtype: Optional[str] = option(
        None,
        "dtype gradients accumulate in over the micro-batches of a step: fp32 here under every plan (the "
        "engine's gradient shards are fp32)",
        choices=("fp32",),
        ignore_case=True,
        neox="accepted",
        why="gradients always accumulate in fp32 here; fp16/bf16 accumulation is not implemented",
    )


_NO_BUCKETS = "no effect: units (one per layer) are the communication buckets"
_NO_STAGE3 = "no effect: weights are gathered unit by unit (one layer) and freed after use; prefetch is one unit ahead"


@dataclass
class OffloadBlock:
    """DeepSpeed's offload_optimizer / offload_param."""

    device: str = option(
        "none",
        "where to offload: offload is not implemented, the states stay on the device "
        "sharded by the plan (the preflight refuses a plan whose states do not fit: shard over more "
        "ranks, zero3/topo or a larger optimizer_factor)",
        choices=("none", "cpu", "nvme"),
        neox="accepted",
        why="DeepSpeed's devices are none, cpu and nvme",
    )
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
    """DeepSpeed's ``zero_optimization`` keys, mapped onto presets (see zero_topo.sharding)."""

    stage: int = option(0, "ZeRO stage", choices=(0, 1, 2, 3), neox="implemented")
    zero_hpz_partition_size: int = option(
        1, "ZeRO++ hpZ secondary partition size", ge=1, le=1 << 20, neox="implemented"
    )
    zero_quantized_weights: bool = option(False, "ZeRO++ qwZ: 8-bit weight all-gather", neox="implemented")
    zero_quantized_gradients: bool = option(False, "ZeRO++ qgZ: 4-bit gradient reduce-scatter", neox="implemented")
    zero_quantized_nontrainable_weights: bool = option(False, "every weight is trainable", neox="accepted")
    mics_shard_size: int = option(
        -1,
        "MiCS shard group size (-1: off; 0 is refused: DeepSpeed reads it as off, not as a size)",
        ge=-1,
        le=1 << 20,
        check=lambda v: "use -1 for no MiCS (DeepSpeed's default), or a shard group size >= 1" if v == 0 else None,
        neox="implemented",
    )
    mics_hierarchical_params_gather: bool = option(
        False, "MiCS two-level weight gather: the shard group's gather is already hierarchy-aware", neox="accepted"
    )
    overlap_comm: bool = option(
        True,
        "overlap communication with compute: the engine always overlaps (a "
        "performance choice; zero_topo.prefetch: false turns off weight prefetch)",
        neox="accepted",
    )
    contiguous_gradients: bool = option(
        True,
        "contiguous gradient buffers: each unit's gradients always live in one flat buffer (a memory-layout choice)",
        neox="accepted",
    )
    reduce_scatter: bool = option(
        True,
        "gradients are reduce-scattered wherever the plan shards them (grad_factor > 1), all-reduced otherwise",
        neox="accepted",
    )
    allgather_partitions: bool = option(True, "weights are all-gathered per unit", neox="accepted")
    reduce_bucket_size: int = option(500_000_000, _NO_BUCKETS, ge=0, neox="accepted")
    allgather_bucket_size: int = option(500_000_000, _NO_BUCKETS, ge=0, neox="accepted")
    round_robin_gradients: bool = option(False, "no effect: gradient shards are contiguous per unit", neox="accepted")
    sub_group_size: int = option(
        1_000_000_000, "no effect: the optimizer steps one unit's shard at a time", ge=0, neox="accepted"
    )
    stage3_max_live_parameters: int = option(1_000_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_max_reuse_distance: int = option(1_000_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_prefetch_bucket_size: int = option(50_000_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_param_persistence_threshold: int = option(100_000, _NO_STAGE3, ge=0, neox="accepted")
    stage3_model_persistence_threshold: int = option(2**63 - 1, _NO_STAGE3, ge=0, neox="accepted")
    stage3_gather_16bit_weights_on_model_save: bool = option(
        False, "no effect: checkpoints hold fp32 masters, tools/convert_to_hf.py exports", neox="accepted"
    )
    stage3_gather_fp16_weights_on_model_save: bool = option(False, "old name of the key above", neox="accepted")
    elastic_checkpoint: bool = option(False, "checkpoints always load under any plan and world size", neox="accepted")
    load_from_fp32_weights: bool = option(True, "checkpoints always load the fp32 masters", neox="accepted")
    ignore_unused_parameters: bool = option(True, "every parameter is used", neox="accepted")
    legacy_stage1: bool = option(False, "no effect", neox="accepted")
    cpu_offload: bool = option(
        False,
        "old DeepSpeed name of offload_optimizer.device: cpu (offload is not "
        "implemented: the states stay on the device, sharded by the plan)",
        neox="accepted",
    )
    zero_quantized_nontrainable_weights_dtype: Optional[str] = option(
        None, "every weight is trainable", neox="accepted"
    )
    memory_efficient_linear: bool = option(
        True, "ZeRO-3 linear-layer memory trick: activations are kept by checkpoint_activations here", neox="accepted"
    )
    offload_optimizer: Optional[OffloadBlock] = option(None, "DeepSpeed offload optimizer block (device none only)")
    offload_param: Optional[OffloadBlock] = option(None, "DeepSpeed offload param block (device none only)")


def warmup_fraction(steps: int, total: int) -> float:
    """The ``warmup`` fraction of ``total`` steps that the schedule turns back into exactly ``steps``
    warmup steps (it takes ``int(warmup * total)``; ``steps / total`` alone can land just below,
    e.g. 7 / 55 * 55 = 6.999...)."""
    f = steps / total
    while int(f * total) < steps:
        f = math.nextafter(f, math.inf)
    return min(f, 1.0)


def apply_lr_keys(cfg: Config, origin: dict, problems: list) -> None:
    """llemma's ``warmup_iters`` (warmup in steps) and ``decay_lr_to`` (final lr as a fraction of the
    peak): set ``warmup`` and ``min_lr`` from them, then drop them (the effective config states
    warmup/min_lr). A key they replace given as well is a conflict (appended to ``problems``)."""
    t = cfg.train
    for key, twin in (("warmup_iters", "warmup"), ("decay_lr_to", "min_lr")):
        if getattr(t, key) is not None:
            if twin in origin:
                problems.append(f"{key} and {twin} both set the learning-rate schedule; give one")
            if t.scheduler is not None:
                problems.append(
                    f"scheduler ({t.scheduler.type}) and {key} both set the learning-rate schedule; keep one"
                )
    total = t.lr_decay_iters or t.train_iters
    if t.warmup_iters is not None:
        if t.warmup_iters > total:
            which = "lr_decay_iters" if t.lr_decay_iters else "train_iters"
            problems.append(f"warmup_iters {t.warmup_iters} exceeds the {which} {total}")
        else:
            t.warmup = warmup_fraction(t.warmup_iters, total)
        t.warmup_iters = None
    if t.decay_lr_to is not None:
        t.min_lr = t.decay_lr_to * t.optimizer.params.lr
        t.decay_lr_to = None


def apply_scheduler(cfg: Config, origin: dict, problems: list) -> None:
    """Map the DeepSpeed scheduler block (WarmupLR, WarmupDecayLR, WarmupCosineLR) onto lr, warmup,
    lr_decay_iters, lr_decay_style and min_lr, then drop it; conflicts are appended to ``problems``.
    llemma's warmup_iters / decay_lr_to are mapped first (apply_lr_keys)."""
    apply_lr_keys(cfg, origin, problems)
    t = cfg.train
    sch = t.scheduler
    if sch is None:
        return
    bad = len(problems)
    auto = {
        k
        for k in ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")
        if AUTO + "scheduler.params." + k in origin and "scheduler.params." + k not in origin
    }
    sources = {"lr_decay_iters": "total_num_steps", "warmup": "warmup_num_steps"}  # an "auto" key's source
    for key in ("lr_decay_style", "lr_decay_iters", "warmup", "min_lr"):
        if key in origin and sources.get(key) not in auto:
            problems.append(f"scheduler ({sch.type}) and {key} both set the learning-rate schedule; keep one")
    for f in dataclasses.fields(sch.params):
        _collect(problems, _check_declared, f"scheduler.params.{f.name}", getattr(sch.params, f.name), f.metadata)
    _collect(problems, _check_declared, "scheduler.type", sch.type, dataclasses.fields(sch)[0].metadata)
    if len(problems) > bad:
        return
    sp = sch.params
    if "total_num_steps" in auto:  # HF Trainer: the run's step count
        sp.total_num_steps = t.lr_decay_iters or t.train_iters
    if "warmup_num_steps" in auto:  # HF Trainer: its warmup; here the warmup fraction of the config
        sp.warmup_num_steps = int(
            t.warmup * ((sp.total_num_steps if sch.type != "WarmupLR" else None) or t.lr_decay_iters or t.train_iters)
        )
    for k in auto:
        cfg.auto_values["scheduler.params." + k] = getattr(sp, k) if k != "warmup_max_lr" else t.optimizer.params.lr
    if sp.warmup_max_lr is not None:
        if "optimizer.params.lr" in origin and sp.warmup_max_lr != t.optimizer.params.lr:
            problems.append(
                f"scheduler.params.warmup_max_lr {_fmt(sp.warmup_max_lr)} differs from "
                f"optimizer.params.lr {_fmt(t.optimizer.params.lr)}; they are the peak lr, give one"
            )
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
        t.lr_decay_iters, t.warmup = total, warmup_fraction(min(sp.warmup_num_steps, total), total)
    elif sp.warmup_num_steps > total:
        problems.append(
            f"scheduler.params.warmup_num_steps {sp.warmup_num_steps} exceeds the "
            f"{'total_num_steps' if sch.type != 'WarmupLR' else 'train_iters'} {total}"
        )
    else:
        t.lr_decay_iters, t.warmup = total, warmup_fraction(sp.warmup_num_steps, total)
    cfg.train.scheduler = None  # mapped: the effective config states lr/warmup/decay


# DeepSpeed keys the HF Trainer fills when a file gives "auto" (transformers' HfTrainerDeepSpeedConfig):
# here they take the value the rest of the config gives (another file, --set, or the default)
HF_AUTO_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
)
AUTO = "auto:"  # origin key prefix of a key a file set to "auto" (the value comes from elsewhere)
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def resolve_autos(cfg: Config, origin: dict) -> None:
    """The HF Trainer's fill-ins for "auto" keys no other file or --set gave: the zero_optimization
    sizes from hidden_size (hidden^2, 0.9 hidden^2, 10 hidden), fp16/bf16.enabled from ``precision``;
    every other key keeps the value the rest of the config gives. Records ``cfg.auto_values``
    (scheduler and batch keys are recorded where they are resolved)."""
    autos = [p[len(AUTO) :] for p in origin if p.startswith(AUTO)]
    h = cfg.model.hidden_size
    z = cfg.zero_optimization
    hf = {
        "zero_optimization.reduce_bucket_size": h * h,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * h * h),
        "zero_optimization.stage3_param_persistence_threshold": 10 * h,
    }
    for path in autos:
        if path in origin or path.startswith("scheduler.") or path in BATCH_KEYS:
            continue  # set elsewhere (reported as it stands), or resolved with the schedule / the world size
        if path in hf and z is not None:
            setattr(z, path.split(".")[-1], hf[path])
        if path in ("fp16.enabled", "bf16.enabled") and cfg.train.precision is not None:
            block = getattr(cfg.train, path.split(".")[0])
            block.enabled = resolve_precision(cfg.train) == path.split(".")[0]
    for path in autos:
        if path.startswith("scheduler.") or path in BATCH_KEYS:
            continue
        obj = cfg if path.startswith("zero_optimization.") else cfg.train
        for name in path.split(".")[:-1]:
            obj = getattr(obj, name)
        value = getattr(obj, path.split(".")[-1])
        if path == "optimizer.params.weight_decay" and value is None:
            value = cfg.train.weight_decay  # GPT-NeoX's top-level key is the same setting
        cfg.auto_values[path] = value


def derive_micro_batch(cfg: Config, world_size: int) -> None:
    """DeepSpeed's rule for a config that gives train_batch_size but no micro-batch: the micro-batch is
    train_batch_size / (accumulation x world size), the accumulation the one given, else 1 (the
    accumulation for a given micro-batch is derived by check_batch_size). A split that does not
    exist is one ConfigError line."""
    t = cfg.train
    given = cfg.batch_given
    if t.train_batch_size is None or given is None or "train_micro_batch_size_per_gpu" in given:
        return
    tb = t.train_batch_size
    ga = t.gradient_accumulation_steps if "gradient_accumulation_steps" in given else 1
    mb = tb // (ga * world_size)
    if mb < 1 or mb * ga * world_size != tb:
        raise ConfigError(
            f"train_batch_size {tb} cannot be split into train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps {ga} x world size {world_size} (DeepSpeed's rule); use a "
            f"multiple of {ga * world_size} or give the micro-batch"
        )
    t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps = mb, ga


def record_auto_batch(cfg: Config, world_size: int) -> None:
    """The batch keys a DeepSpeed file left "auto": their values at this world size, for the note line."""
    t = cfg.train
    mb, ga = t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps
    for k, v in zip(BATCH_KEYS, (mb * ga * world_size, mb, ga)):
        if k in cfg.auto_values:
            cfg.auto_values[k] = v
