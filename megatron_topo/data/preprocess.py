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

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from .corpus import CHUNK_BYTES, CHUNK_LINES, JSONL_SUFFIXES, Chunk, iter_lines, parse_json_line, read_text_file
from .errors import DataError
from .indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype
from .tokenizer import Tokenizer, build_tokenizer

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
        return {**asdict(self), "mb_per_s": self.mb_per_s, "tokens_per_s": self.tokens_per_s,
                "steady_mb_per_s": self.steady_mb_per_s}


# ------------------------------------------------------------------------------ worker side
_W: dict = {}


def init_worker(tokenizer_type, vocab_file, vocab_size, keys, append_eod, dtype, merge_file=None,
                ftfy=False) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker
    fix = None
    if ftfy:
        import ftfy as _ftfy

        fix = _ftfy.fix_text
    _W.update(tok=build_tokenizer(tokenizer_type, vocab_file, vocab_size, merge_file), keys=tuple(keys),
              append_eod=append_eod, dtype=np.dtype(dtype), fix=fix)


def row_values(obj, keys: tuple[str, ...]) -> list[str]:
    """The values of ``keys`` in one record (a parquet/``datasets`` row), checked as a JSON line's."""
    values = []
    for key in keys:
        if key not in obj:
            raise ValueError(f"no key '{key}' (keys present: {', '.join(map(str, list(obj)[:8]))})")
        if not isinstance(obj[key], str):
            raise ValueError(f"key '{key}' holds {type(obj[key]).__name__}, expected a string")
        values.append(obj[key])
    return values


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
            errors.append((len(chunk.items), chunk.path, f"{tok.name} produced token id {bad}, outside its "
                                                         f"vocabulary [0, {tok.vocab_size})"))
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


# ------------------------------------------------------------------------------ sources
COMPRESSED = (".zst", ".gz", ".xz")
DATASET_IMPLS = {"mmap": None,
                 "lazy": "the legacy IndexedDataset format (separate .idx/.bin layout, not MMIDIDX), which "
                         "GPT-NeoX and Megatron no longer train from; use mmap",
                 "cached": "the legacy IndexedDataset format (separate .idx/.bin layout, not MMIDIDX), which "
                           "GPT-NeoX and Megatron no longer train from; use mmap"}


@dataclass
class Source:
    kind: str  # "jsonl", "text", "parquet", "arrow", "hf_disk", "hf_load"
    path: str
    options: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path


def split_inputs(inputs: Iterable[str]) -> list[str]:
    """GPT-NeoX's ``--input a.jsonl,b.jsonl.zst``: comma-separated lists (a name that exists as
    given is kept whole, commas and all)."""
    out = []
    for item in inputs:
        item = str(item)
        if os.path.exists(item) or "," not in item:
            out.append(item)
        else:
            out += [p for p in item.split(",") if p]
    return out


def is_saved_dataset(path: str) -> bool:
    """A folder written by ``datasets``' ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, "dataset_dict.json"))
        or (os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))))


def file_kind(path: str) -> str:
    """'jsonl' (optionally .zst/.gz/.xz-compressed), 'parquet', 'arrow' or 'text'."""
    base = path
    for suffix in COMPRESSED:
        if path.endswith(suffix):
            base = path[: -len(suffix)]
            if not base.endswith(JSONL_SUFFIXES):
                raise DataError(f"{path}: compressed inputs must be JSON lines (.jsonl{suffix}, .json{suffix}); "
                                f"decompress other files first")
            return "jsonl"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(".arrow"):
        return "arrow"
    return "text"


def expand_sources(inputs: Iterable[str], hf_dataset: Optional[dict] = None,
                   hf_split: Optional[str] = None) -> list[Source]:
    """Files named directly, ``datasets`` folders, every non-hidden file under other folders
    (sorted), then the ``hf_dataset`` (``{"path", "name", "split", "data_files", "streaming",
    "cache_dir", "revision"}``) if given. ``hf_split``: the split of DatasetDict folders."""
    sources: list[Source] = []
    paths = split_inputs(inputs or [])
    if not paths and not hf_dataset:
        raise DataError("no input given; pass --input FILE_OR_DIR[,...] (.jsonl[.zst|.gz|.xz], .parquet, "
                        "text files, datasets folders) or --hf-dataset NAME")
    split = hf_split or (hf_dataset or {}).get("split") or "train"
    for p in paths:
        if is_saved_dataset(p):
            sources.append(Source("hf_disk", p, {"split": split}))
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in files if not f.startswith(".")]
            if not found:
                raise DataError(f"{p}: directory has no input files (empty input)")
            sources += [Source(file_kind(f), f) for f in sorted(found)]
        elif os.path.isfile(p):
            sources.append(Source(file_kind(p), p))
        else:
            raise DataError(f"{p}: no such file or directory (inputs are .jsonl[.zst|.gz|.xz], .parquet, .arrow, "
                            f"text files, datasets save_to_disk folders or directories of them)")
    if hf_dataset:
        spec = dict(hf_dataset)
        if is_saved_dataset(spec["path"]) and not spec.get("data_files"):
            sources.append(Source("hf_disk", spec["path"], {"split": split}))
        else:
            sources.append(Source("hf_load", spec["path"], spec))
    return sources


def _compressed_lines(path: str) -> Iterator[bytes]:
    """Lines of a .gz / .xz file; a damaged or truncated stream is a DataError naming the file."""
    import gzip
    import lzma

    opener, what = (gzip.open, "gzip") if path.endswith(".gz") else (lzma.open, "xz")
    try:
        with opener(path, "rb") as f:
            yield from f
    except EOFError:
        raise DataError(f"{path}: truncated {what} stream (it ends before its end marker); is the file "
                        f"complete?") from None
    except (OSError, lzma.LZMAError, gzip.BadGzipFile) as e:
        if isinstance(e, OSError) and e.filename:
            raise
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e}); is it a complete {what}-compressed "
                        f"file?") from None


def _lines(path: str) -> Iterator[bytes]:
    if path.endswith((".gz", ".xz")):
        return _compressed_lines(path)
    return iter_lines(path)  # plain or .zst


def _check_columns(name: str, columns, keys) -> None:
    if columns is None:  # a stream whose features are not known up front: rows are checked one by one
        return
    missing = [k for k in keys if k not in columns]
    if missing:
        raise DataError(f"{name}: no column '{missing[0]}' (columns: {', '.join(map(str, list(columns)[:12]))}); "
                        f"pick the text column with --jsonl-keys")


def _batches_of_rows(name: str, batches, keys, chunk_rows: int) -> Iterator[Chunk]:
    """Chunks of records (dicts) from an iterator of column batches ({column: [values]})."""
    row = 1
    for batch in batches:
        names = list(batch)
        n = len(batch[names[0]]) if names else 0
        for at in range(0, n, chunk_rows):
            items = [{k: batch[k][j] for k in names} for j in range(at, min(n, at + chunk_rows))]
            nbytes = sum(len(it[k].encode("utf-8", "surrogatepass")) for it in items for k in keys
                         if isinstance(it.get(k), str))
            yield Chunk("rows", name, row, items, nbytes)
            row += len(items)


def _dataset_chunks(src: Source, keys, chunk_rows: int) -> Iterator[Chunk]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{src.path}: reading HuggingFace datasets needs the 'datasets' package "
                        f"(pip install datasets)") from None
    opts = src.options
    try:
        if src.kind == "arrow":
            ds = datasets.Dataset.from_file(src.path)
        elif src.kind == "hf_disk":
            ds = datasets.load_from_disk(src.path)
        else:
            streaming = opts.get("streaming")
            if streaming is None:
                streaming = True
            ds = datasets.load_dataset(src.path, opts.get("name"), split=opts.get("split") or "train",
                                       data_files=opts.get("data_files") or None, streaming=streaming,
                                       cache_dir=opts.get("cache_dir"), revision=opts.get("revision"))
    except DataError:
        raise
    except Exception as e:  # FileNotFoundError, DatasetNotFoundError, ValueError (bad split), ...
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{src.path}: cannot open as a HuggingFace dataset ({type(e).__name__}: {first})") from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        split = opts.get("split") or "train"
        if split not in ds:
            raise DataError(f"{src.path}: no split '{split}' (splits: {', '.join(ds)}); pick one with --hf-split")
        ds = ds[split]
    columns = ds.column_names
    _check_columns(src.path, columns, keys)
    try:
        if columns is not None:  # read (and, streaming, download) only the text columns
            ds = ds.select_columns(list(keys))
        batches = ds.iter(batch_size=chunk_rows)
        yield from _batches_of_rows(src.path, batches, keys, chunk_rows)
    except DataError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{src.path}: reading failed ({type(e).__name__}: {first})") from None


def _parquet_chunks(src: Source, keys, chunk_rows: int) -> Iterator[Chunk]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{src.path}: reading parquet needs the 'pyarrow' package (pip install pyarrow)") from None
    try:
        f = pq.ParquetFile(src.path)
        _check_columns(src.path, f.schema_arrow.names, keys)
        batches = (b.to_pydict() for b in f.iter_batches(batch_size=chunk_rows, columns=list(keys)))
        yield from _batches_of_rows(src.path, batches, keys, chunk_rows)
    except DataError:
        raise
    except OSError as e:
        if e.filename:
            raise
        raise DataError(f"{src.path}: not a readable parquet file ({str(e).splitlines()[0]})") from None
    except Exception as e:  # pyarrow.lib.ArrowInvalid on a damaged file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{src.path}: not a readable parquet file ({type(e).__name__}: {first})") from None


def iter_source_chunks(sources: list[Source], keys=("text",), chunk_bytes: int = CHUNK_BYTES,
                       chunk_lines: int = CHUNK_LINES) -> Iterator[Chunk]:
    """Chunks of every source, in source order (plain-text files are batched, the batch flushed
    before the next non-text source)."""
    keys = tuple(keys)
    text_batch: Optional[Chunk] = None
    for src in sources:
        if src.kind == "text":
            if text_batch is None:
                text_batch = Chunk("text", src.path)
            text_batch.items.append(src.path)
            text_batch.nbytes += os.path.getsize(src.path)
            if text_batch.nbytes >= chunk_bytes or len(text_batch.items) >= chunk_lines:
                yield text_batch
                text_batch = None
            continue
        if text_batch is not None:
            yield text_batch
            text_batch = None
        if src.kind == "jsonl":
            chunk = Chunk("jsonl", src.path, 1)
            line_no = 0
            for line_no, line in enumerate(_lines(src.path), 1):
                chunk.items.append(line)
                chunk.nbytes += len(line)
                if chunk.nbytes >= chunk_bytes or len(chunk.items) >= chunk_lines:
                    yield chunk
                    chunk = Chunk("jsonl", src.path, line_no + 1)
            if chunk.items:
                yield chunk
        elif src.kind == "parquet":
            yield from _parquet_chunks(src, keys, chunk_lines)
        else:
            yield from _dataset_chunks(src, keys, chunk_lines)
    if text_batch is not None:
        yield text_batch


def iter_source_documents(sources: list[Source], keys=("text",), skip_bad_lines: bool = False,
                          warn=None) -> Iterator[str]:
    """Texts under ``keys[0]`` of every document, in input order (tokenizer training)."""
    keys = tuple(keys)[:1]
    for chunk in iter_source_chunks(sources, keys):
        for i, item in enumerate(chunk.items):
            try:
                if chunk.kind == "text":
                    yield read_text_file(item)
                    continue
                values = row_values(item, keys) if chunk.kind == "rows" else parse_json_line(item, keys)
                if values is not None:
                    yield values[0]
            except ValueError as e:
                where = (item if chunk.kind == "text" else f"{chunk.path} row {chunk.first_line + i}"
                         if chunk.kind == "rows" else f"{chunk.path}:{chunk.first_line + i}")
                if not skip_bad_lines:
                    raise DataError(f"{where}: {e}; use --skip-bad-lines to skip such lines") from None
                if warn is not None:
                    warn(f"{where}: {e} (skipped)")


# ------------------------------------------------------------------------------ main side
def output_prefix_for(output_prefix: str, key: str) -> str:
    return f"{output_prefix}_{key}_document"


def preprocess(inputs: Iterable[str], output_prefix: str, tokenizer_type: str = "ByteLevel",
               vocab_file: Optional[str] = None, keys: Iterable[str] = ("text",), append_eod: bool = False,
               workers: int = 1, skip_bad_lines: bool = False, vocab_size: Optional[int] = None,
               progress: bool = True, warn: Optional[Callable[[str], None]] = None,
               merge_file: Optional[str] = None, ftfy: bool = False, num_docs: Optional[int] = None,
               log_interval: Optional[int] = None, dataset_impl: str = "mmap",
               hf_dataset: Optional[dict] = None, hf_split: Optional[str] = None,
               log: Optional[Callable[[str], None]] = None) -> PreprocessStats:
    """Tokenize ``inputs`` (and ``hf_dataset``) into ``{output_prefix}_{key}_document.bin/.idx``
    for every key. GPT-NeoX's options: ``merge_file`` (GPT2BPETokenizer), ``ftfy`` (fix text with
    ftfy before tokenizing), ``num_docs`` (progress total, in documents), ``log_interval`` (a
    progress line every that many documents), ``dataset_impl`` (only ``mmap``)."""
    warn = warn or _warn
    log = log or _log
    keys = tuple(keys)
    if not keys:
        raise DataError("--jsonl-keys: give at least one key (e.g. text)")
    if workers < 1:
        raise DataError(f"--workers {workers}: must be >= 1")
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
    sources = expand_sources(inputs, hf_dataset, hf_split)
    if len(keys) > 1 and any(s.kind == "text" for s in sources):
        raise DataError(f"plain-text inputs hold one field; use one --jsonl-keys value, not {' '.join(keys)}")
    dtype = best_fitting_dtype(tok.vocab_size)
    stats = PreprocessStats(dtype=np.dtype(dtype).name, workers=workers,
                            outputs={k: output_prefix_for(output_prefix, k) for k in keys})
    init_args = (tokenizer_type, vocab_file, vocab_size, keys, append_eod, np.dtype(dtype).str, merge_file, ftfy)
    builders = {}
    pool = None
    t0 = time.perf_counter()
    try:
        for k in keys:
            builders[k] = MMapIndexedDatasetBuilder(stats.outputs[k], dtype)
        if workers > 1:  # spawn: no forked tokenizer state; a worker that dies fails the run (no hang)
            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=init_worker,
                                       initargs=init_args)
            for f in [pool.submit(os.getpid) for _ in range(workers)]:
                f.result()
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
                    log(f"processed {stats.documents} documents ({stats.documents / dt:.1f} docs/s, "
                        f"{stats.input_bytes / 1e6 / dt:.2f} MB/s, {stats.tokens} tokens)")
                    next_log = (stats.documents // log_interval + 1) * log_interval
        if stats.documents == 0:
            names = ", ".join(s.name for s in sources)
            raise DataError(f"no documents found in {names} (empty input"
                            f"{'; every line was bad' if stats.skipped else ''})")
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

    tqdm.write(f"warning: {msg}", file=sys.stderr)  # keeps the progress bar intact


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)


def _progress_bar(total, enabled: bool, unit: str = "B"):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, unit_divisor=1000, desc="preprocess",
                disable=not enabled, mininterval=0.5 if sys.stderr.isatty() else 10.0, file=sys.stderr)
