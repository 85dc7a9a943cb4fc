"""Input corpora: ``.jsonl``, ``.jsonl.zst`` (the Pile), plain text files (one document per file)
and directories of them; read in chunks that workers turn into token ids.

A chunk is the unit of parallel work: up to ~1 MB of JSON lines (with the number of the first
line, for error messages) or a batch of plain-text file paths (a worker reads them).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from .errors import DataError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
ZST_SUFFIX = ".zst"
CHUNK_BYTES = 1 << 20
CHUNK_LINES = 2048


@dataclass
class Chunk:
    kind: str  # "jsonl" or "text"
    path: str  # the file (jsonl) or the first file (text)
    first_line: int = 1
    items: list = field(default_factory=list)  # raw lines (bytes) or file paths
    nbytes: int = 0


def input_kind(path: str) -> str:
    """'jsonl' for .jsonl/.json (optionally .zst-compressed), 'text' for anything else."""
    name = path[: -len(ZST_SUFFIX)] if path.endswith(ZST_SUFFIX) else path
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if path.endswith(ZST_SUFFIX):
        raise DataError(f"{path}: only .jsonl.zst / .json.zst compressed inputs are supported")
    return "text"


def expand_inputs(paths: Iterable[str]) -> list[str]:
    """Files named directly, plus every non-hidden file under named directories (sorted)."""
    out: list[str] = []
    paths = list(paths)
    if not paths:
        raise DataError("no input given; pass --input FILE_OR_DIR [...] (.jsonl, .jsonl.zst, text files)")
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, f) for f in files if not f.startswith(".")]
            if not found:
                raise DataError(f"{p}: directory has no input files (empty input)")
            out += sorted(found)
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise DataError(f"{p}: no such file or directory (inputs are .jsonl, .jsonl.zst, text files "
                            f"or directories of them)")
    for p in out:
        input_kind(p)
    return out


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
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e}); is it a complete "
                        f"{'zstd-compressed ' if path.endswith(ZST_SUFFIX) else ''}file?") from None


def iter_chunks(files: list[str], chunk_bytes: int = CHUNK_BYTES,
                chunk_lines: int = CHUNK_LINES) -> Iterator[Chunk]:
    text_batch: Optional[Chunk] = None
    for path in files:
        if input_kind(path) == "text":
            if text_batch is None:
                text_batch = Chunk("text", path)
            text_batch.items.append(path)
            text_batch.nbytes += os.path.getsize(path)
            if text_batch.nbytes >= chunk_bytes or len(text_batch.items) >= chunk_lines:
                yield text_batch
                text_batch = None
            continue
        chunk = Chunk("jsonl", path, 1)
        line_no = 0
        for line_no, line in enumerate(iter_lines(path), 1):
            chunk.items.append(line)
            chunk.nbytes += len(line)
            if chunk.nbytes >= chunk_bytes or len(chunk.items) >= chunk_lines:
                yield chunk
                chunk = Chunk("jsonl", path, line_no + 1)
        if chunk.items:
            yield chunk
    if text_batch is not None:
        yield text_batch


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


def iter_documents(files: list[str], keys: tuple[str, ...] = ("text",), skip_bad_lines: bool = False,
                   warn=None) -> Iterator[str]:
    """Texts under ``keys[0]`` of every document (for tokenizer training), in input order."""
    for chunk in iter_chunks(files):
        for i, item in enumerate(chunk.items):
            try:
                if chunk.kind == "text":
                    yield read_text_file(item)
                    continue
                values = parse_json_line(item, keys[:1])
                if values is not None:
                    yield values[0]
            except ValueError as e:
                where = item if chunk.kind == "text" else f"{chunk.path}:{chunk.first_line + i}"
                if not skip_bad_lines:
                    raise DataError(f"{where}: {e}; use --skip-bad-lines to skip such lines") from None
                if warn is not None:
                    warn(f"{where}: {e} (skipped)")
