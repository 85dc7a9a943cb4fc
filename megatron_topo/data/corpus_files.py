"""Reading one input file of a corpus: the lines of a JSON-lines file (plain, ``.zst`` as the Pile
ships, ``.gz``, ``.xz``; a damaged or truncated stream is a DataError naming the file), and the
checks of one record (a JSON line, a parquet/``datasets`` row, a plain-text file)."""

from __future__ import annotations

import re
from typing import Iterator, Optional

from ..safe_files import NotJSON, parse_json
from .errors import DataError

_SURROGATE = re.compile("[\ud800-\udfff]")

ZST_SUFFIX = ".zst"
# One document (a JSON line, a plain-text file) is held whole in memory by the readers and the
# tokenizers; the Pile's longest is a few MiB. A longer one is refused, not read until memory ends.
MAX_DOCUMENT_BYTES = 256 << 20


def _too_long(path: str, line_no: int) -> DataError:
    return DataError(
        f"{path}: line {line_no} is longer than {_size(MAX_DOCUMENT_BYTES)}, the most one document may "
        f"hold (MAX_DOCUMENT_BYTES); split it into several documents"
    )


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def _capped_lines(f, path: str) -> Iterator[bytes]:
    """Lines of a binary file object, each read with a cap: one endless line is an error, not a
    whole-file read into memory."""
    cap, line_no = MAX_DOCUMENT_BYTES, 0
    while True:
        line = f.readline(cap + 1)
        if not line:
            return
        line_no += 1
        if len(line) > cap:
            raise _too_long(path, line_no)
        yield line


def _zst_lines(path: str, read_size: int = 1 << 20, feed_size: int = 1 << 12) -> Iterator[bytes]:
    """Lines of a zstd file (one or several frames); a frame cut short is an error, not EOF.
    Compressed input is fed ``feed_size`` bytes at a time so one call's output stays bounded
    (a zstd block of 128 KiB of one byte value is 4 bytes: 4 KiB in is at most 128 MiB out)."""
    import zstandard

    cap, line_no = MAX_DOCUMENT_BYTES, 0
    dctx = zstandard.ZstdDecompressor()
    dobj, in_frame, pending = dctx.decompressobj(), False, bytearray()
    with open(path, "rb") as raw:
        while True:
            block = raw.read(read_size)
            if not block:
                break
            view = memoryview(block)
            for at in range(0, len(view), feed_size):
                data = view[at : at + feed_size]
                while data:
                    out = dobj.decompress(data)
                    in_frame, data = True, b""
                    if dobj.eof:  # frame complete; the rest of the input (if any) is the next frame
                        data, dobj, in_frame = dobj.unused_data, dctx.decompressobj(), False
                    start = 0
                    while True:
                        end = out.find(b"\n", start) + 1
                        if not end:
                            break
                        line_no += 1
                        if len(pending) + end - start > cap:
                            raise _too_long(path, line_no)
                        if pending:
                            pending += out[start:end]
                            yield bytes(pending)
                            pending.clear()
                        else:
                            yield out[start:end]
                        start = end
                    pending += out[start:]
                    if len(pending) > cap:
                        raise _too_long(path, line_no + 1)
    if in_frame:
        raise DataError(f"{path}: truncated zstd stream (the last frame is incomplete); is the file complete?")
    if pending:
        yield bytes(pending)


def iter_lines(path: str) -> Iterator[bytes]:
    """Lines of a (possibly zstd-compressed) file; a damaged stream is a DataError."""
    try:
        if path.endswith(ZST_SUFFIX):
            yield from _zst_lines(path)
        else:
            with open(path, "rb") as f:
                yield from _capped_lines(f, path)
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
        obj = parse_json(line)
    except NotJSON as e:  # a syntax error, not UTF-8, nested too deeply, an integer past Python's limit
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    values = row_values(obj, keys)
    # only a JSON escape ("\ud800") makes a lone surrogate (the bytes are decoded as strict UTF-8)
    if ("\\u" if isinstance(line, str) else b"\\u") in line:
        for key, v in zip(keys, values):
            m = _SURROGATE.search(v)
            if m:
                raise ValueError(
                    f"key '{key}' holds the lone surrogate U+{ord(m.group()):04X} (a JSON escape at character "
                    f"{m.start():,}), which is no Unicode character: not text"
                )
    return values


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
    """One plain-text file as one document, at most MAX_DOCUMENT_BYTES (ValueError beyond)."""
    with open(path, "rb") as f:
        data = f.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ValueError(
            f"longer than {_size(MAX_DOCUMENT_BYTES)}, the most one document may hold (MAX_DOCUMENT_BYTES); "
            f"split it into several files"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _compressed_lines(path: str) -> Iterator[bytes]:
    """Lines of a .gz / .xz file; a damaged or truncated stream is a DataError naming the file."""
    import gzip
    import lzma

    opener, what = (gzip.open, "gzip") if path.endswith(".gz") else (lzma.open, "xz")
    try:
        with opener(path, "rb") as f:
            yield from _capped_lines(f, path)
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
