"""Every citation of a document section or a paper resolves inside the repository (issue 16).

Over the repository's .py/.md/.yml/.sh files (git's tracked and not-ignored files):

* each ``docs/NAME.md §N`` (or ``NAME.md §N``) citation (lists such as ``§4.8, §7.1`` or
  ``§4.8 and §4.10`` and ranges such as ``§4.1–4.4`` included) names a numbered heading of
  docs/NAME.md; the bare ``§N`` of docs/design.md and docs/frontier.md name their own headings,
  unless they follow a paper's name (``Singh §6.3.1``, ``seed 004 §6.2.1``);
* nothing cites the design notes that lived outside the repository (``DESIGN §N``, ``DESIGN.md``);
* every paper number cited as ``seed 00N`` or ``[S00N]`` has its entry in docs/references.md;
* no ``§`` follows an issue number (issues have numbered items, not sections);
* every file path docs/design.md and docs/references.md name (``zero_topo/kernels/reference.py``,
  ``zero_topo/volumes.ring_bytes``) exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = "tests/test_docs_citations.py"  # its examples are not citations
SUFFIXES = (".py", ".md", ".yml", ".sh")
SECTION = r"\d+(?:\.\d+)*"
# "docs/design.md §4.8", "design.md §4.2, §4.8", "docs/design.md §4.8 and §4.10", "§4.1–4.4"
DOC_CITATION = re.compile(
    r"(?<![\w./-])(?P<prefix>docs/)?(?P<name>[A-Za-z_][\w-]*)\.md"
    rf"(?P<refs>\s+§\s?{SECTION}(?:\s*[–-]\s*§?{SECTION})?"
    rf"(?:(?:\s*,\s*|\s+and\s+)§\s?{SECTION}(?:\s*[–-]\s*§?{SECTION})?)*)"
)
SECTION_REF = re.compile(rf"§\s?({SECTION})(?:\s*[–-]\s*§?({SECTION}))?")
# Bare "§N" after one of these names a section of that paper, not of the document it is written in.
PAPER_BEFORE = re.compile(r"(?:Singh|ZeRO-topo|ZeRO\+\+|PaRO|AMSP|[Ss]eeds? \d{3}|\[S\d{3}\],?|Ch\. \d+,?)\s*$")
SELF_CITING = ("docs/design.md", "docs/frontier.md")
OLD_DESIGN = re.compile(r"DESIGN(?:\.md|\s*§)")
SEED = re.compile(r"(?<![-\w])[Ss]eeds? (0\d\d)\b(?: and (0\d\d)\b)?|\[S(0\d\d)\]")
ISSUE_SECTION = re.compile(r"\bissue \d+,? §")
HEADING = re.compile(rf"^#{{1,6}}\s+({SECTION})\.?\s", re.M)


@lru_cache(maxsize=None)
def repo_files() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return tuple(sorted({p for p in out.split("\0") if p.endswith(SUFFIXES) and p != THIS and (ROOT / p).is_file()}))


@lru_cache(maxsize=None)
def text(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8", errors="replace")


@lru_cache(maxsize=None)
def headings(doc: str) -> frozenset[str]:
    return frozenset(HEADING.findall(text(doc))) if (ROOT / doc).is_file() else frozenset()


def line_of(t: str, pos: int) -> int:
    return t.count("\n", 0, pos) + 1


def doc_citations(path: str, t: str):
    """(document, section, line) of every "NAME.md §N" citation in ``t``."""
    for m in DOC_CITATION.finditer(t):
        doc = f"docs/{m['name']}.md"  # "design.md §5" (inside docs/) is docs/design.md too
        for ref in SECTION_REF.finditer(m["refs"]):
            for sec in filter(None, ref.groups()):
                yield doc, sec, line_of(t, m.start())


def self_citations(doc: str, t: str):
    """(section, line) of the bare "§N" of ``doc`` that name its own sections."""
    for m in SECTION_REF.finditer(t):
        before = t[max(0, m.start() - 40) : m.start()]
        if re.search(r"\.md\s*$", before) or PAPER_BEFORE.search(before):
            continue
        for sec in filter(None, m.groups()):
            yield sec, line_of(t, m.start())


def unresolved() -> list[str]:
    bad = []
    for path in repo_files():
        t = text(path)
        for doc, sec, line in doc_citations(path, t):
            if sec not in headings(doc):
                bad.append(f"{path}:{line}: {doc} §{sec} is not a heading of {doc}")
        if path in SELF_CITING:
            for sec, line in self_citations(path, t):
                if sec not in headings(path):
                    bad.append(f"{path}:{line}: §{sec} is not a heading of {path}")
    return bad


def test_headings_are_parsed():
    """The checks below see the documents' numbered headings (a parser that saw none would pass)."""
    assert {"3.5", "4.2", "4.5", "4.6", "4.8", "4.9", "4.10", "5", "7.1"} <= headings("docs/design.md")
    assert {"1", "1.1", "1.5", "2"} <= headings("docs/references.md")
    assert {"1", "4", "4.1"} <= headings("docs/frontier.md")
    assert "docs/design.md" in repo_files() and "megatron_topo/zero_topo/layout.py" in repo_files()


def test_citation_parser():
    t = (
        "see docs/design.md §4.8, §7.1 and docs/design.md §4.8's table; docs/design.md §4.8 and §4.10; "
        "docs/design.md §4.1–4.4 (seed 004 §6.3.1); docs/frontier.md §4.1."
    )
    got = [(d, s) for d, s, _ in doc_citations("x.py", t)]
    assert got == [
        ("docs/design.md", "4.8"),
        ("docs/design.md", "7.1"),
        ("docs/design.md", "4.8"),
        ("docs/design.md", "4.8"),
        ("docs/design.md", "4.10"),
        ("docs/design.md", "4.1"),
        ("docs/design.md", "4.4"),
        ("docs/frontier.md", "4.1"),
    ]
    assert [s for s, _ in self_citations("docs/design.md", "(§4.5), Singh §5.2.2, seed 004 §6.2.1, §7")] == ["4.5", "7"]


def test_every_section_citation_names_a_heading():
    bad = unresolved()
    assert not bad, "citations of sections that do not exist:\n" + "\n".join(bad)


def test_a_planted_bad_citation_is_caught(monkeypatch):
    """The check can fail: a citation of a section design.md does not have is reported."""
    planted = "docs/_planted_citation.md"
    module, files, read = sys.modules[__name__], repo_files(), text
    monkeypatch.setattr(module, "repo_files", lambda: files + (planted,))
    monkeypatch.setattr(module, "text", lambda p: "the step (docs/design.md §4.11)\n" if p == planted else read(p))
    assert f"{planted}:1: docs/design.md §4.11 is not a heading of docs/design.md" in unresolved()


def test_no_citation_of_the_external_design_notes():
    bad = [f"{p}:{line_of(text(p), m.start())}: {m[0]!r}" for p in repo_files() for m in OLD_DESIGN.finditer(text(p))]
    assert not bad, "cite docs/design.md §N instead of:\n" + "\n".join(bad)


def test_every_cited_paper_has_an_entry_in_references():
    refs = text("docs/references.md")
    entries = set(re.findall(r"^#{1,6}\s+[\d.]+\s+seed (\d{3})\b", refs, re.M))
    cited = {}
    for p in repo_files():
        for m in SEED.finditer(text(p)):
            for n in filter(None, m.groups()):
                cited.setdefault(n, f"{p}:{line_of(text(p), m.start())}")
    assert cited, "no seed citation found: the pattern no longer matches the code's form"
    missing = {n: where for n, where in cited.items() if n not in entries}
    assert not missing, f"seed numbers cited but without a heading in docs/references.md: {missing}"
    assert "`seed 000`" in refs and "[S004]" in refs  # the citation forms are stated there


# Paths of other projects that docs/references.md names as sources.
EXTERNAL_PATHS = {"megatron/logging.py", "megatron/utils.py", "rccl/rccl_tuning_guide.md"}
FILE_PATH = re.compile(r"^[A-Za-z_][\w.-]*(/|(/[\w.-]+)+\.(py|yml|sh|md|c)|(/[\w.-]+)+/)$")
MODULE_SYMBOL = re.compile(r"^[a-z_]\w*(/[a-z_]\w*)+\.[A-Za-z_]\w*(\(\))?$")


@pytest.mark.parametrize("doc", ["docs/design.md", "docs/references.md"])
def test_every_file_path_in_the_design_documents_exists(doc):
    """`a/b.py`, `a/b/`, `a/b.symbol` in the two documents name files of this repository (paths are
    relative to the root or to megatron_topo/, docs/design.md's convention)."""
    bad = []
    for m in re.finditer(r"`([^`\s]+)[^`]*`", text(doc)):
        path = m[1].split("::")[0].rstrip(",:;")
        if path in EXTERNAL_PATHS or path.startswith("runs/"):
            continue
        if FILE_PATH.match(path):
            pass
        elif MODULE_SYMBOL.match(path):  # zero_topo/volumes.ring_bytes: the module's file
            path = path.rsplit(".", 1)[0] + ".py"
        else:
            continue  # a formula such as `L/2` or `2ψ/(NP)`, or a file name without a folder
        if not any((base / path).exists() for base in (ROOT, ROOT / "megatron_topo")):
            bad.append(f"{doc}:{line_of(text(doc), m.start())}: {m[1]}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def test_no_section_sign_after_an_issue_number():
    bad = [f"{p}:{line_of(text(p), m.start())}" for p in repo_files() for m in ISSUE_SECTION.finditer(text(p))]
    assert not bad, "issues have numbered items, not sections (write 'issue 14, found item 3'):\n" + "\n".join(bad)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
