"""Every script in tools/ refuses an unknown option with one ``error:`` line and writes nothing
(issue 14)."""

import os

import pytest

from .cli_cases import ROOT, call, one_error_line
from .tool_loader import load_tool

TOOLS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py"))


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_refuses_an_unknown_option_in_one_line(tool, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    mod = load_tool(tool)
    capfd.readouterr()
    rc = call(mod.main, ["--no-such-option-xyz"])
    line = one_error_line(capfd)
    assert rc in (1, 2) and ("--no-such-option-xyz" in line or "required" in line), line
    assert os.listdir(tmp_path) == []
