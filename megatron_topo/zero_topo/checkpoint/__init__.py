"""Sharded checkpoints: each rank writes its optimizer shards with their ranges in the global flat
buffers; loading rebuilds any rank's shards from any other plan or world size.

* :mod:`.storage`  the on-disk format and its durability (names, atomic writes, digests, reading and
                   verifying ``meta.json`` and rank files, cleanup, pruning, path checks);
* :mod:`.live`     the collective save and the load into an engine, with the compatibility and
                   resume checks;
* :mod:`.meta_schema` ``meta.json`` typed (:class:`Meta`), validated on read, written by the save;
* :mod:`.offline`  readers for one process without an engine (a unit's state, the full state, the
                   saved config).

Functions reach ``storage`` through the module (``storage.load_rank_file``), so a test that
replaces one of its functions patches ``checkpoint.storage``.
"""

from __future__ import annotations

from .live import architecture_diff, check_compatible, check_resume, gather_full_state, load, save, unit_table
from .meta_schema import FileRecord, Meta, ParamRecord, TrainerState, UnitRecord
from .offline import full_unit_state, load_model_config, read_config_yaml, read_full_state, unit_state_range
from .storage import (
    ARCH_KEYS,
    FORMAT_VERSION,
    LATEST,
    STATE_KEYS,
    SUPPORTED_FORMATS,
    CheckpointError,
    check_output_outside,
    check_save_dir,
    file_digest,
    holds_checkpoints,
    load_rank_file,
    rank_file,
    read_meta,
    resolve,
    step_dir,
)
from .storage import _atomic_write_bytes as _atomic_write_bytes
from .storage import _remove_quietly as _remove_quietly
from .storage import _shard_tensors as _shard_tensors

__all__ = [
    "ARCH_KEYS",
    "FORMAT_VERSION",
    "architecture_diff",
    "LATEST",
    "STATE_KEYS",
    "SUPPORTED_FORMATS",
    "CheckpointError",
    "FileRecord",
    "Meta",
    "ParamRecord",
    "TrainerState",
    "UnitRecord",
    "check_compatible",
    "check_output_outside",
    "check_resume",
    "check_save_dir",
    "file_digest",
    "full_unit_state",
    "gather_full_state",
    "holds_checkpoints",
    "load",
    "load_model_config",
    "load_rank_file",
    "rank_file",
    "read_config_yaml",
    "read_full_state",
    "read_meta",
    "resolve",
    "save",
    "step_dir",
    "unit_state_range",
    "unit_table",
]
