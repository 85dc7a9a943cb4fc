"""Reading one input file of a corpus: the lines of a JSON-lines file (plain, ``.zst`` as the Pile
ships, ``.gz``, ``.xz``; a damaged or truncated stream is a DataError naming the file), and the
checks of one record (a JSON line, a parquet/``datasets`` row, a plain-text file)."""

from __future__ import annotations

import json
from typing import Iterator, Optional

from .errors import DataError

ZST_SUFFIX = ".zst"


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
