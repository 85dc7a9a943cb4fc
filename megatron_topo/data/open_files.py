"""The files a list of datasets keeps open, checked against the process's open-file limit before
any is opened.

Every dataset keeps its ``.bin`` and ``.idx`` memory-mapped (a mapping holds a file descriptor),
every index of a split of it its three cached arrays, and a blend its two. A list of thousands of
distinct prefixes would otherwise end, thousands of files in, in ``OSError: Too many open files``.
The soft limit is raised towards the hard limit when that is enough (as a user's ``ulimit -n``
would); otherwise one ``error:`` line names the count and the limit.
"""

from __future__ import annotations

import os
from typing import Optional

from .errors import DataError

FILES_PER_DATASET = 2  # PREFIX.bin and PREFIX.idx mappings
FILES_PER_INDEX = 3  # doc_idx, sample_idx, shuffle_idx
FILES_PER_BLEND = 2  # dataset_index, dataset_sample_index
HEADROOM = 256  # the rest of a run: checkpoints, metrics, TensorBoard, the collectives' sockets


def same_file_key(prefix: str) -> str:
    """One key per dataset on disk: ``data/x``, ``./data/x`` and a path through a symlinked
    folder name the same files."""
    return os.path.realpath(prefix)


def _open_now() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _limits() -> Optional[tuple[int, int]]:
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None


def _raise_soft(need: int, hard: int) -> bool:
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (OSError, ValueError):
        return False
    return True


def files_needed(plans) -> tuple[int, int, int]:
    """(distinct datasets, distinct split indices, open files they and their blends keep) of
    ``plans``: (split name, prefixes, weights, samples per prefix, samples) per split."""
    datasets, indices, blends = set(), set(), 0
    for name, prefixes, _weights, counts, _n in plans:
        for p, c in zip(prefixes, counts):
            key = same_file_key(p)
            datasets.add(key)
            indices.add((key, name, c))
        blends += len(prefixes) > 1
    files = FILES_PER_DATASET * len(datasets) + FILES_PER_INDEX * len(indices) + FILES_PER_BLEND * blends
    return len(datasets), len(indices), files


def check_open_files(plans, limits: Optional[tuple[int, int]] = None) -> None:
    """DataError (one line) when the datasets of ``plans`` need more open files than this process
    may hold, after raising the soft limit up to the hard one where that suffices."""
    n_data, n_index, files = files_needed(plans)
    limits = limits or _limits()
    if limits is None:
        return
    soft, hard = limits
    need = _open_now() + files + HEADROOM
    unlimited = getattr(__import__("resource"), "RLIM_INFINITY", -1)
    if soft == unlimited or need <= soft:
        return
    if (hard == unlimited or need <= hard) and _raise_soft(need, hard):
        return
    keys = ", ".join(f"{name}_data_paths" for name, *_ in plans)
    raise DataError(
        f"{keys}: {n_data:,} distinct datasets ({n_index:,} split indices) keep {files:,} files open "
        f"({FILES_PER_DATASET} per dataset, {FILES_PER_INDEX} per index), more than this process's open-file "
        f"limit {hard if hard != unlimited else soft:,} allows with {HEADROOM} to spare; raise it (ulimit -n) "
        f"or merge datasets into fewer prefixes (tools/preprocess_data.py)"
    )
