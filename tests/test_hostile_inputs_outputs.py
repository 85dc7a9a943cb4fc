"""Issue 29, outputs: pairs of files replaced as a unit, replaced folders never missing, temporary
folders of killed tools cleaned, and worker pools that die with their parent.

A crash is a real one where it matters (``os._exit`` in a child process at the chosen point, or
SIGKILL): nothing in the dying process gets to clean up."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from megatron_topo.data import MMapIndexedDataset, MMapIndexedDatasetBuilder
from megatron_topo.data.pair_commit import finish_interrupted, journal_path

from .cli_cases import ROOT, build_hostile_world, call, scratch


def _docs(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 60000, 40) for _ in range(32)]  # same sizes for every seed: same-size .bin/.idx


def _write(prefix, seed):
    with MMapIndexedDatasetBuilder(str(prefix)) as b:
        for d in _docs(seed):
            b.add_document(d)
        b.finalize()


def _read(prefix):
    ds = MMapIndexedDataset(str(prefix))
    return [np.asarray(ds[i]).copy() for i in range(len(ds))]


def _same(got, want):
    return len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def _run_child(code, timeout=60):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


CRASH_AT_RENAME = """
import os, sys
sys.path.insert(0, {root!r})
from megatron_topo.data import pair_commit
from tests.test_hostile_inputs_outputs import _write
real, n = os.replace, [0]
def replace(a, b):
    n[0] += str(b).endswith((".bin", ".idx"))  # the pair's renames (not the journal's own write)
    if n[0] == {at}:
        os._exit(9)  # killed here: no cleanup of any kind
    return real(a, b)
pair_commit.os.replace = replace
_write({prefix!r}, 2)
"""


@pytest.mark.parametrize("at", [1, 2], ids=["before-bin-rename", "between-bin-and-idx-renames"])
def test_dataset_pair_killed_during_its_replacement_is_never_mixed(at, tmp_path):
    """A writer killed at either rename of .bin/.idx: the next reader finishes the replacement
    (was: new .bin with old .idx -- same sizes here, so nothing noticed the mix, and the previous
    dataset was gone)."""
    prefix = tmp_path / "ds"
    _write(prefix, 1)
    r = _run_child(CRASH_AT_RENAME.format(root=ROOT, at=at, prefix=str(prefix)))
    assert r.returncode == 9, r.stderr[-2000:]
    assert os.path.exists(journal_path(str(prefix)))  # the switch was journalled before the first rename
    assert _same(_read(prefix), _docs(2))  # the reader completed it: the new pair, both files
    assert not os.path.exists(journal_path(str(prefix)))
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx"]


def test_dataset_pair_killed_before_the_switch_keeps_the_previous_one(tmp_path):
    prefix = tmp_path / "ds"
    _write(prefix, 1)
    code = CRASH_AT_RENAME.replace(
        "pair_commit.os.replace = replace", "pair_commit.write_text = lambda *a, **k: os._exit(9)"
    )
    r = _run_child(code.format(root=ROOT, at=0, prefix=str(prefix)))
    assert r.returncode == 9, r.stderr[-2000:]
    assert not os.path.exists(journal_path(str(prefix)))
    assert _same(_read(prefix), _docs(1))


def test_dataset_pair_error_between_renames_does_not_discard_the_journalled_files(tmp_path, monkeypatch):
    """An exception (not a kill) after the first rename: the builder's abort must not delete the
    journalled .idx, or the pair would be mixed for good."""
    from megatron_topo.data import pair_commit

    prefix = tmp_path / "ds"
    _write(prefix, 1)
    real, n = os.replace, [0]

    def replace(a, b):
        n[0] += str(b).endswith((".bin", ".idx"))
        if n[0] == 2:
            raise OSError(5, "Input/output error")
        return real(a, b)

    monkeypatch.setattr(pair_commit.os, "replace", replace)
    with pytest.raises(OSError):
        _write(prefix, 2)
    monkeypatch.setattr(pair_commit.os, "replace", real)
    assert _same(_read(prefix), _docs(2))


def test_foreign_journal_is_refused(tmp_path):
    prefix = tmp_path / "ds"
    _write(prefix, 1)
    with open(journal_path(str(prefix)), "w") as f:
        f.write('{"bin": "../../etc/passwd", "idx": "ds.idx.tmp.1"}')
    from megatron_topo.data import DataError

    before = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    with pytest.raises(DataError, match="not a replacement journal"):
        finish_interrupted(str(prefix))
    with pytest.raises(DataError, match="not a replacement journal"):
        MMapIndexedDataset(str(prefix))
    assert {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)} == before


# ------------------------------------------------------------------------------ convert_to_hf --force
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_hostile_world(tmp_path_factory.mktemp("outputs"))


CONVERT_CRASH = """
import os, sys, shutil
sys.path.insert(0, {root!r})
os.chdir({cwd!r})
from megatron_topo.commands import convert_to_hf as H
{patch}
H.main(["--checkpoint", "ck", "--output", "hf", "--force"])
"""


def _hf_files(d):
    return sorted(os.listdir(d / "hf")) if (d / "hf").is_dir() else None


@pytest.mark.parametrize("how", ["exchange", "two-renames"])
def test_convert_force_killed_while_replacing_never_loses_the_output(how, world, tmp_path, monkeypatch, capfd):
    """Killed at the switch, the output folder is either the old export or the new one, and the
    next conversion removes (or puts back) what the killed one left (was: the output vanished and
    the copies stayed as hidden folders for good)."""
    d = scratch(world, tmp_path, monkeypatch)
    from megatron_topo.commands import convert_to_hf as H

    assert call(H.main, ["--checkpoint", "ck", "--output", "hf"]) == 0
    first = {f: (d / "hf" / f).read_bytes() for f in os.listdir(d / "hf")}
    if how == "exchange":  # killed after the atomic swap, before the old copy is removed
        patch = "H.shutil.rmtree = lambda p, **k: os._exit(9) if os.path.exists(p) else None"
    else:  # no renameat2: killed between moving the old output aside and moving the new one in
        patch = (
            "H._exchange = lambda a, b: False\nreal = os.replace\nn = [0]\n"
            "def rep(a, b):\n    n[0] += 1\n    if n[0] == 2: os._exit(9)\n    return real(a, b)\n"
            "H.os.replace = rep"
        )
    r = _run_child(CONVERT_CRASH.format(root=ROOT, cwd=str(d), patch=patch))
    assert r.returncode == 9, r.stderr[-2000:]
    hidden = [n for n in os.listdir(d) if n.startswith(".hf.tmp.")]
    assert hidden, os.listdir(d)  # what the killed run left
    if how == "exchange":
        assert _hf_files(d) == sorted(first)  # the new export is in place (same bytes: same checkpoint)
    else:
        assert _hf_files(d) is None  # the moment the old implementation could not undo
    capfd.readouterr()
    assert call(H.main, ["--checkpoint", "ck", "--output", "hf", "--force"]) == 0
    err = capfd.readouterr().err
    assert ("restored hf from .hf.tmp." if how == "two-renames" else "left by a killed conversion") in err, err
    assert [n for n in os.listdir(d) if n.startswith(".hf.tmp.")] == []
    assert {f: (d / "hf" / f).read_bytes() for f in os.listdir(d / "hf")} == first


def test_convert_leaves_temporaries_of_live_conversions_alone(world, tmp_path, monkeypatch):
    d = scratch(world, tmp_path, monkeypatch)
    from megatron_topo.commands import convert_to_hf as H

    live = d / f".hf.tmp.{os.getpid()}"  # this process is alive: another conversion's folder in use
    live.mkdir()
    assert H.clean_stale_temporaries(str(d / "hf")) == []
    assert live.is_dir()


# ------------------------------------------------------------------------------ preprocess workers
PREPROCESS_BLOCKED = """
import sys, time
sys.path.insert(0, {root!r})
from megatron_topo.data import preprocess as P
def blocked(*a, **k):
    print("READY", flush=True)
    time.sleep(600)
    yield from ()
P.iter_source_chunks = blocked
P.preprocess([{inp!r}], {out!r}, workers=2)
"""


def _children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p))
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find the workers")
def test_killed_preprocess_takes_its_workers_with_it(tmp_path):
    """SIGKILL to a preprocess with --workers 2 (while its workers are up): they are gone within
    seconds (was: alive for good)."""
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "hello"}\n')
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    p = subprocess.Popen(
        [sys.executable, "-c", PREPROCESS_BLOCKED.format(root=ROOT, inp=str(inp), out=str(tmp_path / "out"))],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = []
    try:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()[-2000:] if p.poll() is not None else ""
        deadline = time.time() + 20
        while time.time() < deadline:
            workers = [c for c in _children(p.pid) if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2, _children(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
        assert not left, f"workers {left} outlived their parent"
    finally:
        for w in workers:  # only the workers this test started
            try:
                os.kill(w, signal.SIGKILL)
            except OSError:
                pass
        if p.poll() is None:
            p.kill()
