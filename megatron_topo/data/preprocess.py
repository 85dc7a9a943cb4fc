"""Corpus -> ``{PREFIX}_{key}_document.bin/.idx`` (GPT-NeoX's preprocess_data.py, in parallel).

Sources, in the order given (each ``--input`` may be a comma-separated list, as in GPT-NeoX):

- ``.jsonl`` / ``.json`` / ``.ndjson`` lines, optionally ``.zst`` (the Pile), ``.gz`` or ``.xz``;
- ``.parquet`` files (pyarrow, read in record batches) and ``.arrow`` files (HF ``datasets``);
- a folder written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict: ``hf_split``);
- other files: plain text, one document per file; other folders: every non-hidden file in them;
- ``hf_dataset``: anything ``datasets.load_dataset`` opens: a hub name (streamed), or a builder
  (``json``/``parquet``/``arrow``/``csv``/``text``) with ``data_files``.

The main process reads input chunks (decompressing), hands them to worker processes (JSON parsing,
optional ftfy, tokenization), and writes the results in input order, so the output does not
depend on the number of workers or on the container a document came in: the same documents give
byte-identical .bin/.idx from jsonl, jsonl.gz, parquet or a ``datasets`` folder. At most a few
chunks are in flight (bounded memory). Output files are written under temporary names and only
renamed into place after the whole run succeeded: a failed run leaves existing output untouched.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np

from ..error_lines import clean
from .corpus import (  # noqa: F401  (expand_sources, iter_source_documents, Source: re-exported for callers)
    CHUNK_BYTES,
    CHUNK_LINES,
    COMPRESSED,
    Chunk,
    Source,
    expand_sources,
    iter_source_chunks,
    iter_source_documents,
    parse_json_line,
    read_text_file,
    row_values,
)
from .errors import DataError
from .indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype
from .pair_commit import sweep_leftovers
from .tokenizer import Tokenizer, build_tokenizer
from .worker_pool import start_pool

MAX_WARNINGS = 20


@dataclass
class PreprocessStats:
    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0
    seconds: float = 0.0  # the whole run, worker start-up included
    startup_seconds: float = 0.0  # of which starting the worker processes
    skipped: int = 0  # bad lines / unreadable files skipped under skip_bad_lines
    empty: int = 0  # documents with empty text (not written)
    dtype: str = ""
    workers: int = 1
    outputs: dict = field(default_factory=dict)  # key -> output prefix

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def steady_mb_per_s(self) -> float:
        """Throughput once the workers are up (what a long run sees)."""
        return self.input_bytes / 1e6 / max(self.seconds - self.startup_seconds, 1e-9)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "mb_per_s": self.mb_per_s,
            "tokens_per_s": self.tokens_per_s,
            "steady_mb_per_s": self.steady_mb_per_s,
        }


# ------------------------------------------------------------------------------ worker side
_W: dict = {}


def die_with_parent(parent_pid: int) -> None:
    """Make this worker end when the process that started it does (a killed preprocess must not
    leave its pool running): the kernel's parent-death signal where there is one (Linux prctl),
    else a thread that watches the parent."""
    import signal
    import threading

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
        if os.getppid() != parent_pid:  # the parent died before the signal was armed
            os._exit(1)
        return
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def init_worker(
    tokenizer_type, vocab_file, vocab_size, keys, append_eod, dtype, merge_file=None, ftfy=False, parent_pid=None
) -> None:
    if parent_pid is not None:
        die_with_parent(parent_pid)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker
    fix = None
    if ftfy:
        import ftfy as _ftfy

        fix = _ftfy.fix_text
    _W.update(
        tok=build_tokenizer(tokenizer_type, vocab_file, vocab_size, merge_file),
        keys=tuple(keys),
        append_eod=append_eod,
        dtype=np.dtype(dtype),
        fix=fix,
    )


def encode_chunk(chunk: Chunk) -> dict:
    """Parse and tokenize one chunk. Returns per key the token bytes (output dtype) and document
    lengths, plus ``errors`` as (where, reason) in input order."""
    tok: Tokenizer = _W["tok"]
    keys, errors, docs, empty = _W["keys"], [], [], 0  # errors: (position in chunk, where, reason)
    fix = _W.get("fix")
    for i, item in enumerate(chunk.items):
        if chunk.kind == "text":
            where = item
        elif chunk.kind == "rows":
            where = f"{chunk.path} row {chunk.first_line + i}"
        else:
            where = f"{chunk.path}:{chunk.first_line + i}"
        try:
            if chunk.kind == "text":
                values = [read_text_file(item)]
            elif chunk.kind == "rows":
                values = row_values(item, keys)
            else:
                values = parse_json_line(item, keys)
        except (ValueError, OSError) as e:
            errors.append((i, where, str(e)))
            continue
        if values is not None:
            docs.append((i, where, [fix(v) for v in values] if fix is not None else values))
    out = {}
    for k, key in enumerate(keys):
        texts = [(i, where, values[k]) for i, where, values in docs if values[k]]
        empty += len(docs) - len(texts)
        arrays = _tokenize_all(tok, texts, errors)
        if _W["append_eod"]:
            arrays = [np.append(a, tok.eod) for a in arrays]
        lengths = np.fromiter((a.size for a in arrays), np.int64, len(arrays))
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= tok.vocab_size):  # a broken tokenizer file
            bad = int(flat.max() if flat.max() >= tok.vocab_size else flat.min())
            errors.append(
                (
                    len(chunk.items),
                    chunk.path,
                    f"{tok.name} produced token id {bad}, outside its vocabulary [0, {tok.vocab_size})",
                )
            )
            flat, lengths = np.zeros(0, np.int64), np.zeros(0, np.int64)
        out[key] = (flat.astype(_W["dtype"]).tobytes(), lengths)
    errors.sort(key=lambda e: e[0])
    return {"out": out, "errors": [e[1:] for e in errors], "empty": empty, "nbytes": chunk.nbytes}


def _tokenize_all(tok: Tokenizer, texts, errors) -> list[np.ndarray]:
    try:
        return tok.tokenize_batch([text for _, _, text in texts])
    except DataError:  # find which document(s) the tokenizer rejects
        arrays = []
        for i, where, text in texts:
            try:
                arrays.append(tok.tokenize_array(text))
            except DataError as e:
                errors.append((i, where, str(e)))
        return arrays


DATASET_IMPLS = {
    "mmap": None,
    "lazy": "the legacy IndexedDataset format (separate .idx/.bin layout, not MMIDIDX), which "
    "GPT-NeoX and Megatron no longer train from; use mmap",
    "cached": "the legacy IndexedDataset format (separate .idx/.bin layout, not MMIDIDX), which "
    "GPT-NeoX and Megatron no longer train from; use mmap",
}


# ------------------------------------------------------------------------------ main side
def check_outputs(prefix: str, inputs, force: bool) -> None:
    """PREFIX.bin/.idx may be written: not over an input, a FIFO, a link or a file that is not a
    dataset (even with --force), not inside another artifact's folder (a checkpoint save folder or
    step, a HuggingFace model folder), and over an existing dataset only with --force."""
    from ..safe_outputs import check_output_file, head

    def not_a_dataset(path):
        if path.endswith(".idx") and head(path, 9) != b"MMIDIDX\x00\x00":
            return "is not a dataset index (no MMIDIDX header)"
        if path.endswith(".bin") and head(prefix + ".idx", 9) != b"MMIDIDX\x00\x00":
            return f"is not part of a dataset (no dataset index {prefix}.idx beside it)"
        return None

    for ext in (".bin", ".idx"):
        check_output_file(
            prefix + ext, "--output-prefix", DataError, force, kind=not_a_dataset, inputs=inputs, artifacts=True
        )


def check_prefix(prefix: str, flag: str) -> None:
    """A path prefix must end in a file-name part of its own: not empty, not blank, not ending in a
    folder separator (the outputs would be named ``_text_document.bin`` in some folder)."""
    seps = os.sep + (os.altsep or "")
    if not prefix.strip():
        raise DataError(
            f"{flag} {prefix!r}: empty; give a path prefix such as data/corpus "
            f"(writes data/corpus_text_document.bin/.idx)"
        )
    if prefix[-1] in seps or not os.path.basename(prefix).strip():
        raise DataError(
            f"{flag} {prefix!r}: no file-name part after the last folder; give a path prefix such as "
            f"{prefix.rstrip(seps + ' ') or '.'}/corpus"
        )


def output_prefix_for(output_prefix: str, key: str) -> str:
    return f"{output_prefix}_{key}_document"


def preprocess(
    inputs: Iterable[str],
    output_prefix: str,
    tokenizer_type: str = "ByteLevel",
    vocab_file: Optional[str] = None,
    keys: Iterable[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    skip_bad_lines: bool = False,
    vocab_size: Optional[int] = None,
    progress: bool = True,
    warn: Optional[Callable[[str], None]] = None,
    merge_file: Optional[str] = None,
    ftfy: bool = False,
    num_docs: Optional[int] = None,
    log_interval: Optional[int] = None,
    dataset_impl: str = "mmap",
    hf_dataset: Optional[dict] = None,
    hf_split: Optional[str] = None,
    log: Optional[Callable[[str], None]] = None,
    force: bool = False,
) -> PreprocessStats:
    """Tokenize ``inputs`` (and ``hf_dataset``) into ``{output_prefix}_{key}_document.bin/.idx``
    for every key. GPT-NeoX's options: ``merge_file`` (GPT2BPETokenizer), ``ftfy`` (fix text with
    ftfy before tokenizing), ``num_docs`` (progress total, in documents), ``log_interval`` (a
    progress line every that many documents), ``dataset_impl`` (only ``mmap``). An existing output
    dataset is replaced only with ``force``, and never a file that is not a dataset or an input."""
    warn = warn or _warn
    log = log or _log
    check_prefix(output_prefix, "--output-prefix")
    keys = tuple(keys)
    if not keys:
        raise DataError("--jsonl-keys: give at least one key (e.g. text)")
    most = max(64, 4 * (os.cpu_count() or 1))
    if not 1 <= workers <= most:
        raise DataError(f"--workers {workers}: must lie in [1, {most}] (4 x the {os.cpu_count()} CPUs, at least 64)")
    if dataset_impl not in DATASET_IMPLS:
        raise DataError(f"--dataset-impl {dataset_impl}: not valid; use mmap")
    if DATASET_IMPLS[dataset_impl]:
        raise DataError(f"--dataset-impl {dataset_impl} is not supported: {DATASET_IMPLS[dataset_impl]}")
    if num_docs is not None and num_docs < 1:
        raise DataError(f"--num-docs {num_docs}: must be >= 1 (the expected number of documents)")
    if log_interval is not None and log_interval < 1:
        raise DataError(f"--log-interval {log_interval}: must be >= 1")
    if ftfy:
        try:
            import ftfy as _ftfy  # noqa: F401
        except ImportError:
            raise DataError("--ftfy needs the 'ftfy' package (pip install ftfy)") from None
    tok = build_tokenizer(tokenizer_type, vocab_file, vocab_size, merge_file)
    if append_eod:
        tok.eod  # noqa: B018 - raises a DataError now if the tokenizer has none
    if hf_dataset and hf_dataset.get("cache_dir"):  # the datasets cache: never into another artifact's folder
        from ..safe_outputs import check_output_folder

        check_output_folder("--hf-cache-dir", hf_dataset["cache_dir"], DataError, what="the datasets cache")
    sources = expand_sources(inputs, hf_dataset, hf_split)
    if len(keys) > 1 and any(s.kind == "text" for s in sources):
        raise DataError(f"plain-text inputs hold one field; use one --jsonl-keys value, not {' '.join(keys)}")
    dtype = best_fitting_dtype(tok.vocab_size)
    stats = PreprocessStats(
        dtype=np.dtype(dtype).name, workers=workers, outputs={k: output_prefix_for(output_prefix, k) for k in keys}
    )
    for prefix in stats.outputs.values():
        check_outputs(prefix, [s.path for s in sources], force)
        gone = sweep_leftovers(prefix)  # a killed earlier run's temporaries (its process is gone)
        if gone:
            warn(f"removed {len(gone)} temporary file(s) an interrupted earlier run left: {', '.join(gone)}")
    init_args = (tokenizer_type, vocab_file, vocab_size, keys, append_eod, np.dtype(dtype).str, merge_file, ftfy)
    builders = {}
    pool = None
    t0 = time.perf_counter()
    try:
        for k in keys:
            builders[k] = MMapIndexedDatasetBuilder(stats.outputs[k], dtype)
        if workers > 1:  # a worker that dies fails the run (no hang); workers die with this process
            pool = start_pool(workers, init_worker, init_args + (os.getpid(),))
            stats.startup_seconds = time.perf_counter() - t0
        else:
            init_worker(*init_args)
        sized = all(s.kind == "text" or (s.kind == "jsonl" and not s.path.endswith(COMPRESSED)) for s in sources)
        total = num_docs if num_docs else (sum(os.path.getsize(s.path) for s in sources) if sized else None)
        next_log = log_interval
        with _progress_bar(total, progress, "docs" if num_docs else "B") as bar:
            for result in _run(pool, iter_source_chunks(sources, keys), 2 * workers + 2):
                before = stats.documents
                _consume(result, builders, stats, skip_bad_lines, warn)
                bar.update(stats.documents - before if num_docs else result["nbytes"])
                bar.set_postfix(docs=stats.documents, tokens=stats.tokens, refresh=False)
                if next_log is not None and stats.documents >= next_log:
                    dt = max(time.perf_counter() - t0, 1e-9)
                    log(
                        f"processed {stats.documents} documents ({stats.documents / dt:.1f} docs/s, "
                        f"{stats.input_bytes / 1e6 / dt:.2f} MB/s, {stats.tokens} tokens)"
                    )
                    next_log = (stats.documents // log_interval + 1) * log_interval
        if stats.documents == 0:
            names = ", ".join(s.name for s in sources)
            raise DataError(
                f"no documents found in {names} (empty input{'; every line was bad' if stats.skipped else ''})"
            )
        for b in builders.values():
            b.finalize()
    except BaseException:
        for b in builders.values():
            b.abort()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    stats.seconds = time.perf_counter() - t0
    if stats.skipped > MAX_WARNINGS:
        warn(f"{stats.skipped} bad lines/files skipped in all ({stats.skipped - MAX_WARNINGS} not shown)")
    return stats


def _run(pool, chunks, window: int):
    """Results of ``encode_chunk`` over ``chunks`` in order, with at most ``window`` in flight."""
    if pool is None:
        for chunk in chunks:
            yield encode_chunk(chunk)
        return
    pending: deque = deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(encode_chunk, chunk))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool as e:
        raise DataError(f"a preprocessing worker died ({e}); rerun with --workers 1 to see why") from None


def _consume(result: dict, builders: dict, stats: PreprocessStats, skip_bad_lines: bool, warn) -> None:
    for where, reason in result["errors"]:
        if not skip_bad_lines:
            raise DataError(f"{where}: {reason}; use --skip-bad-lines to skip such lines")
        stats.skipped += 1
        if stats.skipped <= MAX_WARNINGS:
            warn(f"{where}: {reason} (skipped)")
    for key, (data, lengths) in result["out"].items():
        builders[key].add_documents(data, lengths)
    first = next(iter(builders))
    stats.documents = builders[first].num_documents
    stats.tokens = sum(b.num_tokens for b in builders.values())
    stats.empty += result["empty"]
    stats.input_bytes += result["nbytes"]


def _warn(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(clean(f"warning: {msg}"), file=sys.stderr)  # keeps the progress bar intact


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)


def _progress_bar(total, enabled: bool, unit: str = "B"):
    from tqdm import tqdm

    return tqdm(
        total=total,
        unit=unit,
        unit_scale=True,
        unit_divisor=1000,
        desc="preprocess",
        disable=not enabled,
        mininterval=0.5 if sys.stderr.isatty() else 10.0,
        file=sys.stderr,
    )
