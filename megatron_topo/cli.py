"""Command-line helpers shared by train.py and tools/*.py: bad arguments are one line."""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr,
    ``error: MESSAGE (usage: ...)``, with exit code 2 (not the usage block plus the error)."""

    def error(self, message):
        usage = " ".join(self.format_usage().split())[len("usage: "):]
        self.exit(2, f"error: {message} (usage: {usage})\n")
