"""Helpers shared by the data tests (no tests here): an independent MMIDIDX writer/reader written
from the format description (struct, not our code), a CLI runner, and a small tokenizer corpus."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
# GPT-NeoX dtype codes, from the format description.
CODES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f4", 7: "<f8", 8: "<u2"}


def pack_index(code: int, sizes, doc_idx=None, itemsize=None) -> bytes:
    """An .idx file, byte by byte: magic, <Q version 1, <B dtype code, <Q sequences, <Q len(doc_idx),
    int32 sizes, int64 byte pointers, int64 doc_idx."""
    sizes = list(sizes)
    itemsize = itemsize or np.dtype(CODES[code]).itemsize
    doc_idx = list(range(len(sizes) + 1)) if doc_idx is None else list(doc_idx)
    pointers, at = [], 0
    for s in sizes:
        pointers.append(at)
        at += s * itemsize
    out = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    out += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
    out += struct.pack(f"<{len(sizes)}i", *sizes) + struct.pack(f"<{len(sizes)}q", *pointers)
    out += struct.pack(f"<{len(doc_idx)}q", *doc_idx)
    return out


def write_pair(prefix: str, code: int, docs, doc_idx=None) -> None:
    """PREFIX.bin/.idx holding ``docs`` (lists of ints) as sequences, written with struct only."""
    fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "f", 7: "d", 8: "H"}[code]
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{fmt}", *d))
    with open(prefix + ".idx", "wb") as f:
        f.write(pack_index(code, [len(d) for d in docs], doc_idx))


def read_pair(prefix: str):
    """Independent reader: (dtype code, list of sequences as lists, doc_idx list)."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    (code,) = struct.unpack_from("<B", idx, 17)
    n, d = struct.unpack_from("<QQ", idx, 18)
    off = 34
    sizes = struct.unpack_from(f"<{n}i", idx, off)
    pointers = struct.unpack_from(f"<{n}q", idx, off + 4 * n)
    doc_idx = struct.unpack_from(f"<{d}q", idx, off + 12 * n)
    assert len(idx) == off + 12 * n + 8 * d
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    dt = np.dtype(CODES[code])
    seqs = [np.frombuffer(data, dt, s, p).tolist() for s, p in zip(sizes, pointers)]
    return code, seqs, list(doc_idx)


def run_tool(name: str, *args, check: bool = False):
    """Run tools/NAME.py in a subprocess; returns the CompletedProcess (text mode)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [PY, os.path.join(REPO, "tools", f"{name}.py"), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}): {proc.stderr}")
    return proc


def error_line(proc) -> str:
    """The single error line a failing tool printed (progress bars aside)."""
    lines = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def write_jsonl(path: str, docs, compress: bool = False) -> str:
    data = b"".join((d if isinstance(d, bytes) else json.dumps(d).encode()) + b"\n" for d in docs)
    if compress:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def vm_rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


# texts every tokenizer must round-trip exactly
SAMPLES = [
    "",
    "hello world",
    " leading space",
    "trailing  \n",
    "tabs\tand\nnewlines\n\n  indented",
    "héllo wörld — naïve café",
    "日本語のテキスト",
    "emoji 🙂👍 mixed",
    "def f(x):\n    return x ** 2\n",
    "   ",
    "a" * 300,
    "numbers 1234567890 3.14159",
]


def write_corpus(directory) -> str:
    """The SAMPLES plus six standard-library sources as a JSONL corpus; returns its path."""
    import sysconfig

    docs = [{"text": s} for s in SAMPLES if s]
    stdlib = sysconfig.get_paths()["stdlib"]
    for name in ("textwrap.py", "string.py", "glob.py", "fnmatch.py", "bisect.py", "shlex.py"):
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            docs.append({"text": f.read(), "meta": {"pile_set_name": "stdlib"}})
    return write_jsonl(os.path.join(directory, "corpus.jsonl"), docs)
