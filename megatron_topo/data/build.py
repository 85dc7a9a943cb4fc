"""``build_datasets``: the trainer's entry point (train/valid/test datasets from a DataConfig)."""

from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from .blending import BlendedDataset, normalize_weights, samples_per_dataset
from .builtin import DEFAULT_MAX_BYTES, ensure_builtin_corpus
from .cache import IndexCache, short_hash
from .errors import DataError
from .gpt_dataset import GPTDataset, data_fingerprint, split_ranges
from .indexed_dataset import MMapIndexedDataset, dataset_exists, strip_suffix
from .open_files import check_open_files, same_file_key

DEFAULT_CACHE_DIR = "data_cache"
SPLIT_NAMES = ("train", "valid", "test")
_SCAN_PROGRESS_BYTES = 1 << 30


def build_datasets(
    data_cfg,
    *,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    vocab_size: int,
    is_builder: bool = True,
    barrier: Optional[Callable[[], None]] = None,
):
    """Train, valid and test datasets (None where a split is empty, has no paths or 0 samples).

    Each has ``__len__`` and ``__getitem__(i) -> np.ndarray[int64]`` of ``seq_length + 1`` tokens,
    deterministic in (paths, split, seed, seq_length, num_samples). ``train_data_paths`` (blended
    with ``train_data_weights``) and ``valid/test_data_paths`` take precedence over ``data_path``
    (one prefix, or "builtin", cut by ``split``). Only the ``is_builder`` process builds the
    built-in corpus and the index caches; with ``barrier`` given, every process calls it exactly
    once: the builder after building, the others before loading.
    """
    if len(num_samples) != 3 or any(int(n) < 0 for n in num_samples):
        raise DataError(f"num_samples {tuple(num_samples)}: expected 3 non-negative counts (train, valid, test)")
    args = (data_cfg, seq_length, seed, tuple(int(n) for n in num_samples), vocab_size)
    if barrier is None:
        return _build(*args, may_build=is_builder)
    if not is_builder:
        barrier()
        return _build(*args, may_build=False)
    try:
        result = _build(*args, may_build=True)
    except BaseException:
        try:  # release the waiting processes; they then fail on the missing cache instead of hanging
            barrier()
        except Exception:
            pass
        raise
    barrier()
    return result


def _build(cfg, seq_length, seed, num_samples, vocab_size, may_build: bool):
    cache_dir = cfg.data_cache_dir or DEFAULT_CACHE_DIR
    cache = IndexCache(os.path.join(cache_dir, "index"), may_build)
    # one mapping per distinct dataset, one index per distinct (dataset, split, samples): a list
    # naming a prefix many times opens it once (as many GPTDatasets would give the same samples)
    opened: dict[str, MMapIndexedDataset] = {}
    fingerprints: dict[str, dict] = {}
    built: dict[tuple, GPTDataset] = {}

    def open_dataset(prefix: str) -> MMapIndexedDataset:
        key = same_file_key(prefix)
        if key not in opened:
            opened[key] = _open_checked(prefix, vocab_size, cache)
        return opened[key]

    def fingerprint(prefix: str) -> dict:
        key = same_file_key(prefix)
        if key not in fingerprints:
            fingerprints[key] = data_fingerprint(open_dataset(prefix))
        return fingerprints[key]

    def gpt(name, prefix, doc_range, n):
        key = (same_file_key(prefix), name, tuple(doc_range), n)
        if key not in built:
            built[key] = GPTDataset(name, open_dataset(prefix), doc_range, n, seq_length, seed, cache)
        return built[key]

    if cfg.train_data_paths:
        out = []
        path_lists = (cfg.train_data_paths, cfg.valid_data_paths, cfg.test_data_paths)
        plans = []
        for k, (name, paths, n) in enumerate(zip(SPLIT_NAMES, path_lists, num_samples)):
            if not paths or n == 0:
                plans.append(None)
                continue
            weights = cfg.train_data_weights if k == 0 else None
            weights = normalize_weights(weights, len(paths), f"{name}_data_weights")
            prefixes = [strip_suffix(p) for p in paths]
            counts = [n] if len(prefixes) == 1 else samples_per_dataset(weights, n)
            plans.append((name, prefixes, weights, counts, n))
        check_open_files([p for p in plans if p is not None])  # before anything is opened
        for plan in plans:
            if plan is None:
                out.append(None)
                continue
            name, prefixes, weights, counts, n = plan
            if len(prefixes) == 1:
                out.append(gpt(name, prefixes[0], (0, len(open_dataset(prefixes[0]))), n))
                continue
            parts = [gpt(name, p, (0, len(open_dataset(p))), c) for p, c in zip(prefixes, counts)]
            key = {
                "seq_length": seq_length,
                "seed": seed,
                "datasets": [[os.path.abspath(p), fingerprint(p)] for p in prefixes],
            }
            out.append(BlendedDataset(name, parts, weights, n, cache, key))
        return tuple(out)

    if cfg.data_path is None:
        raise DataError(
            "data_path: no data given; set data_path (a PREFIX of PREFIX.bin/.idx, or 'builtin') or train_data_paths"
        )
    if cfg.data_path == "builtin":
        prefix = ensure_builtin_corpus(
            cache_dir,
            cfg.tokenizer_type,
            cfg.vocab_file,
            getattr(cfg, "builtin_corpus_bytes", DEFAULT_MAX_BYTES),
            may_build,
        )
    else:
        prefix = strip_suffix(cfg.data_path)
    ds = open_dataset(prefix)
    ranges = split_ranges(cfg.split, len(ds))
    if num_samples[0] > 0 and ranges[0][1] <= ranges[0][0]:
        raise DataError(
            f"{prefix}: split '{cfg.split}' gives the train split 0 of the {len(ds)} documents; "
            f"raise the first share (e.g. 949,50,1) or add data"
        )
    return tuple(
        None if end <= start or n == 0 else gpt(name, prefix, (start, end), n)
        for name, (start, end), n in zip(SPLIT_NAMES, ranges, num_samples)
    )


def _open_checked(prefix: str, vocab_size: int, cache: IndexCache) -> MMapIndexedDataset:
    if not dataset_exists(prefix) and dataset_exists(prefix + "_text_document"):
        raise DataError(
            f"{prefix}.idx: file not found; did you mean {prefix}_text_document "
            f"(preprocessing writes PREFIX_text_document.bin/.idx)?"
        )
    ds = MMapIndexedDataset(prefix)
    if ds.dtype.kind not in "iu":
        raise DataError(f"{prefix}.idx: dtype {ds.dtype.name} cannot hold token ids; expected an integer dtype")
    if ds.num_tokens == 0:
        raise DataError(f"{prefix}: the dataset has no tokens (empty input)")
    check_token_range(ds, vocab_size, cache)
    return ds


def check_token_range(ds: MMapIndexedDataset, vocab_size: int, cache: Optional[IndexCache]) -> None:
    """Every token id must lie in [0, vocab_size). The scan is cached per dataset contents; it is
    skipped where the dtype cannot hold an id that large."""
    if ds.dtype.kind == "u" and np.iinfo(ds.dtype).max < vocab_size:
        return

    def scan():
        from tqdm import tqdm

        total = ds.num_tokens * ds.dtype.itemsize
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"checking {os.path.basename(ds.prefix)}",
            disable=total < _SCAN_PROGRESS_BYTES,
        ) as bar:
            return list(ds.token_id_range(progress=bar.update))

    # keyed on the files' identity (size, inode, mtime, ctime, sampled digest): a .bin rewritten in
    # place at the same size is scanned again, so out-of-vocabulary ids never reach training
    params = {"prefix": os.path.abspath(ds.prefix), "data": data_fingerprint(ds)}
    if cache is None:
        low, high = scan()
    else:
        name = f"{os.path.basename(ds.prefix)}_{short_hash(params['prefix'], 8)}_token_range"
        low, high = cache.get_json(name, params, scan)
    if high >= vocab_size:
        raise DataError(
            f"{ds.prefix}: token id {high} is >= vocab_size {vocab_size}; preprocess with the "
            f"model's tokenizer or raise vocab_size above {high}"
        )
    if low < 0:
        raise DataError(f"{ds.prefix}: token id {low} is negative; valid ids are 0..{vocab_size - 1}")
