"""The one exception type of the data pipeline."""

from __future__ import annotations

from ..error_lines import first_line


class DataError(ValueError):
    """Bad input data or arguments; the message is one line meant for the user.

    It names the file (and line, where there is one) and what would be valid.
    """


def error_line(e: BaseException) -> str:
    """One line for the user: a DataError's message, or ``PATH: reason`` for an OSError."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return first_line(e)  # the whole message of a DataError: a separator in a file name is not cut at
