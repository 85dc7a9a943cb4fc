"""fsdp_baseline's OMP_NUM_THREADS, checked without torch: tools/fsdp_baseline.py checks it before
torch loads the OpenMP runtime (libgomp prints its own complaint about a bad value as it loads)."""

from __future__ import annotations

import os

from ..config.options import ConfigError
from ..safe_files import excerpt

MAX_THREADS = 4096


def omp_threads(env=None) -> int:
    """OMP_NUM_THREADS (default 1): a whole number of threads in ASCII digits, 1..MAX_THREADS."""
    env = os.environ if env is None else env
    text = env.get("OMP_NUM_THREADS")
    if text is None:
        return 1
    t = text.strip()
    if not (t.isascii() and t.isdigit() and len(t) <= 6 and 1 <= int(t) <= MAX_THREADS):
        raise ConfigError(
            f"OMP_NUM_THREADS={excerpt(text, 24)} is not a number of threads; valid: a whole number "
            f"1..{MAX_THREADS} in ASCII digits (or unset: 1)"
        )
    return int(t)


def quiet_rank() -> bool:
    """Every rank reaches the same verdict from the same files and environment: rank 0 says it."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) != "0"


def check_before_torch() -> int:
    """0, or the exit status after the one ``error:`` line (rank 0 prints it) for a bad OMP_NUM_THREADS."""
    try:
        omp_threads()
    except ConfigError as e:
        if not quiet_rank():
            from ..error_lines import emit

            emit("error", str(e))
        return 2
    return 0
