"""Command-line helpers shared by train.py and tools/*.py: bad arguments are one line."""

from __future__ import annotations

import argparse

from .error_lines import LINE_CAP, clean, emit


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr,
    ``error: MESSAGE (usage: ...)``, with exit code 2 (not the usage block plus the error).

    ``usage_line`` replaces the generated usage in that line (``--help`` is unchanged);
    ``error_status`` replaces the exit code.
    """

    def __init__(self, *args, usage_line: str | None = None, error_status: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.usage_line, self.error_status = usage_line, error_status

    def error(self, message):
        usage = self.usage_line or " ".join(self.format_usage().split())[len("usage: ") :]
        head = clean(f"error: {message}")
        room = LINE_CAP - len(head) - len(" (usage: )")
        if len(usage) > room:  # the message stays whole; a long usage is shortened (--help has it all)
            usage = usage[: max(room - len(" ... see --help"), 0)].rstrip() + " ... see --help"
        self.exit(self.error_status, clean(f"{head} (usage: {usage})") + "\n")


def fail(e: BaseException, path: str = "", status: int = 2) -> int:
    """Print the one ``error:`` line for an expected failure of a tool and return its exit status:
    an OSError as ``PATH: reason`` (``path`` when the error names no file), anything else as its
    message; each line escaped and capped (error_lines.clean)."""
    if isinstance(e, OSError):
        text = f"{e.filename or path}: {e.strerror or e}"
    else:
        text = str(e)
    # a config file's several problems: one error: line each (never a line without the prefix)
    for line in getattr(e, "problems", None) or text.splitlines() or [type(e).__name__]:
        emit("error", line)
    return status
