"""Atomic file output: write under a temporary name in the same directory, fsync, then rename.

A failed or interrupted write never replaces (or half-replaces) what is already on disk.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Iterator

import numpy as np


def temp_name(path: str) -> str:
    """A sibling temporary name unique to this process (same filesystem, so rename is atomic)."""
    return f"{path}.tmp.{os.getpid()}"


def fsync_dir(directory: str) -> None:
    """Persist a rename: fsync the directory entry (best effort where unsupported)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: str, path: str) -> None:
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


@contextmanager
def atomic_open(path: str, mode: str = "wb") -> Iterator:
    """``with atomic_open(p) as f: f.write(...)`` -> ``p`` appears complete or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        commit(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def save_npy(path: str, array: np.ndarray) -> None:
    with atomic_open(path) as f:
        np.save(f, array, allow_pickle=False)


def save_json(path: str, obj) -> None:
    with atomic_open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
