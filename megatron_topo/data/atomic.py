"""Atomic output for the data pipeline: :mod:`megatron_topo.atomic` plus ``.npy`` arrays and JSON
records."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..atomic import atomic_open, commit, fsync_dir, remove_quietly, temp_name, write_json

__all__ = ["atomic_open", "commit", "fsync_dir", "remove_quietly", "save_json", "save_npy", "temp_name"]


def save_npy(path: str, array: np.ndarray) -> None:
    """Write ``array`` as a ``.npy`` file, atomically (no pickled objects)."""
    with atomic_open(path) as f:
        np.save(f, array, allow_pickle=False)


def save_json(path: str, obj: Any) -> None:
    """Write ``obj`` as sorted, indented JSON with a trailing newline, atomically."""
    write_json(path, obj, indent=1, sort_keys=True)
