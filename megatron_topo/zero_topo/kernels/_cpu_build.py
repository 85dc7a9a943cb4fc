"""Building the cpu_fast C library: compilers, flags, and the private, verified cache it lives in.

``compiled_libraries(errors)`` yields, in order of preference (each compiler, ``-march=native``
then portable flags), the path of a library built from ``_cpu_fast.c`` and cached under a key of
the source, the compiler, the flags and the CPU; a cached one is used only when its SHA-256 matches
the one recorded at its build (:mod:`._cache`), else it is rebuilt with one ``warning:`` line. The
cache folder must be this user's own with mode 0700 (:func:`._cache.private_dir`). Loading and the
self-check against the reference are :mod:`.cpu_fast`'s.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

from ...error_lines import clean
from . import _cache

CACHE_ENV = "MEGATRON_TOPO_KERNEL_CACHE"
CFLAGS_ENV = "MEGATRON_TOPO_KERNEL_CFLAGS"  # extra compiler flags (tests use -DMT_NO_F16C ...)
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpu_fast.c")
_BASE_FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing"]
_FLAG_SETS = (["-march=native"], [])


def _compilers():
    seen = []
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and c not in seen and shutil.which(c.split()[0]):
            seen.append(c)
    return seen


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _compiler_id(cc: str) -> str:
    try:
        r = subprocess.run(cc.split() + ["--version"], capture_output=True, text=True, timeout=30)
        return r.stdout.splitlines()[0] if r.stdout else cc
    except Exception:
        return cc


def _cache_dirs() -> list[str]:
    """$MEGATRON_TOPO_KERNEL_CACHE, else the user cache, then the temp dir (read-only homes)."""
    if os.environ.get(CACHE_ENV):
        return [os.environ[CACHE_ENV]]
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return [
        os.path.join(home, "megatron_topo", "kernels"),
        os.path.join(tempfile.gettempdir(), f"megatron_topo_kernels_{uid}"),
    ]


_warned: set = set()


def _warn(line: str) -> None:
    """One stderr line per distinct problem and process (a refused cache, a rebuilt library)."""
    if line not in _warned:
        _warned.add(line)
        print(clean(f"warning: {line}"), file=sys.stderr, flush=True)


def _private_cache() -> tuple[str | None, list[str]]:
    """The first candidate cache folder that is private to this user (see _cache.py)."""
    refused = []
    for d in _cache_dirs():
        why = _cache.private_dir(d)
        if why is None:
            return d, refused
        refused.append(f"{d} {why}")
        if os.path.lexists(d):  # someone else's folder (or one others can write): say so, once
            _warn(f"kernel cache {d} {why}; not used (nothing is loaded from it)")
    return None, refused


def compiled_libraries(errors: list[str]) -> Iterator[str]:
    """Paths of verified libraries, best first; each failed build appends its reason to ``errors``.
    Raises RuntimeError when no cache folder is private to this user."""
    with open(SRC, "rb") as f:
        src = f.read()
    cache, refused = _private_cache()
    if cache is None:
        raise RuntimeError(
            "no private kernel cache folder (" + "; ".join(refused) + "); set "
            f"{CACHE_ENV} to a folder of your own, mode 0700"
        )
    for cc in _compilers():
        cid = _compiler_id(cc)
        for extra in _FLAG_SETS:
            flags = _BASE_FLAGS + extra + os.environ.get(CFLAGS_ENV, "").split()
            key = hashlib.sha256(
                b"\0".join(
                    [src, cid.encode(), " ".join(flags).encode(), _cpu_signature().encode(), sys.platform.encode()]
                )
            ).hexdigest()[:20]
            path = os.path.join(cache, f"mt_cpu_fast_{key}.so")
            ok, why = _cache.verified(path)
            if why:
                _warn(f"cached kernel library {path} {why}; rebuilding it")
            if not ok:
                try:
                    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
                    os.close(fd)
                    r = subprocess.run(
                        cc.split() + flags + ["-o", tmp, SRC], capture_output=True, text=True, timeout=120
                    )
                    if r.returncode:
                        os.unlink(tmp)
                        errors.append(
                            f"{cc} {' '.join(extra) or '(portable)'}: {(r.stderr or r.stdout).strip()[-400:]}"
                        )
                        continue
                    _cache.write_record(path, _cache.file_sha256(tmp))  # the record first: a reader
                    os.replace(tmp, path)  # never sees a new library with no record (atomic renames)
                except Exception as e:  # unwritable cache, compiler crash, timeout
                    errors.append(f"{cc}: {e!r}")
                    continue
                ok, why = _cache.verified(path)
                if not ok:  # replaced under us (only this user can write here)
                    errors.append(f"{path}: {why or 'vanished after the build'}")
                    continue
            yield path
