"""Cached index arrays: ``NAME_{array}.npy`` files plus ``NAME.json`` holding the parameters.

The JSON is written last (and removed first when rebuilding), so a matching JSON means the
arrays beside it are complete. Everything is written atomically. Cached arrays are loaded
memory-mapped.

The JSON also records each array file's SHA-256 and identity (size, inode, mtime, ctime) at build.
A file whose identity still matches is unchanged since the build (any write changes its ctime,
which no user call can set back); one whose identity differs (a copied cache, an edited or
replaced file) is hashed, and a hash that differs, or an unreadable file, has the builder rebuild
the cache with one ``warning:`` line: the cache is derived from the data, and an edited index
would otherwise be trained on (in-range values) or fail deep in a step (out-of-range ones).
A small JSON record (``get_json``: the token-id range) carries the SHA-256 of its parameters and
value the same way: an edited value is computed again with one ``warning:`` line.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Callable, Optional

import numpy as np

from ..safe_files import NotAFile, NotJSON, OverCap, _kind, parse_json, read_capped
from .atomic import remove_quietly, save_json, save_npy
from .errors import DataError


def short_hash(obj, n: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:n]


MAX_RECORD_BYTES = 16 << 20  # a NAME.json record: parameters and a small value, far below this


def _read_json(path: str) -> Optional[dict]:
    """The JSON record at ``path``, or None (then rebuilt, where this process builds): missing,
    unreadable, not JSON, larger than MAX_RECORD_BYTES, or not a regular file. Read non-blocking and
    capped, so a FIFO or /dev/zero put there is neither waited on nor read into memory."""
    try:
        return parse_json(read_capped(path, MAX_RECORD_BYTES))
    except FileNotFoundError:
        return None
    except NotAFile as e:
        _warn(f"cache {path} is {_kind(e.mode)}, not a file: building the record again")
    except OverCap:
        _warn(f"cache {path} is over {MAX_RECORD_BYTES:,} bytes, not a record of ours: building it again")
    except (OSError, NotJSON):
        pass
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
        why = "missing" if stored is None else "stale (built for other parameters)"
        if isinstance(stored, dict) and stored.get("params") == params and all(os.path.isfile(p) for p in npy.values()):
            arrays, bad, moved = self._load_verified(json_path, stored.get("files"), npy)
            if bad is None:
                if moved and self.may_build:  # a copied cache: record where its verified files are now
                    save_json(json_path, {"params": params, "files": _records(npy)})
                return arrays
            why = f"damaged ({bad})"
            if self.may_build:
                _warn(f"index cache {bad}: rebuilding it (the cache is derived from the data)")
        if not self.may_build:
            raise DataError(
                f"{json_path}: index cache {why} after the barrier; the builder process "
                f"(is_builder=True) builds it, in a data_cache_dir that every process shares"
            )
        os.makedirs(self.directory, exist_ok=True)
        remove_quietly(json_path)
        arrays = build()
        for k, p in npy.items():
            save_npy(p, np.ascontiguousarray(arrays[k]))
        save_json(json_path, {"params": params, "files": _records(npy)})
        return {k: np.load(p, mmap_mode="r") for k, p in npy.items()}

    @staticmethod
    def _load_verified(json_path: str, records, npy: dict) -> tuple[Optional[dict], Optional[str], bool]:
        """(arrays, None, whether any file moved) when every file is the one recorded at build;
        (None, what differs, _) otherwise."""
        if not isinstance(records, dict) or set(records) != set(npy):
            return None, f"{json_path}: no record of its array files", False
        moved = False
        for k, p in npy.items():
            rec = records[k]
            if not isinstance(rec, dict):
                return None, f"{p}: no record", False
            try:
                same = _identity(p) == {f: rec.get(f) for f in _IDENTITY}
                if not same:
                    moved = True
                    if _sha256(p) != rec.get("sha256"):
                        return None, f"{p} differs from the file built (its SHA-256 is not the recorded one)", False
            except OSError as e:
                return None, f"{p}: {e.strerror or e}", False
        try:
            return {k: np.load(p, mmap_mode="r") for k, p in npy.items()}, None, moved
        except (OSError, ValueError) as e:
            return None, f"unreadable array ({str(e)[:80]})", False

    def get_json(self, name: str, params: dict, build: Callable[[], dict]) -> dict:
        """A small computed record (e.g. token id range) cached as ``NAME.json``, with the SHA-256
        of its parameters and value: a value edited since is computed again (one ``warning:``)."""
        params = json.loads(json.dumps(params))
        path = os.path.join(self.directory, name + ".json")
        stored = _read_json(path)
        why = "missing" if stored is None else "stale (built for other parameters)"
        if isinstance(stored, dict) and stored.get("params") == params and "sha256" in stored:
            if stored["sha256"] == _record_sha(params, stored.get("value")):
                return stored["value"]
            why = "damaged (its value is not the one recorded)"
            if self.may_build:
                _warn(f"cache {path}: its value differs from the one computed (SHA-256): computing it again")
        if not self.may_build:
            raise DataError(
                f"{path}: cache {why} after the barrier; the builder process (is_builder=True) "
                f"writes it, in a data_cache_dir that every process shares"
            )
        value = build()
        os.makedirs(self.directory, exist_ok=True)
        save_json(path, {"params": params, "value": value, "sha256": _record_sha(params, value)})
        return value


def _record_sha(params, value) -> str:
    return hashlib.sha256(json.dumps([params, value], sort_keys=True).encode()).hexdigest()


_IDENTITY = ("bytes", "inode", "mtime_ns", "ctime_ns")
_HASH_CHUNK = 1 << 22


def _identity(path: str) -> dict:
    st = os.stat(path)
    return {"bytes": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _sha256(path: str) -> str:
    """SHA-256 of a regular file (a FIFO or device in its place is not opened: OSError)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        import stat

        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(0, "not a regular file")
        h = hashlib.sha256()
        for block in iter(lambda: f.read(_HASH_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _records(npy: dict) -> dict:
    """What identifies each array file as built: its SHA-256 and identity."""
    return {k: {"sha256": _sha256(p), **_identity(p)} for k, p in npy.items()}


def _warn(msg: str) -> None:
    from ..error_lines import clean

    print(clean(f"warning: {msg}"), file=sys.stderr, flush=True)


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
