"""The last line of defence for the lines a tool prints to the user (``error:``, ``warning:``,
``note:``; issue 29): whatever a message holds (a value from a config file, an HF config, a
``--set`` argument, an environment variable, a file name), the printed line carries no raw control
character (an escape sequence could rewrite the terminal) and is at most :data:`LINE_CAP`
characters (a 100,000-character value is cut in the middle, naming how much was left out).

Messages should already show such values as short excerpts (:func:`megatron_topo.safe_files.excerpt`);
:func:`clean` is applied on top, by every printer of those lines, so nothing escapes it.
"""

from __future__ import annotations

import re
import sys

LINE_CAP = 600  # characters of one printed line, its prefix included

# C0 and C1 controls, DEL, line/paragraph separators, bidi and zero-width format characters, BOM,
# and lone surrogates (file names read with surrogateescape): all shown as escapes
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")


def _escape(m: "re.Match") -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(line: str, cap: int = LINE_CAP) -> str:
    """``line`` with every control character escaped (``\\x1b``), cut in the middle to ``cap``
    characters at most."""
    s = line if isinstance(line, str) else str(line)
    total = len(s)
    if total > 8 * cap:  # never escape a megabyte to print 600 characters of it
        s = s[: 4 * cap] + s[-4 * cap :]
    s = _UNSAFE.sub(_escape, s)
    if len(s) <= cap and total <= 8 * cap:
        return s
    note = f" ... [cut: {total:,} characters in all] ... "
    keep = cap - len(note)
    head = keep * 2 // 3
    return s[:head] + note + s[len(s) - (keep - head) :]


def emit(prefix: str, text, file=None, flush: bool = False) -> None:
    """Print ``PREFIX: TEXT`` as one clean line (``text`` holding several lines: one each)."""
    out = sys.stderr if file is None else file
    for part in str(text).splitlines() or [""]:
        print(clean(f"{prefix}: {part}" if prefix else part), file=out, flush=flush)


def brief(text, limit: int = 60) -> str:
    """``text`` as it is when short and printable (a file name, a ``--set`` argument), else its
    first ``limit`` characters escaped, with its length: for naming a user's value inside a line."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit and not _UNSAFE.search(s):
        return s
    return (
        f"{_UNSAFE.sub(_escape, s[:limit])}... ({len(s):,} characters)" if len(s) > limit else _UNSAFE.sub(_escape, s)
    )
