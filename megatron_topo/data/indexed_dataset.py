"""GPT-NeoX / Megatron-LM memory-mapped indexed dataset (``.bin`` + ``.idx``, "MMIDIDX").

``PREFIX.bin`` is every sequence's tokens back to back in one dtype. ``PREFIX.idx`` is, all
little-endian::

    b"MMIDIDX\\x00\\x00"          9 bytes magic
    <Q version                     1
    <B dtype code                  DTYPES below (GPT-NeoX's codes)
    <Q number of sequences         n
    <Q len(doc_idx)                number of documents + 1
    int32[n]  sizes                tokens per sequence
    int64[n]  pointers             byte offset of each sequence in the .bin
    int64[d]  doc_idx              doc_idx[k] = first sequence of document k; doc_idx[-1] = n

Files written by our preprocessing have one sequence per document (doc_idx = 0..n).
Reading never loads the files: arrays are views of ``mmap`` objects.
"""

from __future__ import annotations

import array
import mmap
import os
import struct
from typing import Optional

import numpy as np

from ..atomic import remove_quietly, temp_name
from ..safe_files import why_not_a_file
from .errors import DataError
from .pair_commit import commit_pair, finish_interrupted, hold_writer_lock, journal_path, release_writer_lock

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float32, 7: np.float64, 8: np.uint16}
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, len(doc_idx): 34 bytes
_VERIFY_CHUNK = 1 << 22


def dtype_code(dtype) -> int:
    for code, dt in DTYPES.items():
        if np.dtype(dt) == np.dtype(dtype):
            return code
    raise DataError(
        f"dtype {np.dtype(dtype)} has no MMIDIDX code; valid: " + ", ".join(np.dtype(d).name for d in DTYPES.values())
    )


def best_fitting_dtype(vocab_size: Optional[int]):
    """GPT-NeoX's rule: uint16 when the vocabulary has fewer than 65500 ids, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def data_file_path(prefix: str) -> str:
    return prefix + ".bin"


def index_file_path(prefix: str) -> str:
    return prefix + ".idx"


def strip_suffix(path: str) -> str:
    """Accept ``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx`` and return ``PREFIX``."""
    for suffix in (".bin", ".idx"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def dataset_exists(prefix: str) -> bool:
    finish_interrupted(prefix)
    return os.path.isfile(index_file_path(prefix)) and os.path.isfile(data_file_path(prefix))


def _map(path: str):
    """Read-only mmap of a whole file (None for an empty file, which mmap cannot map)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class MMapIndexedDataset:
    """Read-only view of a ``.bin``/``.idx`` pair. ``ds[i]`` is sequence ``i`` (a numpy view)."""

    def __init__(self, prefix: str, verify: bool = True):
        self.prefix = strip_suffix(prefix)
        self._open(verify)

    # ------------------------------------------------------------------ opening and checking
    def _open(self, verify: bool) -> None:
        finish_interrupted(self.prefix)  # a replacement a crash interrupted is completed first
        idx_path, bin_path = index_file_path(self.prefix), data_file_path(self.prefix)
        for path in (idx_path, bin_path):
            if not os.path.isfile(path):
                raise DataError(
                    f"{path}: {why_not_a_file(path)} (a dataset is PREFIX.bin + PREFIX.idx, e.g. "
                    f"data/pile_text_document)"
                )
        idx_size = os.path.getsize(idx_path)
        with open(idx_path, "rb") as f:
            head = f.read(HEADER.size)
        if not MAGIC.startswith(head[: len(MAGIC)]):
            raise DataError(
                f"{idx_path}: wrong magic {head[: len(MAGIC)]!r}; expected {MAGIC!r} "
                f"(a GPT-NeoX/Megatron MMIDIDX index)"
            )
        if len(head) < HEADER.size:
            raise DataError(f"{idx_path}: truncated index: {idx_size} bytes, the header alone is {HEADER.size} bytes")
        _, version, code, n_seq, n_doc_idx = HEADER.unpack(head)
        if version != VERSION:
            raise DataError(f"{idx_path}: index version {version} is not supported; valid: {VERSION}")
        if code not in DTYPES:
            raise DataError(
                f"{idx_path}: unknown dtype code {code}; valid: "
                + ", ".join(f"{c} ({np.dtype(d).name})" for c, d in DTYPES.items())
            )
        expected = HEADER.size + n_seq * 12 + n_doc_idx * 8
        if idx_size < expected:
            raise DataError(
                f"{idx_path}: truncated index: {idx_size} bytes, the header promises "
                f"{n_seq} sequences and {n_doc_idx} doc_idx entries = {expected} bytes"
            )
        if idx_size not in (expected, expected + n_seq):  # Megatron-LM multimodal adds int8 modes
            raise DataError(
                f"{idx_path}: corrupted index: {idx_size - expected} unexpected trailing "
                f"bytes after {expected} bytes of header and arrays"
            )
        if n_doc_idx < 1:
            raise DataError(f"{idx_path}: corrupted index: doc_idx is empty (it must start with 0)")
        self.dtype = np.dtype(DTYPES[code])
        self._idx_map = _map(idx_path)
        buf, off = self._idx_map, HEADER.size
        self.sizes = np.frombuffer(buf, np.int32, n_seq, off)
        self.pointers = np.frombuffer(buf, np.int64, n_seq, off + 4 * n_seq)
        self.doc_idx = np.frombuffer(buf, np.int64, n_doc_idx, off + 12 * n_seq)
        self.bin_size = os.path.getsize(bin_path)
        self._bin_map = _map(bin_path)
        if self._bin_map is not None and hasattr(mmap, "MADV_RANDOM"):
            self._bin_map.madvise(mmap.MADV_RANDOM)  # samples are random reads: no readahead
        if verify:
            self._verify()

    def _verify(self) -> None:
        """Check the arrays agree with each other and with the .bin size (in bounded chunks)."""
        idx_path, item = index_file_path(self.prefix), self.dtype.itemsize
        n = len(self.sizes)
        if self.doc_idx[0] != 0 or self.doc_idx[-1] != n:
            raise DataError(
                f"{idx_path}: corrupted index: doc_idx runs from {self.doc_idx[0]} to "
                f"{self.doc_idx[-1]}; it must run from 0 to the {n} sequences"
            )
        expect_next = 0
        for lo in range(0, n, _VERIFY_CHUNK):
            hi = min(n, lo + _VERIFY_CHUNK)
            sizes = self.sizes[lo:hi]
            if sizes.size and sizes.min() < 0:
                bad = lo + int(np.argmax(sizes < 0))
                raise DataError(f"{idx_path}: corrupted index: sequence {bad} has negative size {self.sizes[bad]}")
            ends = np.cumsum(sizes.astype(np.int64) * item) + expect_next
            starts = np.concatenate(([expect_next], ends[:-1]))
            wrong = np.flatnonzero(self.pointers[lo:hi] != starts)
            if wrong.size:
                i = lo + int(wrong[0])
                raise DataError(
                    f"{idx_path}: corrupted index: sequence {i} starts at byte "
                    f"{self.pointers[i]} but the sizes before it end at byte {starts[wrong[0]]}"
                )
            expect_next = int(ends[-1]) if ends.size else expect_next
        for lo in range(0, len(self.doc_idx), _VERIFY_CHUNK):
            d = self.doc_idx[lo : lo + _VERIFY_CHUNK + 1]
            if d.size > 1 and (np.diff(d) < 0).any():
                raise DataError(
                    f"{idx_path}: corrupted index: doc_idx is not non-decreasing near "
                    f"entry {lo + int(np.argmax(np.diff(d) < 0))}"
                )
        if self.bin_size < expect_next:
            raise DataError(
                f"{data_file_path(self.prefix)}: .bin is {self.bin_size} bytes but the index "
                f"says {n} sequences need {expect_next} bytes (truncated .bin or wrong .idx)"
            )
        if self.bin_size > expect_next:  # an .idx and .bin from two different datasets
            raise DataError(
                f"{data_file_path(self.prefix)}: .bin is {self.bin_size} bytes but the index "
                f"describes exactly {expect_next} bytes ({n} sequences of {self.dtype.name}); the .bin "
                f"and .idx come from different datasets (or the .idx is stale); re-run preprocessing"
            )

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_documents(self) -> int:
        return len(self.doc_idx) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def get(self, i: int, offset: int = 0, length: Optional[int] = None) -> np.ndarray:
        """Tokens ``[offset, offset+length)`` of sequence ``i`` (a read-only view, no copy)."""
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"{self.prefix}: tokens [{offset}, {offset + length}) out of range for sequence {i} of {size} tokens"
            )
        if length == 0:
            return np.empty(0, self.dtype)
        start = int(self.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin_map, self.dtype, length, start)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"{self.prefix}: sequence {i} out of range ({len(self)} sequences)")
        return self.get(i % len(self))

    def document(self, k: int) -> np.ndarray:
        """All tokens of document ``k`` (its sequences concatenated)."""
        if not 0 <= k < self.num_documents:
            raise IndexError(f"{self.prefix}: document {k} out of range ({self.num_documents} documents)")
        lo, hi = int(self.doc_idx[k]), int(self.doc_idx[k + 1])
        parts = [self.get(i) for i in range(lo, hi)]
        return np.concatenate(parts) if parts else np.empty(0, self.dtype)

    def token_id_range(self, chunk_bytes: int = 1 << 24, progress=None) -> tuple[int, int]:
        """(smallest, largest) token id in the .bin, read in chunks with plain reads so the
        mapping stays cold (scanning never grows resident memory). (0, -1) when empty."""
        item, total = self.dtype.itemsize, self.num_tokens * self.dtype.itemsize
        low = high = None
        done = 0
        buf = bytearray(max(item, chunk_bytes - chunk_bytes % item))
        with open(data_file_path(self.prefix), "rb", buffering=0) as f:
            while done < total:
                got = f.readinto(memoryview(buf)[: min(len(buf), total - done)])
                if not got:
                    break
                arr = np.frombuffer(buf, self.dtype, got // item)
                if arr.size:
                    lo, hi = arr.min(), arr.max()
                    low = lo if low is None or lo < low else low
                    high = hi if high is None or hi > high else high
                done += got
                if progress is not None:
                    progress(got)
        return (0, -1) if high is None else (int(low), int(high))

    # ------------------------------------------------------------------ pickling (DataLoader workers)
    def __getstate__(self):
        return {"prefix": self.prefix}

    def __setstate__(self, state):
        self.prefix = state["prefix"]
        self._open(verify=False)


class MMapIndexedDatasetBuilder:
    """Streams sequences to ``PREFIX.bin``; ``finalize()`` writes ``PREFIX.idx`` and publishes both.

    Both files are written under temporary names, fsynced, then renamed (.bin first, .idx last),
    so a failed run never overwrites an existing dataset. ``abort()`` removes the temporaries.
    Use as a context manager: leaving the block by an exception aborts.
    """

    def __init__(self, prefix: str, dtype=np.uint16):
        self.prefix = strip_suffix(prefix)
        self.dtype = np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        os.makedirs(os.path.dirname(os.path.abspath(self.prefix)), exist_ok=True)
        # an interrupted replacement is completed first, and a PREFIX.replacing that is not ours is
        # refused as every reader refuses it (commit_pair would overwrite it without a word)
        finish_interrupted(self.prefix)
        self._bin_tmp = temp_name(data_file_path(self.prefix))
        self._idx_tmp = temp_name(index_file_path(self.prefix))
        self._bin = open(self._bin_tmp, "wb")
        self._lock = hold_writer_lock(self._bin_tmp)  # dropped by the kernel if this process dies
        self._sizes = array.array("q")
        self._doc_idx = array.array("q", [0])
        self.num_tokens = 0

    def add_item(self, tokens) -> None:
        """Append one sequence (tokens already in range for the dtype)."""
        arr = np.asarray(tokens)
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)
        self.num_tokens += arr.size

    def add_raw(self, data: bytes, lengths) -> None:
        """Append several sequences given as raw bytes in ``self.dtype`` plus their lengths."""
        self._bin.write(data)
        self._sizes.frombytes(np.asarray(lengths, np.int64).tobytes())
        self.num_tokens += len(data) // self.dtype.itemsize

    def end_document(self) -> None:
        self._doc_idx.append(len(self._sizes))

    def add_document(self, tokens) -> None:
        self.add_item(tokens)
        self.end_document()

    def add_documents(self, data: bytes, lengths) -> None:
        """Many one-sequence documents at once (the preprocessing fast path)."""
        start = len(self._sizes)
        self.add_raw(data, lengths)
        self._doc_idx.extend(range(start + 1, len(self._sizes) + 1))

    @property
    def num_documents(self) -> int:
        return len(self._doc_idx) - 1

    def finalize(self) -> None:
        sizes = np.frombuffer(self._sizes, np.int64) if len(self._sizes) else np.zeros(0, np.int64)
        if sizes.size and sizes.max() > np.iinfo(np.int32).max:
            raise DataError(f"{self.prefix}: a sequence of {sizes.max()} tokens exceeds the int32 size field")
        pointers = np.zeros(sizes.size, np.int64)
        if sizes.size > 1:
            np.cumsum(sizes[:-1] * self.dtype.itemsize, out=pointers[1:])
        doc_idx = np.frombuffer(self._doc_idx, np.int64)
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        with open(self._idx_tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, self._code, sizes.size, doc_idx.size))
            f.write(sizes.astype("<i4").tobytes())
            f.write(pointers.astype("<i8").tobytes())
            f.write(doc_idx.astype("<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())
        commit_pair(self.prefix, self._bin_tmp, self._idx_tmp)  # journalled: never a new .bin with an old .idx
        release_writer_lock(self._lock)
        self._lock = None

    def abort(self) -> None:
        if not self._bin.closed:
            self._bin.close()
        release_writer_lock(self._lock)
        self._lock = None
        if os.path.lexists(journal_path(self.prefix)):  # the switch began: the next reader completes it
            return
        remove_quietly(self._bin_tmp)
        remove_quietly(self._idx_tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False
