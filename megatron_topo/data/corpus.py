"""Input corpora for preprocessing and tokenizer training: JSON lines (plain, ``.zst`` as the
Pile ships, ``.gz``, ``.xz``), parquet and arrow files, ``datasets`` folders and hub datasets,
plain text files (one document per file) and directories of them; read in chunks that workers
turn into token ids.

A chunk is the unit of parallel work: up to ~1 MB of JSON lines (with the number of the first
line, for error messages), a batch of records (parquet / ``datasets`` rows) or a batch of
plain-text file paths (a worker reads them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from .errors import DataError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
ZST_SUFFIX = ".zst"
COMPRESSED = (".zst", ".gz", ".xz")
CHUNK_BYTES = 1 << 20
CHUNK_LINES = 2048


@dataclass
class Chunk:
    kind: str  # "jsonl" or "text"
    path: str  # the file (jsonl) or the first file (text)
    first_line: int = 1
    items: list = field(default_factory=list)  # raw lines (bytes) or file paths
    nbytes: int = 0


def _zst_lines(path: str, read_size: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a zstd file (one or several frames); a frame cut short is an error, not EOF."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj, in_frame, pending = dctx.decompressobj(), False, b""
    with open(path, "rb") as raw:
        while True:
            data = raw.read(read_size)
            if not data:
                break
            while data:
                out = dobj.decompress(data)
                in_frame, data = True, b""
                if dobj.eof:  # frame complete; the rest of the input (if any) is the next frame
                    data, dobj, in_frame = dobj.unused_data, dctx.decompressobj(), False
                if out:
                    *lines, pending = (pending + out).split(b"\n")
                    for line in lines:
                        yield line + b"\n"
    if in_frame:
        raise DataError(f"{path}: truncated zstd stream (the last frame is incomplete); is the file complete?")
    if pending:
        yield pending


def iter_lines(path: str) -> Iterator[bytes]:
    """Lines of a (possibly zstd-compressed) file; a damaged stream is a DataError."""
    try:
        if path.endswith(ZST_SUFFIX):
            yield from _zst_lines(path)
        else:
            with open(path, "rb") as f:
                yield from f
    except DataError:
        raise
    except Exception as e:  # zstandard.ZstdError on a damaged frame
        raise DataError(
            f"{path}: cannot read ({type(e).__name__}: {e}); is it a complete "
            f"{'zstd-compressed ' if path.endswith(ZST_SUFFIX) else ''}file?"
        ) from None


def parse_json_line(line: bytes, keys: tuple[str, ...]) -> Optional[list[str]]:
    """The values of ``keys`` in one JSON line (None for a blank line). Raises ValueError with a
    short reason for anything else that is not a JSON object with string values under the keys."""
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise ValueError(f"invalid JSON ({reason})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return row_values(obj, keys)


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


def read_text_file(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


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
        or (
            os.path.isfile(os.path.join(path, "state.json")) and os.path.isfile(os.path.join(path, "dataset_info.json"))
        )
    )


def file_kind(path: str) -> str:
    """'jsonl' (optionally .zst/.gz/.xz-compressed), 'parquet', 'arrow' or 'text'."""
    base = path
    for suffix in COMPRESSED:
        if path.endswith(suffix):
            base = path[: -len(suffix)]
            if not base.endswith(JSONL_SUFFIXES):
                raise DataError(
                    f"{path}: compressed inputs must be JSON lines (.jsonl{suffix}, .json{suffix}); "
                    f"decompress other files first"
                )
            return "jsonl"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(".arrow"):
        return "arrow"
    return "text"


def expand_sources(
    inputs: Iterable[str], hf_dataset: Optional[dict] = None, hf_split: Optional[str] = None
) -> list[Source]:
    """Files named directly, ``datasets`` folders, every non-hidden file under other folders
    (sorted), then the ``hf_dataset`` (``{"path", "name", "split", "data_files", "streaming",
    "cache_dir", "revision"}``) if given. ``hf_split``: the split of DatasetDict folders."""
    sources: list[Source] = []
    paths = split_inputs(inputs or [])
    if not paths and not hf_dataset:
        raise DataError(
            "no input given; pass --input FILE_OR_DIR[,...] (.jsonl[.zst|.gz|.xz], .parquet, "
            "text files, datasets folders) or --hf-dataset NAME"
        )
    split = hf_split or (hf_dataset or {}).get("split") or "train"
    for p in paths:
        if is_saved_dataset(p):
            sources.append(Source("hf_disk", p, {"split": split}))
        elif os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in files if not f.startswith(".")]
            for f in found:  # a FIFO or a device in the folder would block or never end
                _regular_input(f)
            if not found:
                raise DataError(f"{p}: directory has no input files (empty input)")
            sources += [Source(file_kind(f), f) for f in sorted(found)]
        elif os.path.isfile(p):
            sources.append(Source(file_kind(_regular_input(p)), p))
        elif os.path.exists(p):
            _regular_input(p)
        else:
            raise DataError(
                f"{p}: no such file or directory (inputs are .jsonl[.zst|.gz|.xz], .parquet, .arrow, "
                f"text files, datasets save_to_disk folders or directories of them)"
            )
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
        raise DataError(
            f"{path}: truncated {what} stream (it ends before its end marker); is the file complete?"
        ) from None
    except (OSError, lzma.LZMAError, gzip.BadGzipFile) as e:
        if isinstance(e, OSError) and e.filename:
            raise
        raise DataError(
            f"{path}: cannot read ({type(e).__name__}: {e}); is it a complete {what}-compressed file?"
        ) from None


def _lines(path: str) -> Iterator[bytes]:
    if path.endswith((".gz", ".xz")):
        return _compressed_lines(path)
    return iter_lines(path)  # plain or .zst


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


def _regular_input(path: str) -> str:
    """``path`` when it is a regular file (symlinks followed); a FIFO, a device or a socket is one
    line: reading it would block or never end."""
    import stat

    from ..safe_files import _kind

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"{path} is {_kind(mode)}, not a file; inputs are regular files (or folders of them)")
    return path
