"""Validation of a merged config: every declared field from its ``option`` metadata, the rules
that tie several fields together, and DeepSpeed's batch-size rule once the world size is known."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from typing import Callable, Optional

from ..safe_files import excerpt
from .deepspeed import BATCH_KEYS, derive_micro_batch, record_auto_batch
from .options import (
    ConfigError,
    _check_attention_config,
    _check_declared,
    _check_split,
    _collect,
    _short,
    attention_config_layers,
    raise_problems,
)
from .schema import (
    _BLOCK_SECTIONS,
    _FLAT_SECTIONS,
    AUTO_TRIAL_KEYS,
    PRECISIONS,
    Config,
    ModelConfig,
    ZeroTopoConfig,
    _declared,
    resolve_precision,
)

MAX_TOKENS_PER_RANK_STEP = 1 << 32  # a step's size bound: micro-batch x accumulation x seq_length per rank


def mentions(line: str, paths) -> bool:
    """Whether a problem line names one of the dotted ``paths`` (or a key below one) as a word."""
    return any(re.search(rf"(?<![\w.]){re.escape(p)}(?!\w)", line) for p in paths)


MAX_TEXT_BYTES = 4095  # a path the kernel can open; no name or other text key needs more

# lists whose unset value means "none" too (no extra saves): [] says the same, so it is not refused
EMPTY_LIST_MEANS_NONE = frozenset({"extra_save_iters"})


def _check_not_empty(path: str, value, meta, tp) -> None:
    """A path or text given empty (``save: ''``, ``log_dir: ''``) or an optional list given empty
    (``train_data_paths: []``) would read as unset (or as the current folder) without a word:
    refused; null leaves an optional key unset (fields with their own check say so themselves)."""
    optional = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str) and "\0" in text:
            raise ConfigError(f"{path}={excerpt(text, 20)} holds a NUL character; no path or name can")
        if isinstance(text, str) and len(os.fsencode(text)) > MAX_TEXT_BYTES:
            raise ConfigError(
                f"{path}={excerpt(text, 20)} is {len(os.fsencode(text)):,} bytes; a path or name is at most "
                f"{MAX_TEXT_BYTES:,} (Linux's PATH_MAX less its NUL)"
            )
    if meta.get("check") is not None or meta.get("choices"):
        return
    unset = f", or null (or no {path} at all) to leave it unset" if optional else ""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{path}={excerpt(value, 20)} is not valid; give a value{unset}")
    if optional and isinstance(value, list) and not value and path not in EMPTY_LIST_MEANS_NONE:
        raise ConfigError(f"{path}=[] is not valid; give at least one value{unset}")


def reset_out_of_bounds(cfg: Config) -> tuple:
    """(lines, paths) of the declared fields whose value breaks their own bounds or choices; each
    such field is put back to its default, so that nothing is derived from the bad value (a
    400-digit ``warmup_iters`` would overflow the warmup it sets) and one bad value is one line."""
    lines, paths = [], []

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
                continue
            try:
                _check_declared(f"{prefix}{f.name}", value, f.metadata)
            except ConfigError as e:
                lines.append(str(e))
                paths.append(f"{prefix}{f.name}")
                if f.default is not dataclasses.MISSING:
                    setattr(obj, f.name, f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    setattr(obj, f.name, f.default_factory())

    for sec in _FLAT_SECTIONS + _BLOCK_SECTIONS:
        obj = getattr(cfg, sec)
        if obj is not None:
            walk(obj, "" if sec in _FLAT_SECTIONS else sec + ".")
    return lines, frozenset(paths)


def validate(
    cfg: Config,
    problems: Optional[list] = None,
    *,
    arch_problems: Callable[[ModelConfig], list],
    reported: frozenset = frozenset(),
) -> None:
    """Every declared field's bounds and choices (from its ``option`` metadata), then the rules
    that tie fields together. Every problem is found: raised together (ConfigErrors, one line
    each), or appended to ``problems``. ``arch_problems(model_config)``: the architecture's own
    rules (the model spec's ``check``; load_config passes it, config imports no model code).
    One bad value is one line: a rule between fields that names a field already reported (its own
    bounds or choices, or ``reported``: keys the merge refused) is not reported on top."""
    own: list = []
    bad = set(reported)
    for path, value, meta, tp in _declared(cfg, with_type=True):
        n = len(own)
        _collect(own, _check_declared, path, value, meta)
        if len(own) == n:
            _collect(own, _check_not_empty, path, value, meta, tp)
        if len(own) > n:
            bad.add(path)
    cross: list = []
    _cross_checks(cfg, cross, arch_problems)
    own.extend(line for line in cross if not mentions(line, bad))
    if problems is not None:
        problems.extend(own)
    else:
        raise_problems(own)


def _cross_checks(cfg: Config, problems: list, arch_problems: Callable[[ModelConfig], list]) -> None:
    """Rules between fields (a single field's rules live in its declaration); each broken rule is
    appended to ``problems``."""
    m, t, d, c = cfg.model, cfg.train, cfg.data, cfg.checkpoint
    add = problems.append
    if t.precision is None or str(t.precision).lower() in PRECISIONS:  # (a bad name is the field's problem)
        _collect(problems, resolve_precision, t)
    tokens = t.train_micro_batch_size_per_gpu * t.gradient_accumulation_steps * m.seq_length
    if tokens > MAX_TOKENS_PER_RANK_STEP:
        add(
            f"a step would take {tokens:,} tokens per rank (train_micro_batch_size_per_gpu "
            f"{t.train_micro_batch_size_per_gpu} x gradient_accumulation_steps {t.gradient_accumulation_steps} x "
            f"seq_length {m.seq_length}); the bound is {MAX_TOKENS_PER_RANK_STEP:,} (2**32): use fewer micro-batches "
            f"per step"
        )
    if 0 <= t.optimizer.params.lr < t.min_lr < float("inf"):
        add(
            f"min_lr {t.min_lr:g} is above optimizer.params.lr {t.optimizer.params.lr:g}: the schedule would decay "
            f"upwards and train at min_lr; set min_lr <= lr"
        )
    if m.num_attention_heads and m.hidden_size % m.num_attention_heads:
        add(f"hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}")
    if m.max_position_embeddings is not None and m.seq_length > m.max_position_embeddings:
        add(f"seq_length {m.seq_length} exceeds max_position_embeddings {m.max_position_embeddings}")
    bad_attention = _check_attention_config(m.attention_config) if m.attention_config is not None else None
    if bad_attention:
        add(f"attention_config={_short(m.attention_config)} is not valid; {bad_attention}")
    elif m.attention_config is not None:
        n = attention_config_layers(m.attention_config, m.num_layers)
        if n is None:
            add(f'attention_config\'s "all" pattern does not divide num_layers {m.num_layers}')
        elif n != m.num_layers:
            add(
                f"attention_config covers {n} layers but num_layers is {m.num_layers}; e.g. "
                f'[[["global"], {m.num_layers}]]'
            )
    if m.num_attention_heads and not m.hidden_size % m.num_attention_heads:
        bad_rotary = _rotary_problem(m)
        if bad_rotary:
            add(bad_rotary)
        problems.extend(arch_problems(m))  # the architecture's own rules (model/spec.py)
    if not d.train_data_paths:
        for name in ("train_data_weights", "valid_data_paths", "test_data_paths"):
            if getattr(d, name):
                add(
                    f"{name} is set but train_data_paths is not (with data_path, split cuts the "
                    f"data); set train_data_paths too or drop {name}"
                )
        if (
            d.data_path is not None
            and _check_split(d.split) is None
            and float(str(d.split).replace("/", ",").split(",")[0] or 0) <= 0
        ):
            add(
                f"split '{d.split}' gives the train split no share of {d.data_path}; "
                f"the first number must be > 0, e.g. 969,30,1"
            )
    elif d.train_data_weights is not None and len(d.train_data_weights) != len(d.train_data_paths):
        add(
            f"train_data_weights has {len(d.train_data_weights)} values for "
            f"{len(d.train_data_paths)} train_data_paths; give one weight per path"
        )
    _eval_checks(cfg, add)
    _profile_checks(cfg, add)
    if cfg.zero_optimization is not None and cfg.zero_topo.preset != "ddp":
        add(f"zero_optimization and zero_topo.preset={cfg.zero_topo.preset} both choose the sharding; keep one of them")
    z = cfg.zero_topo
    changed = [k for k in AUTO_TRIAL_KEYS if getattr(z, k) != getattr(ZeroTopoConfig(), k)]
    if changed and z.preset != "auto":
        add(
            f"zero_topo.{changed[0]}={getattr(z, changed[0])} applies to zero_topo.preset: auto only, and the preset "
            f"is {z.preset}; drop it or set preset: auto"
        )
    if t.train_batch_size is not None:
        given = cfg.batch_given if cfg.batch_given is not None else frozenset(BATCH_KEYS)
        # the accumulation is derived from the global batch (DeepSpeed), unless the micro-batch is not
        # given: then the accumulation given (or 1) and the world size give the micro-batch
        name = (
            "train_micro_batch_size_per_gpu"
            if "train_micro_batch_size_per_gpu" in given
            else ("gradient_accumulation_steps" if "gradient_accumulation_steps" in given else None)
        )
        per = getattr(t, name) if name else 1
        if per and t.train_batch_size % per:
            add(f"train_batch_size {t.train_batch_size} is not a multiple of {name} {per}: no world size gives it")
    if c.finetune_from and c.load:
        add(
            f"finetune_from ({c.finetune_from}) and load ({c.load}) both name the starting point; keep one "
            f"(load with finetune: true is the same as finetune_from)"
        )


def rotary_dims(m: ModelConfig) -> tuple[float, int]:
    """(head dim x rotary_pct, the rotary dims GPT-NeoX and HF's GPTNeoX use: int() of it)."""
    exact = (m.hidden_size // m.num_attention_heads) * float(m.rotary_pct)
    return exact, int(exact)


def _rotary_problem(m: ModelConfig) -> Optional[str]:
    """rotary_pct must give an even, non-zero count of rotary dims per head: an odd count fails in
    GPT-NeoX and HF (their cos/sin tables have an even width) and this model would drop one more
    dim; zero leaves the model without any position information (rotary is its only one)."""
    for f in dataclasses.fields(m):
        if f.name in ("hidden_size", "num_attention_heads", "rotary_pct"):
            try:
                _check_declared(f.name, getattr(m, f.name), f.metadata)
            except ConfigError:
                return None  # the field's own problem (one line for it, not two)
    head = m.hidden_size // m.num_attention_heads
    exact, dims = rotary_dims(m)
    shown = f"rotary_pct {m.rotary_pct:g} of head dim {head} = {exact:g}" + ("" if exact == dims else f" -> {dims}")
    lo = max(2, dims - dims % 2)  # the even counts nearest the value (a head of 1e9 dims lists three)
    evens = [d for d in (lo - 2, lo, lo + 2) if 2 <= d <= head]
    near = " or ".join(f"{d / head:g} ({d} dims)" for d in sorted(evens, key=lambda d: (abs(d - exact), d))[:2])
    way = f"use e.g. rotary_pct {near}" if near else "a head needs 2 dims or more: use fewer num_attention_heads"
    if dims == 0:
        return (
            f"{shown} rotary dims: the model would have no position information (rotary is its only position "
            f"embedding); {way}"
        )
    if dims % 2:
        return (
            f"{shown} rotary dims, an odd count: rotary turns pairs of dims (GPT-NeoX and HF fail on an odd "
            f"count); {way}"
        )
    return None


def _eval_checks(cfg: Config, add) -> None:
    """Evaluation is on when eval_interval > 0 (eval_interval: 0 is the one way to turn it off);
    then it must run: eval_iters >= 1 and a validation split with data (GPT-NeoX skips evaluation
    without a word when eval_iters is 0 or the split is empty). eval_interval above train_iters is
    a note (config/output.py note_lines): a short trial of a long config is legitimate."""
    lg, d, t = cfg.logging, cfg.data, cfg.train
    if not lg.eval_interval or lg.eval_interval < 0 or lg.eval_iters < 0:  # (a negative value is the field's problem)
        return
    if lg.eval_interval > t.train_iters:  # no step evaluates: the note says so, nothing needs to run
        return
    off = "or set eval_interval: 0 to turn evaluation off"
    if lg.eval_iters == 0:
        add(
            f"eval_iters is 0 but eval_interval {lg.eval_interval} evaluates every {lg.eval_interval} steps on "
            f"0 batches (no evaluation would run); set eval_iters >= 1 (micro-batches per evaluation), {off}"
        )
    if d.train_data_paths:
        if not d.valid_data_paths:
            add(
                f"eval_interval {lg.eval_interval} evaluates on valid_data_paths, which is not set; "
                f"set valid_data_paths, {off}"
            )
    elif d.data_path is not None and _check_split(d.split) is None:
        shares = [float(x) for x in str(d.split).replace("/", ",").split(",") if x.strip()] + [0.0, 0.0]
        if shares[1] <= 0:
            add(
                f"split '{d.split}' gives the validation split no share of {d.data_path}, but eval_interval "
                f"{lg.eval_interval} evaluates on it; give it a share (e.g. 969,30,1), {off}"
            )


PROFILE_WINDOW_DEFAULT = (10, 12)  # GPT-NeoX's profile_step_start, profile_step_stop


def profile_window(lg) -> tuple[int, int]:
    """The profiled window [start, stop) of the ``logging`` section, GPT-NeoX's defaults filled in."""
    a, b = PROFILE_WINDOW_DEFAULT
    return (a if lg.profile_step_start is None else lg.profile_step_start), (
        b if lg.profile_step_stop is None else lg.profile_step_stop
    )


def _profile_checks(cfg: Config, add) -> None:
    """GPT-NeoX's profiling keys (training/profiling.py): a window key needs profile or
    memory_profiling, profile_backward needs profile, memory_profiling_path needs memory_profiling,
    and the window [profile_step_start, profile_step_stop) holds steps of the run."""
    lg, t = cfg.logging, cfg.train
    on = lg.profile or lg.memory_profiling
    for name, given, needs in (
        ("profile_step_start", lg.profile_step_start is not None, on),
        ("profile_step_stop", lg.profile_step_stop is not None, on),
        ("profile_backward", lg.profile_backward, lg.profile),
        ("memory_profiling_path", lg.memory_profiling_path is not None, lg.memory_profiling),
    ):
        if given and not needs:
            what = "profile: true" if name == "profile_backward" else "memory_profiling: true"
            what = "profile: true or memory_profiling: true" if name.startswith("profile_step") else what
            add(f"{name} is set but takes effect only with {what}, which is not set; set it or drop {name}")
    a, b = profile_window(lg)
    if not on or a < 0 or b < 1 or t.train_iters < 1:  # (a negative value is the field's problem)
        return
    valid = f"valid: 0 <= profile_step_start < profile_step_stop <= train_iters {t.train_iters}"
    shown = lambda name, v: f"{name} {v}" + (" (default)" if getattr(lg, name) is None else "")
    if a >= b:
        add(f"{shown('profile_step_start', a)} is not below {shown('profile_step_stop', b)}: no step profiled; {valid}")
    elif b > t.train_iters:
        add(
            f"{shown('profile_step_stop', b)} is beyond train_iters {t.train_iters}: steps {max(a, t.train_iters) + 1}"
            f"..{b} of the window never run; {valid}"
        )


def check_batch_size(
    cfg: Config, world_size: int, ranks_per_node: int = 1, keep_global: Optional[int] = None, keep_from: str = ""
) -> Optional[str]:
    derive_micro_batch(cfg, world_size)  # DeepSpeed: train_batch_size without a micro-batch gives it
    line = _global_batch(cfg, world_size, ranks_per_node, keep_global, keep_from)
    record_auto_batch(cfg, world_size)  # "auto" batch keys: named in the note line
    return line


def _global_batch(
    cfg: Config, world_size: int, ranks_per_node: int = 1, keep_global: Optional[int] = None, keep_from: str = ""
) -> Optional[str]:
    """DeepSpeed's rule once the world is known: train_batch_size = micro-batch x accumulation x
    world size, with the accumulation count derived from the global batch (as DeepSpeed does when
    the accumulation is not given), so the global batch stays the same on any node count.

    The global batch is ``train_batch_size`` when set, else ``keep_global`` (a resumed run's global
    batch from its checkpoint, when the world changed; ``keep_from`` says where it came from), else
    whatever micro-batch x gradient_accumulation_steps x world size gives. Sets
    ``cfg.train.gradient_accumulation_steps`` and returns a line saying what changed (None when
    nothing did); a world that cannot reach the global batch is a ConfigError naming the nearest
    world sizes (node counts of ``ranks_per_node`` ranks) that can."""
    t = cfg.train
    target = t.train_batch_size if t.train_batch_size is not None else keep_global
    if target is None:
        return None
    source = "train_batch_size" if t.train_batch_size is not None else keep_from or "kept"
    micro = t.train_micro_batch_size_per_gpu
    per = micro * world_size
    if target % per:
        rpn = max(1, ranks_per_node)
        q = target // micro  # n nodes work when n x rpn divides target / micro
        if q % rpn:  # no node count of rpn ranks works: name world sizes instead
            rpn = 1
        unit = "nodes" if rpn > 1 else "ranks"
        n_now = max(1, world_size // rpn)
        q //= rpn
        ok = sorted({d for i in range(1, int(q**0.5) + 1) if q % i == 0 for d in (i, q // i)})
        below = [n for n in ok if n < n_now]
        above = [n for n in ok if n > n_now]
        near = " or ".join(
            f"{n} {unit if n > 1 else unit[:-1]}" + (f" ({n * rpn} ranks)" if rpn > 1 else "")
            for n in ([below[-1]] if below else []) + ([above[0]] if above else [])
        )
        raise ConfigError(
            f"global batch {target} ({source}) cannot be reached on {world_size} ranks with micro-batch {micro}: "
            f"{target} is not a multiple of {micro} x {world_size}; nearest valid: {near or 'none'}"
            + (
                "; or set train_batch_size to change the global batch"
                if t.train_batch_size is None
                else "; or change train_batch_size / train_micro_batch_size_per_gpu"
            )
        )
    accum = target // per
    if accum == t.gradient_accumulation_steps:
        return None
    old, t.gradient_accumulation_steps = t.gradient_accumulation_steps, accum
    return (
        f"global batch {target} ({source}) on {world_size} ranks x micro-batch {micro}: "
        f"gradient_accumulation_steps {old} -> {accum}"
    )
