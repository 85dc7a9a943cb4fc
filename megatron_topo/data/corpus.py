"""Input corpora for preprocessing and tokenizer training: JSON lines (plain, ``.zst`` as the
Pile ships, ``.gz``, ``.xz``), parquet and arrow files, ``datasets`` folders and hub datasets,
plain text files (one document per file) and directories of them; read in chunks that workers
turn into token ids.

A chunk is the unit of parallel work: up to ~1 MB of JSON lines (with the number of the first
line, for error messages), a batch of records (parquet / ``datasets`` rows) or a batch of
plain-text file paths (a worker reads them).

The inputs are expanded into sources in ``corpus_sources``, one file's lines and records are read
in ``corpus_files``; this module cuts the sources into chunks and re-exports both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Optional

from ..error_lines import first_line
from .corpus_files import ZST_SUFFIX, _lines, iter_lines, parse_json_line, read_text_file, row_values
from .corpus_sources import (
    COMPRESSED,
    JSONL_SUFFIXES,
    Source,
    expand_sources,
    file_kind,
    is_saved_dataset,
    split_inputs,
)
from .errors import DataError

# the sources and the file readers are re-exported: callers import them from here
__all__ = [
    "CHUNK_BYTES",
    "CHUNK_LINES",
    "COMPRESSED",
    "JSONL_SUFFIXES",
    "ZST_SUFFIX",
    "Chunk",
    "Source",
    "expand_sources",
    "file_kind",
    "is_saved_dataset",
    "iter_lines",
    "iter_source_chunks",
    "iter_source_documents",
    "parse_json_line",
    "read_text_file",
    "row_values",
    "split_inputs",
]

CHUNK_BYTES = 1 << 20
CHUNK_LINES = 2048


@dataclass
class Chunk:
    kind: str  # "jsonl" or "text"
    path: str  # the file (jsonl) or the first file (text)
    first_line: int = 1
    items: list = field(default_factory=list)  # raw lines (bytes) or file paths
    nbytes: int = 0


def _check_columns(name: str, columns, keys) -> None:
    if columns is None:  # a stream whose features are not known up front: rows are checked one by one
        return
    missing = [k for k in keys if k not in columns]
    if missing:
        raise DataError(
            f"{name}: no column '{missing[0]}' (columns: {', '.join(map(str, list(columns)[:12]))}); "
            f"pick the text column with --jsonl-keys"
        )


def _batches_of_rows(name: str, batches, keys, chunk_rows: int) -> Iterator[Chunk]:
    """Chunks of records (dicts) from an iterator of column batches ({column: [values]})."""
    row = 1
    for batch in batches:
        names = list(batch)
        n = len(batch[names[0]]) if names else 0
        for at in range(0, n, chunk_rows):
            items = [{k: batch[k][j] for k in names} for j in range(at, min(n, at + chunk_rows))]
            nbytes = sum(
                len(it[k].encode("utf-8", "surrogatepass")) for it in items for k in keys if isinstance(it.get(k), str)
            )
            yield Chunk("rows", name, row, items, nbytes)
            row += len(items)


def _dataset_chunks(src: Source, keys, chunk_rows: int) -> Iterator[Chunk]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{src.path}: reading HuggingFace datasets needs the 'datasets' package (pip install datasets)"
        ) from None
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
            ds = datasets.load_dataset(
                src.path,
                opts.get("name"),
                split=opts.get("split") or "train",
                data_files=opts.get("data_files") or None,
                streaming=streaming,
                cache_dir=opts.get("cache_dir"),
                revision=opts.get("revision"),
            )
    except DataError:
        raise
    except Exception as e:  # FileNotFoundError, DatasetNotFoundError, ValueError (bad split), ...
        first = first_line(e)
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
        first = first_line(e)
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
        raise DataError(f"{src.path}: not a readable parquet file ({first_line(e)})") from None
    except Exception as e:  # pyarrow.lib.ArrowInvalid on a damaged file
        first = first_line(e)
        raise DataError(f"{src.path}: not a readable parquet file ({type(e).__name__}: {first})") from None


def iter_source_chunks(
    sources: list[Source], keys=("text",), chunk_bytes: int = CHUNK_BYTES, chunk_lines: int = CHUNK_LINES
) -> Iterator[Chunk]:
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


def iter_source_documents(
    sources: list[Source], keys=("text",), skip_bad_lines: bool = False, warn=None
) -> Iterator[str]:
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
                where = (
                    item
                    if chunk.kind == "text"
                    else f"{chunk.path} row {chunk.first_line + i}"
                    if chunk.kind == "rows"
                    else f"{chunk.path}:{chunk.first_line + i}"
                )
                if not skip_bad_lines:
                    raise DataError(f"{where}: {e}; use --skip-bad-lines to skip such lines") from None
                if warn is not None:
                    warn(f"{where}: {e} (skipped)")
