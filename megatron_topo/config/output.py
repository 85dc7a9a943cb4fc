"""What the config shows: the effective config file, ``--list-keys`` (every key with its type,
default, valid values and doc) and the GPT-NeoX compatibility table (``--neox-table``)."""

from __future__ import annotations

import json
import os
import re
import typing

from .. import atomic
from ..zero_topo.plan_space import BLOCK_SIZE_RULE
from .deepspeed import OffloadBlock, SchedulerBlock, ZeroOptimizationBlock
from .idle_keys import idle_key_notes
from .neox import NEOX_DEFAULT_DIFFERS, NEOX_IMPLEMENTED, REJECTED_KEYS
from .neox_keys import NEOX_UNSUPPORTED
from .options import _bounds_text, _check_block, _check_split, _fmt, _type_name
from .run_outputs import EFFECTIVE_HEADER, written_by_a_run
from .schema import Config, SystemConfig, _declared, _key_index
from .schema_generate import generation_settings


def neox_table() -> list[tuple[str, str, str]]:
    """(key, status, why) for every GPT-NeoX / DeepSpeed key: implemented, accepted (valid values
    are what this trainer does anyway; others refused with the reason) or rejected."""
    cfg = Config(
        zero_optimization=ZeroOptimizationBlock(offload_optimizer=OffloadBlock(), offload_param=OffloadBlock()),
        system=SystemConfig(),
    )
    cfg.train.scheduler = SchedulerBlock()
    rows = []
    for path, _value, meta in _declared(cfg):
        status = meta.get("neox") or ("implemented" if path in NEOX_IMPLEMENTED else "")
        if path.startswith("neox."):
            path = path[len("neox.") :]
        if not status:
            continue
        why = meta.get("doc", "")
        ch = meta.get("choices")
        if status == "accepted" and ch is not None:
            vals = ", ".join(_fmt(c) for c in (ch() if callable(ch) else ch))
            why = f"{why}; valid: {vals}" + (f"; other values refused: {meta['why']}" if meta.get("why") else "")
        elif meta.get("why") and ch is not None:
            why = f"{why}; other values refused: {meta['why']}"
        if path in NEOX_DEFAULT_DIFFERS:
            why += f" (default differs: {NEOX_DEFAULT_DIFFERS[path]})"
        rows.append((path, status, why))
    declared = _key_index()  # a key declared in the schema is listed once, as declared
    rows += [(k, "rejected", v) for k, v in {**REJECTED_KEYS, **NEOX_UNSUPPORTED}.items() if k not in declared]
    return rows


def neox_table_markdown() -> str:
    rows = neox_table()
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("implemented", "accepted", "rejected")}
    out = [
        f"{counts['implemented']} implemented, {counts['accepted']} accepted, {counts['rejected']} rejected "
        f"(generated from megatron_topo/config/: `python -m megatron_topo.config --neox-table`).",
        "",
        "| Key | Status | Why |",
        "|---|---|---|",
    ]
    out += [f"| `{k}` | {s} | {w.replace('|', '/')} |" for k, s, w in rows]
    return "\n".join(out)


def note_lines(cfg: Config) -> list[str]:
    """The start-of-run note lines (trainer and --dry-run): accepted keys set to a value that changes
    nothing here, DeepSpeed "auto" keys with the value the rest of the config gave them, and an
    eval_interval that no step of the run reaches."""
    out = []
    if cfg.no_effect:
        out.append(f"note: set but without effect in megatron_topo (docs/neox_compat.md): {', '.join(cfg.no_effect)}")
    gen = generation_settings(cfg.generation)
    if gen:  # GPT-NeoX users compose text_generation.yml into the same list: named, not refused
        out.append(f"note: read by tools/generate.py CONFIG.yml, not by training (GPT-NeoX's too): {', '.join(gen)}")
    if cfg.auto_values:
        vals = ", ".join(f"{k}={_fmt(v) if not isinstance(v, list) else v}" for k, v in sorted(cfg.auto_values.items()))
        out.append(
            f'note: DeepSpeed "auto" values taken from the rest of the config (as the HF Trainer fills them): {vals}'
        )
    d, given = cfg.data, getattr(cfg, "origin", None) or {}
    unused = [k for k in ("data_path", "split") if k in given and getattr(d, k) is not None and d.train_data_paths]
    if unused:  # GPT-NeoX reads train/valid/test_data_paths then, and ignores these too
        shown = " and ".join(f"{k} {getattr(d, k)}" for k in unused)
        out.append(
            f"note: train_data_paths is set, so {shown} {'is' if len(unused) == 1 else 'are'} not used (as in "
            f"GPT-NeoX, train/valid/test_data_paths win); drop {' and '.join(unused)} to silence this"
        )
    c = cfg.checkpoint
    idle = [k for k in ("finetune", "no_load_optim") if getattr(c, k) and not c.load]
    if idle:  # load's modifiers: without load there is nothing they change (GPT-NeoX ignores them too)
        why = "finetune_from already starts from weights alone" if c.finetune_from else "load is not set"
        verb = "modifies" if len(idle) == 1 else "modify"
        out.append(f"note: {' and '.join(f'{k}: true' for k in idle)} only {verb} load, and {why}: no effect")
    out += idle_key_notes(cfg)  # save's keys without save, load's modifiers without load, auto_resume with load
    m = cfg.model
    if m.num_attention_heads and not m.hidden_size % m.num_attention_heads:
        from .checks import rotary_dims

        exact, dims = rotary_dims(m)
        if exact != dims:
            out.append(
                f"note: rotary_pct {m.rotary_pct:g} of head dim {m.hidden_size // m.num_attention_heads} = {exact:g}: "
                f"{dims} dims are rotary (GPT-NeoX and HF round down the same way)"
            )
    lg, t = cfg.logging, cfg.train
    decay_iters = t.lr_decay_iters or t.train_iters
    warm = t.warmup * decay_iters
    if "warmup" in given and warm != int(warm):  # training/batches.learning_rate: int(), as GPT-NeoX
        out.append(
            f"note: warmup {t.warmup:g} of {'lr_decay_iters' if t.lr_decay_iters else 'train_iters'} {decay_iters} = "
            f"{warm:g} steps: {int(warm)} steps warm up (GPT-NeoX rounds down the same way; warmup_iters gives steps)"
        )
    if 0 < t.train_iters < lg.eval_interval:
        out.append(
            f"note: eval_interval {lg.eval_interval} is above train_iters {t.train_iters}: no step of this run "
            f"evaluates (eval_interval: 0 says so; GPT-NeoX would evaluate once at the end)"
        )
    return out


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
            valid.append(BLOCK_SIZE_RULE)
        if meta.get("length"):
            valid.append(f"{meta['length']} values")
        opt = typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
        typ = re.sub(r"\b(an?) ", "", _type_name(tp)).replace(" (true/false)", "") + (" or null" if opt else "")
        default = "null" if value is None else _fmt(value) if not isinstance(value, list) else str(value)
        default = json.dumps(default) if not default.isprintable() else default  # prompt_end's "\n"
        lines.append(
            f"{path:<42} {typ:<28} default {default:<14} {'; '.join(valid):<36} {meta.get('doc', '')}".rstrip()
        )
    return "\n".join(lines)


def check_log_dir(log_dir: str, name: str = "config.yml") -> None:
    """Before a run writes into ``log_dir``: refuse a log_dir that is or lies inside a checkpoint's
    step folder (its config.yml is the checkpoint's, digest-checked), and a ``config.yml`` there
    that no run wrote (a user's own file: it is not overwritten)."""
    from ..safe_outputs import checkpoint_step_above
    from .options import ConfigError

    p = checkpoint_step_above(log_dir)
    if p is not None:
        raise ConfigError(
            f"log_dir {log_dir} lies inside the checkpoint folder {p}; the run would write its "
            f"config.yml and metrics over the checkpoint's files: set log_dir elsewhere"
        )
    path = os.path.join(log_dir, name)
    if os.path.lexists(path) and not (os.path.isfile(path) and not os.path.islink(path) and written_by_a_run(path)):
        raise ConfigError(
            f"log_dir {log_dir} holds a {name} that no run wrote (a file of your own?); it is not "
            f"overwritten: move it, or set log_dir to another folder"
        )


def check_cache_dir(cfg: Config, own_folders=None) -> None:
    """data_cache_dir (default ``data_cache``) is a folder (not a file), no other artifact's folder
    nor another run's (``own_folders``: the run's own (save, log_dir), default cfg's), and its
    ``index/`` no symbolic link (train.py and prepare_data.py write the index caches there)."""
    from ..safe_outputs import check_output_folder
    from .options import ConfigError
    from .run_outputs import check_other_runs, check_shapes, run_outputs

    cache_out = [o for o in run_outputs(cfg) if o.key == "data_cache_dir"]
    check_shapes(cache_out)
    own_runs = (cfg.checkpoint.save, cfg.logging.log_dir) if own_folders is None else own_folders
    cache = cfg.data.data_cache_dir or "data_cache"  # data/build.py's default
    own = [cfg.checkpoint.save] if cfg.checkpoint.save else []
    derived = [(os.path.join(cache, "index"), "index caches")]
    check_output_folder("data_cache_dir", cache, ConfigError, own=own, derived=derived, what="index caches")
    check_other_runs(cache_out, *own_runs)


def check_run_outputs(cfg: Config) -> None:
    """Every folder a run writes: log_dir (:func:`check_log_dir`), its metrics.jsonl (appended to: a
    FIFO would block, a symlink would write into another file), tensorboard_dir, data_cache_dir and
    save: none is or lies inside a folder another artifact owns (a checkpoint step or another save
    folder, a HuggingFace model folder; the run's own save folder is its own), and the folders the run
    names itself inside them (``log_dir/tensorboard``, ``data_cache_dir/index``) are no symbolic links.
    Every output of the run (config/run_outputs.py: also the trace, profile and memory folders): no
    file where it goes, no name another output of the run writes, no other run's folder (a running
    job's locked folder, a finished run's log folder)."""
    import stat

    from ..safe_files import _kind
    from ..safe_outputs import check_output_folder, checkpoint_step_above
    from .options import ConfigError
    from .run_outputs import check_names, check_other_runs, check_shapes, run_outputs

    every = run_outputs(cfg)  # every output folder of the run, with the names each writes
    check_names(every)  # none is a name another output of the run writes (save's latest, ...)
    check_shapes(every)  # no file where a folder goes
    lg = cfg.logging
    check_log_dir(lg.log_dir)
    for key, path in (("tensorboard_dir", lg.tensorboard_dir), ("data_cache_dir", cfg.data.data_cache_dir)):
        step = checkpoint_step_above(path) if path else None
        if step is not None:
            raise ConfigError(
                f"{key} {path} lies inside the checkpoint folder {step}; the run would write into the "
                f"checkpoint: set {key} elsewhere"
            )
    own = [cfg.checkpoint.save] if cfg.checkpoint.save else []
    tb = lg.tensorboard_dir or os.path.join(lg.log_dir, "tensorboard")
    outputs = [
        (
            "log_dir",
            lg.log_dir,
            [] if lg.tensorboard_dir else [(tb, "TensorBoard event files")],
            "metrics.jsonl, config.yml and its lock",
        ),
        ("tensorboard_dir" if lg.tensorboard_dir else "log_dir", tb, [], "TensorBoard event files"),
    ]
    if cfg.checkpoint.save:
        outputs.append(("save", cfg.checkpoint.save, [], "checkpoints"))
    for key, path, derived, what in outputs:
        check_output_folder(key, path, ConfigError, own=own, derived=derived, what=what)
    check_cache_dir(cfg)
    check_other_runs(every, cfg.checkpoint.save, lg.log_dir)  # a running job's or a finished run's folders
    for name in ("metrics.jsonl", "metrics.jsonl.superseded"):  # appended to (a resume moves records aside)
        metrics = os.path.join(lg.log_dir, name)
        if os.path.islink(metrics):
            raise ConfigError(
                f"log_dir {lg.log_dir}: {name} is a symbolic link; the run appends its records to "
                f"{name} and would write into what it points to: remove the link or set log_dir "
                f"elsewhere"
            )
        if os.path.exists(metrics) and not stat.S_ISREG(os.stat(metrics).st_mode):
            raise ConfigError(
                f"log_dir {lg.log_dir}: {name} is {_kind(os.stat(metrics).st_mode)}, not a file; "
                f"the run appends its records there: remove it or set log_dir elsewhere"
            )


def write_effective_config(cfg: Config, directory: str, name: str = "config.yml") -> str:
    """Atomically write the effective config into ``directory``; returns the path. A file there
    that no run wrote is refused (:func:`check_log_dir`), never replaced."""
    check_log_dir(directory, name)
    path = os.path.join(directory, name)
    atomic.write_text(path, EFFECTIVE_HEADER + cfg.to_flat_yaml())
    return path
