"""ruff (pinned in requirements.txt, configured in pyproject.toml) is clean over the repository: the
lint rules and the formatter's check, run here so the test command CI runs includes them."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    assert os.path.exists(RUFF), f"{RUFF} is missing: scripts/setup.sh installs ruff from requirements.txt"
    return subprocess.run([RUFF, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean():
    r = _ruff("check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean():
    r = _ruff("format", "--check", "--no-cache", ".")
    assert r.returncode == 0, "run `.venv/bin/ruff format .`:\n" + r.stdout + r.stderr
