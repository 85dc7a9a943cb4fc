"""Issue 29, security: no code from a folder another user can write. The compiled CPU kernel cache
is a folder of this user with mode 0700, and a cached library is loaded only when its SHA-256 is
the one recorded at its build. Two users are simulated with a folder of another owner (root can
chown it to nobody) or of a mode others can write, each holding a planted library under the name
the build would look for (and a record that matches it); loading it would create a marker file.
Each check runs in a fresh interpreter (the library is process-global once loaded)."""

import os
import shutil
import subprocess
import sys

import pytest

from megatron_topo.zero_topo.kernels import cpu_fast as CF

from .kernel_cases import ROOT

pytestmark = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)

PLANT_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *p = getenv("MT_PLANT_MARK");
    FILE *f = fopen(p ? p : "/tmp/mt_plant_mark", "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
int mt_abi_version(void) { return 1; }
"""

PROBE = (
    "from megatron_topo.zero_topo.kernels import cpu_fast as CF\n"
    "ok = CF.available()\n"
    "print('available' if ok else 'unavailable', CF.library_path() if ok else CF.unavailable_reason())\n"
)


def _run(env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (CF.CACHE_ENV, "XDG_CACHE_HOME", "TMPDIR")}
    env.update(OMP_NUM_THREADS="1", MT_PLANT_MARK=str(tmp_path / "MARK"), **env_extra)
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout.strip(), [line for line in r.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lib_name(tmp_path_factory):
    """The name the build looks for on this machine, and a planted library for it (with the record
    of its own SHA-256, as an attacker would write it)."""
    d = tmp_path_factory.mktemp("kc")
    out, _ = _run({CF.CACHE_ENV: str(d / "mine")}, d)
    assert out.startswith("available"), out
    name = os.path.basename(out.split()[1])
    assert sorted(os.listdir(d / "mine")) == [name, name + ".sha256"]
    (d / "plant.c").write_text(PLANT_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(d / "plant.so"), str(d / "plant.c")], check=True)
    return name, d / "plant.so"


def _plant(folder, lib_name, owner=None, mode=0o755):
    from megatron_topo.zero_topo.kernels import _cache

    name, plant = lib_name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(plant, folder / name)
    (folder / (name + ".sha256")).write_text(_cache.file_sha256(str(folder / name)) + "\n")
    if owner is not None:
        for p in (folder, folder / name, folder / (name + ".sha256")):
            os.chown(p, owner, owner)
    os.chmod(folder, mode)


def _nobody():
    if os.geteuid() != 0:
        pytest.skip("simulating another user's folder needs root (chown)")
    return 65534


def test_cache_folder_of_another_user_is_not_used(lib_name, tmp_path):
    """$MEGATRON_TOPO_KERNEL_CACHE names a folder another user owns (0755): nothing is loaded from
    it, the reference kernels are used, one warning line says why (was: the planted library ran)."""
    evil = tmp_path / "shared" / "cache"
    _plant(evil, lib_name, owner=_nobody())
    out, err = _run({CF.CACHE_ENV: str(evil)}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "owned by" in out, out
    assert len(err) == 1 and err[0].startswith("warning: kernel cache") and "owned by" in err[0], err


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_cache_folder_others_can_write_is_not_used(mode, lib_name, tmp_path):
    """Our own folder, but group- or world-writable: its contents may be anyone's."""
    evil = tmp_path / "cache"
    _plant(evil, lib_name, mode=mode)
    out, err = _run({CF.CACHE_ENV: str(evil)}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable") and "writable by group or others" in out, out
    assert len(err) == 1 and err[0].startswith("warning:"), err


def test_squatted_temp_fallback_is_not_used(lib_name, tmp_path):
    """The user cache cannot be created, and another user made the temp-dir fallback first with a
    planted library (the attack in issue 29): not loaded."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    os.chmod(tmpdir, 0o1777)  # like /tmp: sticky, world-writable
    _plant(tmpdir / f"megatron_topo_kernels_{os.getuid()}", lib_name, owner=_nobody())
    out, err = _run({"XDG_CACHE_HOME": str(blocker), "TMPDIR": str(tmpdir)}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the planted library was loaded"
    assert out.startswith("unavailable"), out
    assert len(err) == 1 and "owned by nobody" in err[0] or "owned by uid 65534" in err[0], err


def test_cache_under_a_parent_others_can_write_is_not_used(lib_name, tmp_path):
    """A private-looking folder inside a world-writable parent without the sticky bit: another user
    could rename it away and put theirs in its place."""
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    out, err = _run({CF.CACHE_ENV: str(parent / "cache")}, tmp_path)
    assert out.startswith("unavailable") and "writable by others" in out and "no sticky bit" in out, out
    assert not os.path.exists(parent / "cache")


def test_symlinked_cache_folder_is_not_used(lib_name, tmp_path):
    _plant(tmp_path / "real", lib_name, owner=None, mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    out, err = _run({CF.CACHE_ENV: str(tmp_path / "link")}, tmp_path)
    assert not (tmp_path / "MARK").exists()
    assert out.startswith("unavailable") and "symbolic link" in out, out


@pytest.mark.parametrize("record", ["none", "wrong"])
def test_unverified_library_in_our_folder_is_rebuilt(record, lib_name, tmp_path):
    """In our own private folder, a library whose SHA-256 is not the recorded one (or has no record)
    is rebuilt, with one line, and the rebuilt one is used."""
    mine = tmp_path / "mine"
    _plant(mine, lib_name, mode=0o700)
    name = lib_name[0]
    if record == "none":
        (mine / (name + ".sha256")).unlink()
    else:
        (mine / (name + ".sha256")).write_text("0" * 64 + "\n")
    out, err = _run({CF.CACHE_ENV: str(mine)}, tmp_path)
    assert not (tmp_path / "MARK").exists(), "the unverified library was loaded"
    assert out == f"available {mine / name}", out
    assert len(err) == 1 and "rebuilding it" in err[0], err
    out, err = _run({CF.CACHE_ENV: str(mine)}, tmp_path)  # the rebuilt one verifies: no line
    assert out == f"available {mine / name}" and err == [], (out, err)


def test_existing_cache_readable_by_others_is_made_private(lib_name, tmp_path):
    """A cache of ours that others can read but not write (an old default 0755) is tightened to 0700."""
    d = tmp_path / "c"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    out, err = _run({CF.CACHE_ENV: str(d)}, tmp_path)
    assert out.startswith("available") and err == [], (out, err)
    assert os.stat(d).st_mode & 0o777 == 0o700
