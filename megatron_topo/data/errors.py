"""The one exception type of the data pipeline."""
from __future__ import annotations


class DataError(ValueError):
    """Bad input data or arguments; the message is one line meant for the user.

    It names the file (and line, where there is one) and what would be valid.
    """
