"""Reading a checkpoint for an export in one process (``convert_to_hf``, ``consolidate_checkpoint``):
open and verify it before anything is written, then stream it one unit at a time."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from . import meta_schema, storage
from .meta_schema import Meta
from .offline import full_unit_state, read_config_yaml
from .param_table import check_param_table, module_unit_table
from .storage import CheckpointError


def verify_checkpoint_files(step_path: str, meta: Meta) -> None:
    """Open every rank file that holds tensors once: size and SHA-256 against meta.json, and a
    pickle that would run code is refused (CheckpointError). Nothing stays in memory."""
    for r in range(meta.holders):  # only holders store tensors
        storage.load_rank_file(step_path, r, meta)  # memory-mapped: hashed by reading, not loaded


def open_checkpoint(
    checkpoint: str, unverified: bool = False, ask: str = meta_schema.ASK_UNVERIFIED
) -> tuple[str, Meta, Optional[str]]:
    """(step folder, meta.json, config.yml text) of a checkpoint to export, with every rank file
    verified: an edited config.yml or a bad rank file fails here, before anything is written.
    Rank files without a size and SHA-256 record are refused unless ``unverified`` (the line says
    ``ask``: the tool's flag)."""
    sp = storage.resolve(checkpoint)
    meta = storage.read_meta(sp, unverified, ask)
    config_yaml = read_config_yaml(sp, meta)
    verify_checkpoint_files(sp, meta)
    return sp, meta, config_yaml


def check_model_table(step_path: str, meta: Meta, model_cfg) -> None:
    """meta.json's parameter table against the model ``model_cfg`` (the checkpoint's config.yml)
    builds, on the meta device (no memory): a renamed, missing, extra or reshaped parameter is a
    CheckpointError before anything is written."""
    from ...model.spec import build_model

    mine = module_unit_table(build_model(model_cfg, device="meta"))
    check_param_table(step_path, meta, mine, "the model config.yml builds")


def check_output_parent(path: str, flag: str = "--output") -> None:
    """The folder an output goes into must exist and take new files (CheckpointError)."""
    from ...safe_outputs import cannot_write_in

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CheckpointError(f"{flag} {path}: directory {parent} does not exist")
    why = cannot_write_in(parent)
    if why:
        raise CheckpointError(f"{flag} {path}: {why}; write it elsewhere")


def iter_checkpoint_units(step_path: str, meta: Meta, keys=("master",), verify: bool = True):
    """Yield ``(unit index, state, params)`` one unit at a time: ``state`` is the unit's unpadded
    flat fp32 ``keys`` (+ ``step``) as :func:`checkpoint.full_unit_state` reassembles it, ``params``
    its ``[name, offset, numel, shape]`` table. The rank files are checked against meta.json once
    (:func:`verify_checkpoint_files`; ``verify=False`` when the caller did), then memory-mapped
    again per unit, so only the bytes of that unit's ``keys`` are read and nothing of the previous
    unit stays mapped."""
    if verify:
        verify_checkpoint_files(step_path, meta)
    checked = dataclasses.replace(meta, files={})  # no second digest pass per unit
    for i, u in enumerate(meta.units):
        state = full_unit_state(step_path, checked, i, {}, keys)
        yield i, state, u.params
        del state
