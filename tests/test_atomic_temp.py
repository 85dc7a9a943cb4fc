"""atomic.write_* and atomic_path never write through what sits at their temporary name: a
symbolic link planted at ``PATH.tmp.PID`` was followed (its target overwritten, then the link renamed
over PATH), a FIFO blocked the writer, and a file with another name (a hard link) was truncated.
Each is refused with an OSError naming the temporary; a stale temporary left by a dead process that
had our pid (a plain file) is reused as before."""

import os
import threading

import pytest

from megatron_topo import atomic


def _plant(kind, tmp, target):
    if kind == "symlink":
        os.symlink(target, tmp)
    elif kind == "hardlink":
        os.link(target, tmp)
    elif kind == "fifo":
        os.mkfifo(tmp)
    else:
        os.mkdir(tmp)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "dir"])
@pytest.mark.parametrize("how", ["write_text", "atomic_path"])
def test_what_sits_at_the_temporary_name_is_never_written_through(tmp_path, kind, how):
    keep = tmp_path / "keep.txt"
    keep.write_text("user data\n")
    out = str(tmp_path / "out.json")
    tmp = atomic.temp_name(out)
    _plant(kind, tmp, str(keep))

    def write():
        if how == "write_text":
            atomic.write_text(out, "ours\n")
        else:
            with atomic.atomic_path(out) as t:
                with open(t, "w") as f:
                    f.write("ours\n")

    got = {}

    def run():
        try:
            write()
            got["ok"] = True
        except OSError as e:
            got["err"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the write blocked"
    assert "err" in got and got["err"].filename == tmp, got
    assert "temporary name of this write is" in str(got["err"])
    assert keep.read_text() == "user data\n"
    assert not os.path.exists(out) and os.path.lexists(tmp)  # nothing replaced, nothing removed


def test_a_stale_temporary_of_a_dead_process_is_reused(tmp_path):
    out = str(tmp_path / "out.json")
    (tmp_path / os.path.basename(atomic.temp_name(out))).write_text("a longer stale temporary\n")
    atomic.write_text(out, "ours\n")
    assert open(out).read() == "ours\n" and not os.path.exists(atomic.temp_name(out))
