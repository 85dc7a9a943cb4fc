"""Cached index arrays: ``NAME_{array}.npy`` files plus ``NAME.json`` holding the parameters.

The JSON is written last (and removed first when rebuilding), so a matching JSON means the
arrays beside it are complete. Everything is written atomically. Cached arrays are loaded
memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Optional

import numpy as np

from .atomic import remove_quietly, save_json, save_npy
from .errors import DataError


def short_hash(obj, n: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:n]


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class IndexCache:
    """``get(name, params, build)``: the cached arrays when their JSON matches ``params``, else
    (builder only) build, save and return them."""

    def __init__(self, directory: str, may_build: bool = True):
        self.directory = directory
        self.may_build = may_build

    def paths(self, name: str, keys) -> tuple[str, dict]:
        base = os.path.join(self.directory, name)
        return base + ".json", {k: f"{base}_{k}.npy" for k in keys}

    def get(self, name: str, params: dict, keys: tuple[str, ...], build: Callable[[], dict]) -> dict[str, np.ndarray]:
        params = json.loads(json.dumps(params))  # normalise tuples -> lists, as read back
        json_path, npy = self.paths(name, keys)
        stored = _read_json(json_path)
        if stored == params and all(os.path.isfile(p) for p in npy.values()):
            try:
                return {k: np.load(p, mmap_mode="r") for k, p in npy.items()}
            except (OSError, ValueError):
                pass  # damaged cache file: rebuild
        if not self.may_build:
            why = "missing" if stored is None else "stale (built for other parameters)"
            raise DataError(
                f"{json_path}: index cache {why} after the barrier; the builder process "
                f"(is_builder=True) builds it, in a data_cache_dir that every process shares"
            )
        os.makedirs(self.directory, exist_ok=True)
        remove_quietly(json_path)
        arrays = build()
        for k, p in npy.items():
            save_npy(p, np.ascontiguousarray(arrays[k]))
        save_json(json_path, params)
        return {k: np.load(p, mmap_mode="r") for k, p in npy.items()}

    def get_json(self, name: str, params: dict, build: Callable[[], dict]) -> dict:
        """A small computed record (e.g. token id range) cached as ``NAME.json``."""
        params = json.loads(json.dumps(params))
        path = os.path.join(self.directory, name + ".json")
        stored = _read_json(path)
        if stored is not None and stored.get("params") == params:
            return stored["value"]
        if not self.may_build:
            why = "missing" if stored is None else "stale (built for other parameters)"
            raise DataError(
                f"{path}: cache {why} after the barrier; the builder process (is_builder=True) "
                f"writes it, in a data_cache_dir that every process shares"
            )
        value = build()
        os.makedirs(self.directory, exist_ok=True)
        save_json(path, {"params": params, "value": value})
        return value


class MappedArrays:
    """Mixin: attributes named in ``self._mapped`` (attribute -> .npy path) are memory-mapped cache
    files; pickling (DataLoader workers) sends the paths and re-maps them instead of copying."""

    _mapped: dict = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in state.get("_mapped") or {}:
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        for k, path in (state.get("_mapped") or {}).items():
            setattr(self, k, np.load(path, mmap_mode="r"))
