"""One program per command (docs/design.md §6): tools/NAME.py is a launcher of megatron_topo.commands.NAME,
and pyproject.toml's entry point megatron-topo-NAME runs the same main; train.py is the launcher of
``train``."""

import ast
import importlib
import os

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tools")) if f.endswith(".py"))


def _launched(path: str) -> str:
    """The module a launcher imports ``main`` from; fails when the file does more than launch it."""
    tree = ast.parse(open(path).read())
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    assert len(body) == 2, f"{path}: a launcher is one import and the __main__ call"
    imp, call = body
    assert isinstance(imp, ast.ImportFrom) and [a.name for a in imp.names] == ["main"], path
    assert ast.unparse(call) == "if __name__ == '__main__':\n    raise SystemExit(main())", path
    return imp.module


def test_every_tool_is_a_launcher_of_its_command():
    for name in TOOLS:
        assert _launched(os.path.join(ROOT, "tools", f"{name}.py")) == f"megatron_topo.commands.{name}"
    assert _launched(os.path.join(ROOT, "train.py")) == "megatron_topo.commands.train"


def test_every_command_has_its_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    want = {f"megatron-topo-{n.replace('_', '-')}": f"megatron_topo.commands.{n}:main" for n in TOOLS + ["train"]}
    assert scripts == want
    for target in want.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target
