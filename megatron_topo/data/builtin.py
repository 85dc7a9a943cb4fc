"""The built-in default corpus: the Python standard library's own ``*.py`` files.

Needs no download. Files are taken in sorted relative-path order (``site-packages`` excluded)
until ``max_bytes`` of source, one document per file, tokenized by the regular preprocessing
pipeline (ByteLevel by default, an EOD id after each file) into
``{cache_dir}/builtin_stdlib_{hash}_text_document.bin/.idx``. The hash covers the Python version,
the files' contents, the cap and the tokenizer, so a different interpreter or tokenizer gets its
own cache entry. Built once (atomically, by the builder process), reused afterwards.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig

from .errors import DataError
from .indexed_dataset import dataset_exists
from .preprocess import output_prefix_for, preprocess
from .tokenizer import build_tokenizer

DEFAULT_MAX_BYTES = 4_000_000
FORMAT_VERSION = 1
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_files(max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith(".")]
        found += [os.path.relpath(os.path.join(dirpath, f), root) for f in files if f.endswith(".py")]
    chosen, total = [], 0
    for rel in sorted(found):
        if total >= max_bytes:
            break
        path = os.path.join(root, rel)
        chosen.append(path)
        total += os.path.getsize(path)
    if not chosen:
        raise DataError(
            f"{root}: no Python source files found for the built-in corpus; set data_path "
            f"to a preprocessed dataset prefix instead"
        )
    return chosen


def builtin_prefix(
    cache_dir: str, tokenizer_type: str = "ByteLevel", vocab_file=None, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[str, list[str]]:
    """(dataset prefix, source files) of the built-in corpus for this interpreter and tokenizer."""
    files = stdlib_files(max_bytes)
    h = hashlib.sha256()
    h.update(
        repr(
            (
                FORMAT_VERSION,
                sys.version_info[:2],
                max_bytes,
                sorted(build_tokenizer(tokenizer_type, vocab_file).fingerprint().items()),
            )
        ).encode()
    )
    root = sysconfig.get_paths()["stdlib"]
    for path in files:
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    stem = os.path.join(cache_dir, f"builtin_stdlib_py{sys.version_info[0]}{sys.version_info[1]}_{h.hexdigest()[:10]}")
    return output_prefix_for(stem, "text"), files


def ensure_builtin_corpus(
    cache_dir: str,
    tokenizer_type: str = "ByteLevel",
    vocab_file=None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    may_build: bool = True,
    progress: bool = True,
) -> str:
    """Prefix of the built-in corpus dataset, building it first if needed (and allowed)."""
    prefix, files = builtin_prefix(cache_dir, tokenizer_type, vocab_file, max_bytes)
    if dataset_exists(prefix):
        return prefix
    if not may_build:
        raise DataError(
            f"{prefix}.bin/.idx: built-in corpus missing after the barrier; the builder "
            f"process (is_builder=True) builds it, in a data_cache_dir every process shares"
        )
    stem = prefix[: -len("_text_document")]
    preprocess(
        files,
        stem,
        tokenizer_type,
        vocab_file,
        keys=("text",),
        append_eod=True,
        workers=1,
        skip_bad_lines=True,
        progress=progress,
        warn=lambda msg: None,
        force=True,
    )  # its own cache entry
    return prefix
