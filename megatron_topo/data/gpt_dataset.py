"""Megatron's GPT dataset: fixed-length samples cut across document boundaries.

Per dataset split (a range of documents) and a requested number of samples, three index
arrays are built from ``np.random.RandomState(seed)`` exactly as Megatron-LM's legacy
``gpt_dataset.py`` does (same RNG calls, same order):

- ``doc_idx``: the split's documents repeated for as many epochs as the samples need, shuffled
  (the last epoch shuffled separately when it is used for less than 80% of its samples);
- ``sample_idx[i] = (position in doc_idx, token offset)`` where sample ``i`` starts; sample ``i``
  is the ``seq_length + 1`` tokens starting at global token ``i * seq_length`` of the
  concatenated ``doc_idx`` documents (consecutive samples share one token: inputs and labels);
- ``shuffle_idx``: a permutation of the samples.

"Documents" are the index's sequences (GPT-NeoX/Megatron semantics; one per document in the
files our preprocessing writes).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from .cache import IndexCache, MappedArrays, short_hash
from .errors import DataError
from .indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path

INDEX_VERSION = 1
LAST_EPOCH_THRESHOLD = 0.80


def parse_split(split: str) -> list[float]:
    """``"949,50,1"`` (or ``"949/50/1"``, fewer parts padded with 0) -> normalised weights; an empty
    item (``969,,30``) is refused, not skipped (it would shift the later shares)."""
    from ..cli import ascii_number, comma_items

    expect = "up to 3 non-negative numbers with a positive sum, e.g. 949,50,1"
    bad = DataError(f"split '{split}': expected {expect}")
    items = comma_items(split, "split", expect, error=DataError, seps=",/")  # 969,,30: an empty share named
    try:
        parts = [float(s) for s in items if ascii_number(s)]  # ASCII digits only: '١٠٠' is refused
    except ValueError:
        raise bad from None
    if len(parts) != len(items):
        raise bad
    if not parts or len(parts) > 3 or any(p < 0 or p != p for p in parts) or sum(parts) <= 0:
        raise bad
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def split_ranges(split: str, size: int) -> list[tuple[int, int]]:
    """Megatron's ``get_train_valid_test_split_``: [start, end) of train, valid, test."""
    weights = parse_split(split)
    index = [0]
    for w in weights:
        index.append(index[-1] + int(round(w * float(size))))
    diff = index[-1] - size
    index = [index[0]] + [i - diff for i in index[1:]]
    return [(index[k], index[k + 1]) for k in range(3)]


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest number of epochs whose tokens give ``num_samples`` samples (one token overlaps)."""
    need = num_samples * seq_length + 1
    return max(1, -(-need // tokens_per_epoch))


def build_doc_idx(documents: np.ndarray, num_epochs: int, rng, separate_last_epoch: bool) -> np.ndarray:
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.tile(np.asarray(documents, np.int64), num_epochs)
        doc_idx = doc_idx.astype(np.int32) if doc_idx.size and doc_idx.max() < 2**31 else doc_idx
        rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, num_epochs - 1, rng, False)
    last = build_doc_idx(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_idx(
    sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_samples: int, chunk: int = 1 << 24
) -> np.ndarray:
    """``(num_samples + 1, 2)`` array of (doc_idx position, offset) where each sample starts
    (the last row is where the last sample's final token lies)."""
    lengths = np.asarray(sizes)[doc_idx].astype(np.int64)
    ends = np.cumsum(lengths)
    big = ends.size >= 2**31
    out = np.empty((num_samples + 1, 2), np.int64 if big else np.int32)
    for lo in range(0, num_samples + 1, chunk):
        starts = np.arange(lo, min(num_samples + 1, lo + chunk), dtype=np.int64) * seq_length
        pos = np.searchsorted(ends, starts, side="right")
        out[lo : lo + starts.size, 0] = pos
        out[lo : lo + starts.size, 1] = starts - (ends[pos] - lengths[pos])
    return out


def build_shuffle_idx(num_samples: int, total_size: int, rng) -> np.ndarray:
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_index_mappings(
    sizes: np.ndarray, documents: np.ndarray, num_samples: int, seq_length: int, seed: int
) -> dict[str, np.ndarray]:
    tokens_per_epoch = int(np.asarray(sizes)[documents].sum(dtype=np.int64))
    num_epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    rng = np.random.RandomState(seed=seed)
    separate_last_epoch = False
    if num_epochs > 1:
        from_earlier_epochs = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        last_epoch_samples = num_samples - from_earlier_epochs
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate_last_epoch = last_epoch_samples < int(LAST_EPOCH_THRESHOLD * per_epoch)
    doc_idx = build_doc_idx(documents, num_epochs, rng, separate_last_epoch)
    total = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, total)
    first = from_earlier_epochs if separate_last_epoch else total
    shuffle_idx = build_shuffle_idx(first, total, rng)
    return {"doc_idx": doc_idx, "sample_idx": sample_idx, "shuffle_idx": shuffle_idx}


FINGERPRINT_VERSION = 2
_SAMPLE_BLOCK = 1 << 12
_SAMPLE_BLOCKS = 16


def file_identity(path: str) -> dict:
    """What identifies one file's contents without reading all of it: size, inode, mtime_ns and
    ctime_ns (any write changes ctime, which no user call can set back) plus a SHA-256 of the
    first and last 64 KiB and of 16 evenly spaced 4 KiB blocks. A file rewritten in place at the
    same size, even with its mtime restored, gets another identity."""
    import hashlib

    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = st.st_size
        spots = [0, max(0, size - (1 << 16))] + [size * k // _SAMPLE_BLOCKS for k in range(_SAMPLE_BLOCKS)]
        for i, off in enumerate(spots):
            f.seek(off)
            h.update(f.read((1 << 16) if i < 2 else _SAMPLE_BLOCK))
    return {
        "bytes": st.st_size,
        "inode": st.st_ino,
        "device": st.st_dev,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "sampled_sha256": h.hexdigest(),
    }


def data_fingerprint(ds: MMapIndexedDataset) -> dict:
    """What identifies a dataset's contents (caches are keyed on it): both files' identities."""
    return {
        "version": FINGERPRINT_VERSION,
        "idx": file_identity(index_file_path(ds.prefix)),
        "bin": file_identity(data_file_path(ds.prefix)),
        "sequences": len(ds),
        "tokens": ds.num_tokens,
        "dtype": ds.dtype.name,
    }


def index_bytes(tokens_per_epoch: int, num_documents: int, num_samples: int, seq_length: int) -> int:
    """Peak bytes of building the doc_idx / sample_idx / shuffle_idx arrays (``build_index_mappings``):
    per doc_idx entry the int64 tile, its int32 copy and the int64 document lengths
    ``build_sample_idx`` reads (20 bytes), then the sample and shuffle indices."""
    epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    total = (epochs * tokens_per_epoch - 1) // seq_length
    return epochs * num_documents * 20 + (total + 1) * 2 * 8 + total * 8


def available_memory_bytes() -> int:
    """MemAvailable (Linux) or physical memory; a large number where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_index_size(prefix: str, name: str, tokens: int, documents: int, num_samples: int, seq_length: int) -> None:
    """Fail in one line, before allocating anything, when the index arrays cannot fit in memory."""
    need = index_bytes(tokens, documents, num_samples, seq_length)
    have = available_memory_bytes()
    if need > have:
        epochs = num_epochs_needed(tokens, seq_length, num_samples)
        raise DataError(
            f"{prefix}: the {name} split needs {num_samples:,} samples of {seq_length} tokens "
            f"({epochs:,} epochs of its {tokens:,} tokens), whose index arrays take "
            f"{need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of memory available; "
            f"lower train_iters (or eval_iters) or add data"
        )


class GPTDataset(MappedArrays):
    """``ds[i]`` -> int64 array of ``seq_length + 1`` tokens; ``len(ds)`` >= ``num_samples``."""

    def __init__(
        self,
        name: str,
        indexed: MMapIndexedDataset,
        doc_range: tuple[int, int],
        num_samples: int,
        seq_length: int,
        seed: int,
        cache: Optional[IndexCache],
    ):
        self.name, self.indexed, self.seq_length = name, indexed, seq_length
        start, end = doc_range
        tokens = int(indexed.sizes[start:end].sum(dtype=np.int64))
        if tokens < 2:
            raise DataError(
                f"{indexed.prefix}: the {name} split (documents {start}..{end}) has {tokens} "
                f"tokens; a sample needs at least 2 (change split or add data)"
            )
        if num_samples < 1 or seq_length < 1:
            raise DataError(f"{name}: num_samples {num_samples} and seq_length {seq_length} must be >= 1")
        check_index_size(indexed.prefix, name, tokens, end - start, num_samples, seq_length)
        params = {
            "version": INDEX_VERSION,
            "prefix": os.path.abspath(indexed.prefix),
            "split": name,
            "documents": [start, end],
            "num_samples": num_samples,
            "seq_length": seq_length,
            "seed": seed,
            "data": data_fingerprint(indexed),
        }
        documents = np.arange(start, end, dtype=np.int64)

        def build():
            return build_index_mappings(indexed.sizes, documents, num_samples, seq_length, seed)

        keys = ("doc_idx", "sample_idx", "shuffle_idx")
        if cache is None:
            arrays = build()
        else:
            base = os.path.basename(indexed.prefix)
            tag = f"{base}_{name}_{num_samples}ns_{seq_length}sl_{seed}s_{short_hash(params['prefix'], 8)}"
            arrays = cache.get(tag, params, keys, build)
            self._mapped = cache.paths(tag, keys)[1]
        self.doc_idx, self.sample_idx, self.shuffle_idx = (arrays[k] for k in keys)

    def __len__(self) -> int:
        return len(self.shuffle_idx)

    def __getitem__(self, idx) -> np.ndarray:
        idx = int(idx)
        if not 0 <= idx < len(self):
            raise IndexError(f"{self.name} sample {idx} out of range ({len(self)} samples)")
        i = int(self.shuffle_idx[idx])
        (f, off_f), (last, off_l) = self.sample_idx[i].tolist(), self.sample_idx[i + 1].tolist()
        ds, doc_idx = self.indexed, self.doc_idx
        if f == last:
            return ds.get(int(doc_idx[f]), off_f, off_l - off_f + 1).astype(np.int64)
        parts = [ds.get(int(doc_idx[f]), off_f)]
        parts += [ds.get(int(doc_idx[k])) for k in range(f + 1, last)]
        parts.append(ds.get(int(doc_idx[last]), 0, off_l + 1))
        return np.concatenate(parts).astype(np.int64)
