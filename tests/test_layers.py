"""The package's layers (docs/design.md §2) and no import cycle, read from the source with ``ast``.

Every ``import`` / ``from ... import`` of every module counts, at module level or inside a function
(relative imports resolved; ``from pkg import name`` counts as importing ``pkg.name`` when that is a
module); only imports under ``if TYPE_CHECKING:`` are left out (annotations, never run). Each
module is mapped to a layer by :data:`LAYER_OF` and may import its own layer and the layers
:data:`MAY_IMPORT` lists for it (the table of docs/design.md §2). A failure names the import:
``megatron_topo/config/loader.py:242: megatron_topo.config.loader (config loading) -> ...``.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "megatron_topo"

# module (or package prefix) -> layer; the longest matching key wins. Every module must match one.
LAYER_OF = {
    "megatron_topo.__init__": "entry points",  # the package itself; a new top-level module needs its own row
    "megatron_topo.atomic": "util",
    "megatron_topo.safe_files": "util",
    "megatron_topo.safe_outputs": "util",
    "megatron_topo.tool_outputs": "util",
    "megatron_topo.pids": "util",
    "megatron_topo.cli": "util",
    "megatron_topo.error_lines": "util",
    "megatron_topo.zero_topo.plan_space": "util",  # the plan space's legal values; imports nothing
    "megatron_topo.zero_topo.kernels": "kernels",
    "megatron_topo.data": "data",
    "megatron_topo.config": "config",
    "megatron_topo.config.__init__": "config loading",  # the package's facade re-exports load_config
    "megatron_topo.config.loader": "config loading",
    "megatron_topo.config.hf_config": "config loading",
    "megatron_topo.config.__main__": "entry points",
    "megatron_topo.topology": "topology",
    "megatron_topo.zero_topo": "zero_topo",
    "megatron_topo.model": "model",
    "megatron_topo.zero_topo.checkpoint": "checkpoint",
    "megatron_topo.metrics": "metrics",
    "megatron_topo.preflight": "metrics",
    "megatron_topo.analysis": "analysis",
    "megatron_topo.training": "training",
    "megatron_topo.lifecycle": "run control",
    "megatron_topo.runlock": "run control",
    "megatron_topo.launch": "run control",
    "megatron_topo.commands": "entry points",
    "megatron_topo.dryrun": "entry points",
}

# layer -> the other layers its modules may import (docs/design.md §2 shows the same table)
MAY_IMPORT = {
    "util": set(),
    "kernels": {"util"},
    "data": {"util"},
    "config": {"util", "data", "run control"},  # config/run_outputs reads run locks (a running job's folders)
    "topology": {"util", "config"},
    "zero_topo": {"util", "kernels", "config", "topology"},
    "model": {"util", "data", "config", "zero_topo"},
    "config loading": {"util", "data", "config", "model"},
    "run control": {"util"},
    "checkpoint": {"util", "config", "zero_topo", "model"},
    "metrics": {"util", "data", "config", "topology", "zero_topo", "model"},
    "analysis": {"util", "config", "config loading", "topology", "zero_topo", "model", "metrics"},
    "training": {
        "util",
        "kernels",
        "data",
        "config",
        "config loading",
        "topology",
        "zero_topo",
        "model",
        "checkpoint",
        "metrics",
        "analysis",
        "run control",
    },
    "entry points": {
        "util",
        "kernels",
        "data",
        "config",
        "config loading",
        "topology",
        "zero_topo",
        "model",
        "checkpoint",
        "metrics",
        "analysis",
        "run control",
        "training",
    },
}


# ------------------------------------------------------------------------------ reading the source
def package_sources(root: Path = ROOT) -> dict:
    """{module name: (path relative to the repository, is a package, source text)} of every module."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (str(rel), is_pkg, path.read_text())
    return out


def _type_checking_nodes(tree: ast.AST) -> set:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never executed)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imports(sources: dict) -> list:
    """Every import of one package module by another: (path, line, from-module, to-module)."""
    out = []
    for mod, (path, is_pkg, text) in sources.items():
        tree = ast.parse(text, filename=path)
        skip = _type_checking_nodes(tree)
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in sources else name for a in node.names]
            for t in targets:
                if t != PACKAGE and not t.startswith(PACKAGE + "."):
                    continue
                while t not in sources and "." in t:  # megatron_topo.x.attr -> megatron_topo.x
                    t = t.rpartition(".")[0]
                if t != mod and (path, node.lineno, mod, t) not in out:
                    out.append((path, node.lineno, mod, t))
    return out


def layer_of(mod: str, is_pkg: bool = False) -> str:
    key = mod + ".__init__" if is_pkg and mod + ".__init__" in LAYER_OF else mod
    best = None
    for k in LAYER_OF:
        if (key == k or key.startswith(k + ".")) and (best is None or len(k) > len(best)):
            best = k
    if best is None:
        raise AssertionError(f"{mod}: no layer in LAYER_OF; place it (and update docs/design.md §2)")
    return LAYER_OF[best]


# ------------------------------------------------------------------------------ the checks
def layer_violations(sources: dict) -> list:
    """One line per import that goes to a layer the importer may not use."""
    bad = []
    for path, line, a, b in imports(sources):
        la, lb = layer_of(a, sources[a][1]), layer_of(b, sources[b][1])
        if la != lb and lb not in MAY_IMPORT[la]:
            bad.append(
                f"{path}:{line}: {a} ({la}) -> {b} ({lb}); {la} may import only "
                f"{', '.join(sorted(MAY_IMPORT[la])) or 'nothing of ours'}"
            )
    return bad


def import_cycles(sources: dict) -> list:
    """One line per strongly connected component of more than one module (Tarjan), naming the
    imports inside it."""
    edges: dict = {}
    where: dict = {}
    for path, line, a, b in imports(sources):
        edges.setdefault(a, set()).add(b)
        where.setdefault((a, b), f"{path}:{line}")
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], itertools.count()

    def visit(v):  # iterative Tarjan (no recursion limit)
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = next(counter)
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = next(counter)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        sccs.append(sorted(comp))

    for v in sorted(sources):
        if v not in index:
            visit(v)
    out = []
    for comp in sccs:
        inside = sorted(f"{where[(a, b)]}: {a} -> {b}" for a in comp for b in edges.get(a, ()) if b in comp)
        out.append(f"import cycle of {len(comp)} modules: " + "; ".join(inside))
    return out


# ------------------------------------------------------------------------------ tests
def test_every_module_has_a_layer():
    sources = package_sources()
    assert len(sources) > 50
    for mod, (_, is_pkg, _) in sources.items():
        assert layer_of(mod, is_pkg) in MAY_IMPORT
    with pytest.raises(AssertionError, match="megatron_topo.new_loose_module: no layer in LAYER_OF"):
        layer_of("megatron_topo.new_loose_module")  # a new top-level module must be placed, not defaulted


def test_layers_hold():
    bad = layer_violations(package_sources())
    assert not bad, "imports against the layers of docs/design.md §2:\n" + "\n".join(bad)


def test_no_import_cycle():
    cycles = import_cycles(package_sources())
    assert not cycles, "\n".join(cycles)


def _planted(extra: dict) -> dict:
    return {mod: (mod.replace(".", "/") + ".py", False, text) for mod, text in extra.items()}


def test_self_check_planted_back_import_fails_naming_it():
    """A back-import inside a function (config -> checkpoint) and the cycle it closes are both
    reported with the file, the line and the two modules."""
    sources = _planted(
        {
            "megatron_topo.config.schema": "import os\n\n\ndef f():\n    from ..zero_topo.checkpoint import live\n",
            "megatron_topo.zero_topo.checkpoint.live": "from ...config.schema import Config\n",
        }
    )
    sources["megatron_topo.zero_topo.checkpoint"] = ("megatron_topo/zero_topo/checkpoint/__init__.py", True, "")
    bad = layer_violations(sources)
    assert bad == [
        "megatron_topo/config/schema.py:5: megatron_topo.config.schema (config) -> "
        "megatron_topo.zero_topo.checkpoint.live (checkpoint); config may import only data, run control, util"
    ]
    assert import_cycles(sources) == [
        "import cycle of 2 modules: megatron_topo/config/schema.py:5: megatron_topo.config.schema -> "
        "megatron_topo.zero_topo.checkpoint.live; megatron_topo/zero_topo/checkpoint/live.py:1: "
        "megatron_topo.zero_topo.checkpoint.live -> megatron_topo.config.schema"
    ]


def test_self_check_type_checking_and_absolute_imports():
    sources = _planted(
        {
            "megatron_topo.topology": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from megatron_topo.training import trainer\n",
            "megatron_topo.training.trainer": "import megatron_topo.topology as t\n",
            "megatron_topo.data.atomic": "import megatron_topo.metrics\n",
            "megatron_topo.metrics": "",
        }
    )
    assert imports(sources) == [
        ("megatron_topo/training/trainer.py", 1, "megatron_topo.training.trainer", "megatron_topo.topology"),
        ("megatron_topo/data/atomic.py", 1, "megatron_topo.data.atomic", "megatron_topo.metrics"),
    ]
    assert layer_violations(sources) == [
        "megatron_topo/data/atomic.py:1: megatron_topo.data.atomic (data) -> megatron_topo.metrics (metrics); "
        "data may import only util"
    ]


def test_self_check_plant_into_the_real_package():
    """The real package with one planted function-level back-import fails naming that import."""
    sources = package_sources()
    path, is_pkg, text = sources["megatron_topo.config.options"]
    n = text.count("\n") + 1
    sources["megatron_topo.config.options"] = (
        path,
        is_pkg,
        text + "\n\ndef _planted():\n    from ..training import trainer\n",
    )
    bad = layer_violations(sources)
    assert any(
        b.startswith(
            f"{path}:{n + 3}: megatron_topo.config.options (config) -> megatron_topo.training.trainer (training)"
        )
        for b in bad
    ), bad
