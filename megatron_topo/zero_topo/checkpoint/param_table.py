"""The one check every reader of a checkpoint's parameter table applies: meta.json's units (their
parameters' names, offsets, numels and shapes, and each unit's element count) must equal those of
the model the engine shards (a resume, ``finetune_from``) or that the checkpoint's config.yml
builds (``convert_to_hf``, ``consolidate_checkpoint``, ``generate``). A table edited after the save
(a renamed, missing, extra or duplicated parameter, another shape or offset) is one line naming
meta.json and the first difference, never a file written under a wrong name."""

from __future__ import annotations

import os
from typing import Sequence

import torch.nn as nn

from ...safe_files import excerpt
from .meta_schema import Meta
from .storage import CheckpointError


def module_unit_table(model: nn.Module) -> list[dict]:
    """The unit tables (``numel`` and ``params`` as [name, offset, numel, shape]) an engine builds
    from ``model.shard_units()``: trainable parameters only, a tied weight in the first unit that
    has it, units without parameters left out (as the engine does). Works on the meta device."""
    names = {id(p): n for n, p in model.named_parameters()}
    seen: set = set()
    out = []
    for u in model.shard_units():
        params, off = [], 0
        for _, p in u.named_parameters(remove_duplicate=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            params.append([names[id(p)], off, p.numel(), list(p.shape)])
            off += p.numel()
        if params:
            out.append({"numel": off, "params": params})
    return out


def _rec(p) -> str:
    name, off, numel, shape = p
    return f"{excerpt(name)} (offset {off:,}, numel {numel:,}, shape {tuple(shape)})"


def check_param_table(sp: str, meta: Meta, mine: Sequence[dict], model: str = "the model") -> None:
    """CheckpointError naming ``sp``/meta.json and the first unit or parameter whose record differs
    from ``mine`` (:func:`module_unit_table`, or an engine's ``unit_table()``); ``model`` says what
    ``mine`` describes (e.g. "the model config.yml builds")."""
    where = f"{os.path.join(sp, 'meta.json')}"
    if len(meta.units) != len(mine):
        raise CheckpointError(
            f"{where}: checkpoint has {len(meta.units)} units, {model} has {len(mine)} (different num_layers?)"
        )
    for i, (a, b) in enumerate(zip(meta.units, mine)):
        pa = [p.to_record() for p in a.params]
        pb = [[p[0], int(p[1]), int(p[2]), [int(d) for d in p[3]]] for p in b["params"]]
        for j, (x, y) in enumerate(zip(pa, pb)):
            if x == y:
                continue
            if x[0] == y[0] and x[3] != y[3]:  # the message resume gave for another model config
                raise CheckpointError(
                    f"{where}: parameter {y[0]} has shape {tuple(x[3])} in the checkpoint but "
                    f"{tuple(y[3])} in the model (unit {i}); the model config differs from the one that was saved"
                )
            raise CheckpointError(
                f"{where}: units[{i}].params[{j}] is {_rec(x)}; {model} has {_rec(y)} there: the "
                f"checkpoint's parameter table does not match the model"
            )
        if len(pa) != len(pb):
            extra = f"extra {_rec(pa[len(pb)])}" if len(pa) > len(pb) else f"missing {_rec(pb[len(pa)])}"
            raise CheckpointError(
                f"{where}: unit {i} has {len(pa)} parameters in the checkpoint, {len(pb)} in {model} ({extra})"
            )
        if int(a.numel) != int(b["numel"]):
            raise CheckpointError(
                f"{where}: units[{i}].numel is {int(a.numel):,}; its parameters in {model} hold {int(b['numel']):,}"
            )
