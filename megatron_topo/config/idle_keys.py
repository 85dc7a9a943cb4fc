"""Checkpoint keys that only act together with another key (``save``, ``load``), named in one
``note:`` line each when that key is not there (as ``finetune`` / ``no_load_optim`` without
``load``, :func:`megatron_topo.config.output.note_lines`): a run asked for checkpoints that no
step writes, or for a way of loading with nothing to load, says so instead of doing nothing."""

from __future__ import annotations

from .options import _fmt

# saving keys: what each means when set (given, or a value other than "never")
_SAVE_KEYS = ("checkpoint_factor", "save_interval_minutes", "extra_save_iters", "keep_last", "keep_last_n_checkpoints")


def _shown(key: str, value) -> str:
    return f"{key} {value if isinstance(value, list) else _fmt(value)}"


def _listed(items: list) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def idle_save_keys(c, given: dict) -> list[str]:
    """The saving keys this config sets although ``save`` is not set (``key value`` each)."""
    if c.save:
        return []
    out = []
    for k in _SAVE_KEYS:
        v = getattr(c, k)
        if k in ("keep_last", "keep_last_n_checkpoints"):  # a count of checkpoints kept: said when given
            on, v = k in given, c.keep_last  # (the loader moves GPT-NeoX's name into keep_last)
        else:
            on = bool(v)  # 0, 0.0, [] and null save nothing either way
        if on:
            out.append(_shown(k, v))
    return out


def idle_key_notes(cfg) -> list[str]:
    """One ``note:`` line per group of keys that change nothing in this run because the key they
    modify is not set."""
    c, given = cfg.checkpoint, getattr(cfg, "origin", None) or {}
    out = []
    saving = idle_save_keys(c, given)
    if saving:
        out.append(
            f"note: {_listed(saving)} only {'applies' if len(saving) == 1 else 'apply'} when save is set, "
            f"and save is not set: no checkpoint is written (set save: DIR to save checkpoints)"
        )
    if not c.load and not c.finetune_from:
        idle = [k for k in ("load_unverified", "finetune_architecture_change") if getattr(c, k)]
        if idle:
            out.append(
                f"note: {' and '.join(f'{k}: true' for k in idle)} only {'modifies' if len(idle) == 1 else 'modify'} "
                f"what load or finetune_from reads, and neither is set: no effect"
            )
    if c.auto_resume and c.load:
        out.append(
            f"note: auto_resume: true only applies without load (it resumes from save), and load {c.load} is set: "
            f"no effect (this run starts from load)"
        )
    return out
