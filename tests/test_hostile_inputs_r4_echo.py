"""Hostile inputs, round 4 (issue 29; an independent probe): four families, several members each.

* Echo: a value from a user's file, a CLI argument or an environment variable reaching an
  ``error:`` line is shown as a short escaped excerpt, and every printer of such lines escapes
  control characters and caps the line (megatron_topo/error_lines.py): exactly one line, at most
  600 characters, no raw control byte, nothing on disk changed, within 30 s.
* Run lock: a FIFO (or folder, symlink, huge file) at ``.megatron_topo.lock`` is one line, not a
  hang; a record with an impossible pid (2**80, 0, negative, a string...) is a corrupt lock (one
  line while its lease runs, taken over after), not an OverflowError.
* Config YAML: a recursive alias, nesting past the bound, in a file or a ``--set`` value: one line.
* Kernel cache: symbolic links on the way to the cache are followed and what they lead to is
  checked like any other parent (tests/test_hostile_inputs_kernel_cache.py has the other members).
"""

import json
import os
import shutil
import signal
import socket
import time

import pytest

from megatron_topo import error_lines, pids, runlock
from megatron_topo.commands import inspect_data
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError
from megatron_topo.config.yaml_io import parse_yaml
from megatron_topo.training import fault_injection

from . import test_hostile_inputs_kernel_cache as kc
from .cli_cases import call, one_error_line, scratch
from .test_hostile_inputs_r3 import snap, world  # noqa: F401  (world: the module's fixture)

T = train_cli.main
ESC = "\x1b[2J\x1b]0;x\x07"
CONTROL = [chr(c) for c in range(32)] + ["\x7f"]


def S(*sets):
    out = ["cfg.yml"]
    for s in sets:
        out += ["--set", s]
    return out


def _write(rel, text):
    def f(d):
        (d / rel).write_text(text)

    return f


def _hf_model_type(d):
    p = d / "hf" / "config.json"
    data = json.loads(p.read_text())
    data["model_type"] = ESC + "Z" * 3000
    p.write_text(json.dumps(data))


def _env(name, value):
    def f(d):
        os.environ[name] = value

    return f


def _lock(record):
    def f(d):
        (d / "sv").mkdir()
        text = record if isinstance(record, str) else json.dumps(record)
        (d / "sv" / runlock.LOCK_NAME).write_text(text)

    return f


def _odd_lock(kind, folder="sv"):
    def f(d):
        (d / folder).mkdir()
        p = d / folder / runlock.LOCK_NAME
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            p.mkdir()
        elif kind == "symlink":
            (d / "elsewhere.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
            os.symlink(d / "elsewhere.json", p)

    return f


HOST = socket.gethostname()

# (id, entry, argv, mutate, exit code, text the line holds)
CASES = [
    # -- echo: values from files, arguments and the environment
    ("echo-hf-model-type", T, S("finetune_from=hf"), _hf_model_type, 2, "model_type '\\x1b[2J"),
    ("echo-set-string", T, S("tokenizer_type=" + ESC + "Q" * 2000), None, 2, "tokenizer_type='\\x1b[2J"),
    (
        "echo-yaml-value",
        T,
        ["cfg.yml", "y.yml"],
        _write("y.yml", 'tokenizer_type: "\\e[2J' + "Q" * 3000 + '"\n'),
        2,
        "tokenizer_type='\\x1b[2J",
    ),
    ("echo-env-fault", T, S("train_iters=1"), _env(fault_injection.ENV, "x" * 100_000), 2, "MEGATRON_TOPO_FAULT"),
    ("echo-env-fault-escape", T, S("train_iters=1"), _env(fault_injection.ENV, "kill:" + ESC * 300), 2, "\\x1b"),
    ("echo-file-name", T, ["cfg" + ESC + "W" * 3000 + ".yml"], None, 2, "config file cfg\\x1b[2J"),
    ("echo-long-key-yaml", T, ["cfg.yml", "k.yml"], _write("k.yml", "k" * 1000 + ": 1\n"), 2, "unknown key 'kkkk"),
    ("echo-long-key-set", T, S("k" * 5000 + "=" + ESC), None, 2, "unknown key 'kkkk"),
    ("echo-key-escape", T, ["cfg.yml", "k.yml"], _write("k.yml", '"a\\e[31mb": 1\n'), 2, "unknown key 'a\\x1b[31mb'"),
    ("echo-set-huge-int", T, S("train_iters=" + "1" * 5000), None, 2, "an integer of 5,000 digits"),
    ("echo-yaml-huge-int", T, ["cfg.yml", "n.yml"], _write("n.yml", "train_iters: " + "1" * 5000 + "\n"), 2, "5,000"),
    ("echo-tool-file-name", inspect_data.main, ["data/" + ESC + "n" * 2000], None, 1, "\\x1b[2J"),
    # -- run lock
    ("lock-fifo-save", T, S("save=sv"), _odd_lock("fifo"), 2, "is a FIFO, not a lock file"),
    ("lock-fifo-log-dir", T, S("log_dir=lg"), _odd_lock("fifo", "lg"), 2, "is a FIFO, not a lock file"),
    ("lock-is-a-directory", T, S("save=sv"), _odd_lock("dir"), 2, "is a directory, not a lock file"),
    ("lock-is-a-symlink", T, S("save=sv"), _odd_lock("symlink"), 2, "is a symbolic link, not a lock file"),
    ("lock-pid-huge", T, S("save=sv"), _lock({"host": HOST, "pid": 2**80}), 2, "pid 1208925819614629174706176"),
    ("lock-pid-negative", T, S("save=sv"), _lock({"host": HOST, "pid": -1}), 2, "pid -1 (a process id"),
    ("lock-pid-zero", T, S("save=sv"), _lock({"host": HOST, "pid": 0}), 2, "pid 0 (a process id"),
    ("lock-pid-string", T, S("save=sv"), _lock({"host": HOST, "pid": "12"}), 2, "pid '12'"),
    ("lock-pid-float", T, S("save=sv"), _lock({"host": HOST, "pid": 1.5}), 2, "pid 1.5"),
    ("lock-host-missing", T, S("save=sv"), _lock({"pid": 5}), 2, "host missing"),
    ("lock-host-escape", T, S("save=sv"), _lock({"host": ESC * 500, "pid": 5}), 2, "host '\\x1b[2J"),
    ("lock-huge-file", T, S("save=sv"), _lock(" " * (1 << 20) + "{}"), 2, "not a JSON record"),
    # -- config YAML
    ("yaml-anchor-recursive", T, ["cfg.yml", "x.yml"], _write("x.yml", "a: &a [*a]\n"), 2, "x.yml: a recursive alias"),
    ("yaml-anchor-recursive-map", T, ["cfg.yml", "x.yml"], _write("x.yml", "a: &a {b: *a}\n"), 2, "recursive alias"),
    ("yaml-anchor-recursive-set", T, S("model=&a [*a]"), None, 2, "--set model=&a [*a]: a recursive alias"),
    ("yaml-deep-list", T, ["cfg.yml", "x.yml"], _write("x.yml", "a: " + "[" * 10000 + "]" * 10000), 2, "x.yml:"),
    ("yaml-deep-map", T, ["cfg.yml", "x.yml"], _write("x.yml", "a: " + "{b: " * 10000 + "1" + "}" * 10000), 2, "x.yml"),
    ("yaml-nested-150", T, ["cfg.yml", "x.yml"], _write("x.yml", "a: " + "[" * 150 + "]" * 150), 2, "levels deep"),
    ("json-nested-500", T, ["cfg.yml", "x.json"], _write("x.json", '{"a": ' + "[" * 500 + "]" * 500 + "}"), 2, "deep"),
]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_r4(case, world, tmp_path, monkeypatch, capfd):  # noqa: F811
    cid, entry, argv, mutate, code, needle = case
    d = scratch(world, tmp_path, monkeypatch)
    monkeypatch.delenv(fault_injection.ENV, raising=False)
    if mutate:
        mutate(d)
    before = snap(d)
    capfd.readouterr()
    old = signal.signal(signal.SIGALRM, _alarm)  # a blocking open() of a FIFO fails the test, not hangs it
    signal.alarm(60)
    t0 = time.perf_counter()
    try:
        rc = call(entry, argv)
    except _Hang:
        pytest.fail(f"{cid}: still running after 60 s (a hang)")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.environ.pop(fault_injection.ENV, None)
    took = time.perf_counter() - t0
    line = one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert len(line) <= error_lines.LINE_CAP, len(line)
    assert not any(c in line for c in CONTROL), ascii(line)
    assert took < 30, f"{cid} took {took:.1f} s"
    after = {k: v for k, v in snap(d).items() if not k.startswith("cache/")}
    before = {k: v for k, v in before.items() if not k.startswith("cache/")}
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


# ------------------------------------------------------------------------------ the last line of defence
@pytest.mark.parametrize(
    "text", ["plain", ESC + "x" * 3000, "y" * 100_000, "a\u202eb\u2028c\ud800\x00\x7f\x9b", "\n".join(["z" * 900] * 3)]
)
def test_clean_line_is_short_escaped_and_readable(text):
    line = error_lines.clean("error: " + text)
    assert len(line) <= error_lines.LINE_CAP
    assert not any(c in line for c in CONTROL + ["\u202e", "\u2028", "\ud800", "\x9b"]), ascii(line)
    if len(text) < 500 and text.isprintable():
        assert line == "error: " + text  # short plain text is untouched
    if text.startswith(ESC):
        assert (
            line.startswith("error: \\x1b[2J\\x1b]0;x\\x07xxx") and f"cut: {len(text) + 7:,} characters in all" in line
        )


def test_fail_prints_one_clean_line_per_problem(capfd):
    from megatron_topo.cli import fail

    e = ConfigError("bad value " + ESC + "q" * 5000)
    assert fail(e) == 2
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and len(err[0]) <= error_lines.LINE_CAP and "\x1b" not in err[0], err


# ------------------------------------------------------------------------------ run lock: the policy kept
def test_corrupt_lock_past_its_lease_is_taken_over(tmp_path, capsys):
    """A record with an impossible pid is judged by its lease like any other corrupt lock: taken
    over (one line) once not renewed for LEASE_S seconds."""
    d = tmp_path / "sv"
    d.mkdir()
    p = d / runlock.LOCK_NAME
    p.write_text(json.dumps({"host": HOST, "pid": 2**80}))
    old = time.time() - runlock.LEASE_S - 10
    os.utime(p, (old, old))
    lines = []
    lock = runlock.RunLock(log=lines.append)
    lock.acquire(str(d), "checkpoint.save")
    try:
        assert json.loads(p.read_text())["pid"] == os.getpid()
        assert len(lines) == 1 and "lease expired" in lines[0] and "pid 1208925819614629174706176" in lines[0]
    finally:
        lock.release()
    assert not p.exists()


@pytest.mark.parametrize("pid", [2**80, -1, 0, "12", 1.5, True, None, [1]])
def test_pid_alive_is_false_for_what_cannot_be_a_pid(pid):
    assert pids.pid_alive(pid) is False


def test_pid_alive_still_sees_live_processes():
    assert pids.pid_alive(os.getpid()) is True
    assert pids.pid_alive(1) is True  # init (or the container's first process): another user's counts


# ------------------------------------------------------------------------------ config YAML
@pytest.mark.parametrize(
    "text",
    ["a: &a [*a]", "a: &a {b: *a}", "a: &a {b: [1, {c: *a}]}", "a: [&a [1, *a]]", "x: &x [1]\na: &a {b: *x, c: [*a]}"],
)
def test_recursive_alias_is_one_config_error(text):
    with pytest.raises(ConfigError, match=r"^x\.yml: a recursive alias"):
        parse_yaml(text, "x.yml")


def test_shared_aliases_are_still_read():
    data = parse_yaml("x: &x [1, 2]\ny: [*x, *x]\nz: {a: *x}\n", "x.yml")
    assert data == {"x": [1, 2], "y": [[1, 2], [1, 2]], "z": {"a": [1, 2]}}


# ------------------------------------------------------------------------------ kernel cache: symlinks on the way
lib_name = kc.lib_name  # the module-scoped fixture: the build's library name and a planted library
needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)


def _open_folder(path):
    path.mkdir()
    os.chmod(path, 0o777)  # world-writable, no sticky bit
    return path


@needs_cc
def test_symlinked_ancestor_to_a_folder_others_can_write(lib_name, tmp_path):  # noqa: F811
    """The probe's case: lnk -> shared (0777, no sticky bit), cache lnk/kc (ours, 0700, holding a
    planted library with its record): refused, nothing loaded (was: built and loaded there)."""
    shared = _open_folder(tmp_path / "shared")
    kc._plant(shared / "kc", lib_name, mode=0o700)
    os.symlink(shared, tmp_path / "lnk")
    out, err = kc._run({kc.CF.CACHE_ENV: str(tmp_path / "lnk" / "kc")}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "writable by others" in out and "no sticky bit" in out, out
    assert len(err) == 1 and err[0].startswith("warning: kernel cache"), err


@needs_cc
def test_symlink_inside_the_chain(lib_name, tmp_path):  # noqa: F811
    """mine (0700)/hop -> ../shared/deep (shared: 0777, no sticky bit); cache mine/hop/kc."""
    shared = _open_folder(tmp_path / "shared")
    (shared / "deep").mkdir()
    kc._plant(shared / "deep" / "kc", lib_name, mode=0o700)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.symlink("../shared/deep", mine / "hop")
    out, err = kc._run({kc.CF.CACHE_ENV: str(mine / "hop" / "kc")}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "writable by others" in out, out


@needs_cc
def test_cache_folder_itself_a_symlink_to_a_foreign_folder(lib_name, tmp_path):  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("another user's folder needs root (chown)")
    kc._plant(tmp_path / "theirs", lib_name, owner=65534, mode=0o755)
    os.symlink(tmp_path / "theirs", tmp_path / "kc")
    out, err = kc._run({kc.CF.CACHE_ENV: str(tmp_path / "kc")}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "symbolic link" in out, out


@needs_cc
def test_symlink_on_the_way_owned_by_another_user(lib_name, tmp_path):  # noqa: F811
    """A link in a sticky world-writable folder (like /tmp) owned by someone else: they can point it
    elsewhere at any time, so the cache behind it is not used, even though it is ours."""
    if os.geteuid() != 0:
        pytest.skip("another user's link needs root (lchown)")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    kc._plant(mine / "kc", lib_name, mode=0o700)
    os.symlink(mine, sticky / "via")
    os.lchown(sticky / "via", 65534, 65534)
    out, err = kc._run({kc.CF.CACHE_ENV: str(sticky / "via" / "kc")}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "symbolic link owned by" in out, out


@needs_cc
def test_symlink_to_our_own_private_folder_is_used(lib_name, tmp_path):  # noqa: F811
    """No false refusal: a link of ours to a private folder of ours builds and loads there."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    os.symlink(mine, tmp_path / "link")
    out, err = kc._run({kc.CF.CACHE_ENV: str(tmp_path / "link" / "kc")}, tmp_path)
    assert out.startswith("available") and err == [], (out, err)
    assert sorted(os.listdir(mine / "kc")) == sorted([lib_name[0], lib_name[0] + ".sha256"])
    shutil.rmtree(mine)


def test_argument_error_keeps_its_message_and_shortens_a_long_usage(capfd):
    """An argparse error of a tool with a long usage (preprocess_data: ~850 characters) and an
    argument holding escape sequences: one line, the message whole and escaped, the usage cut."""
    from megatron_topo.commands import preprocess_data

    argv = ["--input", "x", "--output-prefix", "o", "--tokenizer-type", "ByteLevel", "--no-such-flag" + ESC + "f" * 300]
    rc = call(preprocess_data.main, argv)
    line = one_error_line(capfd)
    assert rc == 1  # preprocess_data's status for bad arguments (GPT-NeoX's)
    assert line.startswith("error: unrecognized arguments: --no-such-flag\\x1b[2J\\x1b]0;x\\x07fff"), line
    assert "f" * 300 in line and line.endswith(" ... see --help)"), line
    assert len(line) <= error_lines.LINE_CAP and not any(c in line for c in CONTROL), ascii(line)


@pytest.mark.parametrize("value", ["abc", "nan", "-5", "1e999", ESC + "x" * 2000])
def test_lock_lease_env_that_is_not_a_duration(value, world, tmp_path, monkeypatch):  # noqa: F811
    """$MEGATRON_TOPO_LOCK_LEASE_S is read at import: a bad value was a ValueError traceback there
    (or a lease of nan/-5 s that made every lock stale at once); now one line when a lock is taken."""
    import subprocess
    import sys

    from .cli_cases import ROOT

    d = scratch(world, tmp_path, monkeypatch)
    before = snap(d)
    env = {k: v for k, v in os.environ.items() if k not in (fault_injection.ENV, "WORLD_SIZE", "RANK")}
    env.update({runlock.LEASE_ENV: value, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *S("save=sv", "train_iters=1")],
        cwd=d,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"error: {runlock.LEASE_ENV}=") and "is not valid" in lines[0], lines
    assert len(lines[0]) <= error_lines.LINE_CAP and not any(c in lines[0] for c in CONTROL)
    assert {k: v for k, v in snap(d).items() if not k.startswith("cache/")} == {
        k: v for k, v in before.items() if not k.startswith("cache/")
    }
