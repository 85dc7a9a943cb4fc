"""The last line of defence for the lines a tool prints to the user (``error:``, ``warning:``,
``note:``; issue 29): whatever a message holds (a value from a config file, an HF config, a
``--set`` argument, an environment variable, a file name), the printed line carries no raw control
character (an escape sequence could rewrite the terminal) and is at most :data:`LINE_CAP`
characters (a 100,000-character value is cut in the middle, naming how much was left out).

Messages should already show such values as short excerpts (:func:`megatron_topo.safe_files.excerpt`);
:func:`clean` is applied on top, by every printer of those lines, so nothing escapes it.

One message is one line: a line separator inside it (``\\n``, ``\\r``, ``\\x0b``, ``\\x85``, U+2028,
U+2029, all of which ``str.splitlines`` splits at) is a user's value (a file name, a ``--set``
argument) and is shown escaped, never split at. Only an error that carries several problems (a
``problems`` list, :func:`problem_lines`) becomes several lines, one each.
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


def escaped(text) -> str:
    """``text`` with every control character escaped, at any length: for a file name or a user's
    value echoed on stdout (a table row, ``wrote PATH``), where a raw escape sequence could rewrite
    the terminal as in an error line, but nothing is cut."""
    return _UNSAFE.sub(_escape, text if isinstance(text, str) else str(text))


def emit(prefix: str, text, file=None, flush: bool = False) -> None:
    """Print ``PREFIX: TEXT`` as one clean line: a line separator inside ``text`` is escaped, not
    split at (several problems are several calls, :func:`problem_lines`)."""
    out = sys.stderr if file is None else file
    text = str(text)
    print(clean(f"{prefix}: {text}" if prefix else text), file=out, flush=flush)


# a config error prints at most this many problems, then one line with the count of the rest
MAX_PROBLEM_LINES = 20


def problem_lines(e: BaseException) -> list:
    """The messages of ``e``, one per line to print: its ``problems`` list when it carries several
    (a config file's problems, reported at once; the first :data:`MAX_PROBLEM_LINES`, then
    ``... and N more problems``), else its message as one line."""
    problems = getattr(e, "problems", None)
    if problems:
        lines = [str(p) for p in problems[:MAX_PROBLEM_LINES]]
        if len(problems) > MAX_PROBLEM_LINES:  # 20,000 unknown keys: the first ones, then a count
            lines.append(f"... and {len(problems) - MAX_PROBLEM_LINES:,} more problems")
        return lines
    return [str(e) or type(e).__name__]


def first_line(e: BaseException) -> str:
    """A short summary of ``e`` for embedding in a message: this project's errors are one line
    already (the whole message, or the first of its ``problems``); a library's message, which may
    run to paragraphs, up to its first newline only (never cut at ``\\r``, ``\\x85``, U+2028 or
    another separator that a file name may hold; :func:`clean` escapes those)."""
    problems = getattr(e, "problems", None)
    if problems:
        return str(problems[0])
    text = str(e)
    if not text:
        return type(e).__name__
    if type(e).__module__.split(".")[0] == "megatron_topo":
        return text
    return text.split("\n", 1)[0] or text.strip().split("\n", 1)[0] or type(e).__name__


def brief(text, limit: int = 60) -> str:
    """``text`` as it is when short and printable (a file name, a ``--set`` argument), else its
    first ``limit`` characters escaped, with its length: for naming a user's value inside a line."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit and not _UNSAFE.search(s):
        return s
    return (
        f"{_UNSAFE.sub(_escape, s[:limit])}... ({len(s):,} characters)" if len(s) > limit else _UNSAFE.sub(_escape, s)
    )


_RANK_PREFIX = re.compile(r"^(?:\[(?:rank|r|default)?[0-9]+\]:?\s*)+")  # torchrun's --tee / emulate_cluster's prefixes
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*")


def child_error(stderr: str, what: str = "no error line") -> str:
    """The cause of a child process's failure from its stderr, for a tool's own ``error:`` line: the
    child's first ``error:`` line (without the ``error:`` and a launcher's rank prefix), else the
    last exception line of a traceback, else the last line that is not a launcher's decoration (a
    row of ``=`` or ``-``, torchrun's ``ChildFailedError`` summary), else ``what``. Never torchrun's
    separator line in place of the cause."""
    lines = [_RANK_PREFIX.sub("", ln).strip() for ln in str(stderr).splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in lines:
        if ln.startswith("error: "):
            return ln[len("error: ") :]
    # torchrun's failure summary (a row of '=', "train.py FAILED", Root Cause ...) comes last: not the cause
    first_rule = next((i for i, ln in enumerate(lines) if re.fullmatch(r"[=\-]{8,}", ln)), len(lines))
    useful = [ln for ln in lines[:first_rule] if re.search(r"[A-Za-z0-9]", ln)]
    exc = [ln for ln in useful if _EXC_LINE.match(ln) and "ChildFailedError" not in ln]
    return (exc or useful or [what])[-1]
