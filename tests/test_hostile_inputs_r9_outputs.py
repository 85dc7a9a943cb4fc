"""Issue 29, probe 9, outputs: every output key of a training run is checked before anything starts.

* F11: no output folder (save, log_dir, tensorboard_dir, data_cache_dir, distributed.trace_collectives,
  memory_profiling_path, profile traces) is, or lies inside, another run's folder: a folder a running
  job holds locked (the lock is held by the test, as a live run holds it) or a finished run's log
  folder; one line naming the key and the owner.
* F8: no output folder is a name another output of the same run writes (save's ``latest``, log_dir's
  ``metrics.jsonl``): refused up front, naming both keys, instead of training and failing at the save.
* F6: a file where an output folder goes: one line naming the key, before anything starts.
* D7: two roles of one run may share a folder (save = log_dir = data_cache_dir = trace folder): the
  same config run again resumes from it.

Every refusal is one ``error:`` line, exit 2, no traceback, and no file changed."""

import os

import pytest

from megatron_topo import runlock
from megatron_topo.commands import prepare_data as P
from megatron_topo.commands import train as train_cli

from .cli_cases import build_hostile_world, call, one_error_line, scratch, snapshot


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = build_hostile_world(tmp_path_factory.mktemp("r9outputs"))
    cwd = os.getcwd()
    os.chdir(d)
    try:  # a finished run's log folder
        assert train_cli.main(["cfg.yml", "--set", "train_iters=1", "--set", "log_dir=done"]) == 0
    finally:
        os.chdir(cwd)
    assert (d / "done" / "metrics.jsonl").is_file()
    os.symlink("cfg.yml", d / "lf")
    return d


def _train(*sets):
    argv = ["cfg.yml"]
    for s in sets:
        argv += ["--set", s]
    return call(train_cli.main, argv)


def _refused(capfd, rc, before, root, *words):
    assert rc == 2, rc
    line = one_error_line(capfd)
    for w in words:
        assert w in line, line
    assert snapshot(root) == before
    return line


PROFILE = ("profile=true", "profile_step_start=0", "profile_step_stop=1")


# ------------------------------------------------------------------ F11 another run's folders
@pytest.mark.parametrize(
    "sets, key",
    [
        (("tensorboard_dir=lg/tensorboard",), "tensorboard_dir"),
        (("tensorboard_dir=lg",), "tensorboard_dir"),
        (("tensorboard_dir=lg/tensorboard/x",), "tensorboard_dir"),
        (("data_cache_dir=lg",), "data_cache_dir"),
        (("data_cache_dir=lg/tensorboard",), "data_cache_dir"),
        (("save=lg/ck",), "save"),
        (("log_dir=lg/sub",), "log_dir"),
        (("distributed.trace_collectives=lg/trace",), "distributed.trace_collectives"),
        (("tensorboard_dir=lg/tb",) + PROFILE, "tensorboard_dir"),
    ],
)
@pytest.mark.parametrize("metrics", [False, True])
def test_output_into_a_running_jobs_folder_is_refused(metrics, sets, key, world, tmp_path, monkeypatch, capfd):
    """Run A holds lg locked (it has written nothing else yet, or its metrics.jsonl too): no key of
    run B reaches into lg, and the line names the running job."""
    d = scratch(world, tmp_path, monkeypatch)
    a = runlock.RunLock(log=lambda m: None)
    a.acquire("lg", "log_dir")
    if metrics:
        (d / "lg" / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')
    try:
        before = snapshot(d)
        rc = _train("log_dir=lgB", *sets)
        _refused(capfd, rc, before, d, key, "running job", f"pid {os.getpid()}")
        assert not (d / "lgB").exists()
    finally:
        a.release()


@pytest.mark.parametrize(
    "sets, key",
    [
        (("tensorboard_dir=done/tensorboard",), "tensorboard_dir"),
        (("tensorboard_dir=done",), "tensorboard_dir"),
        (("data_cache_dir=done",), "data_cache_dir"),
        (("save=done/ck",), "save"),
        (("save=done",), "save"),
        (("log_dir=done/sub",), "log_dir"),
        (("save=sv", "log_dir=lgB", "tensorboard_dir=done/tb") + PROFILE, "tensorboard_dir"),
    ],
)
def test_output_into_a_finished_runs_log_folder_is_refused(sets, key, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = _train("log_dir=lgB", *sets)
    _refused(capfd, rc, before, d, key, "another run's log folder", "metrics.jsonl")


def test_prepare_data_into_a_running_jobs_folder_is_refused(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    a = runlock.RunLock(log=lambda m: None)
    a.acquire("lg", "log_dir")
    try:
        before = snapshot(d)
        rc = call(P.main, ["cfg.yml", "--set", "data_cache_dir=lg", "--world-size", "1"])
        _refused(capfd, rc, before, d, "data_cache_dir lg", "running job")
    finally:
        a.release()


# ------------------------------------------------------------------ F8 two outputs of one run
@pytest.mark.parametrize(
    "sets, keys",
    [
        (("save=o1", "distributed.trace_collectives=o1/latest"), ("distributed.trace_collectives", "save o1")),
        (("save=o1", "distributed.trace_collectives=o1/latest/x"), ("distributed.trace_collectives", "save o1")),
        (("save=o1", "data_cache_dir=o1/latest"), ("data_cache_dir", "save o1")),
        (("save=o1", "tensorboard_dir=o1/latest"), ("tensorboard_dir", "save o1")),
        (("save=o1", "log_dir=o1/latest"), ("log_dir o1/latest", "save o1")),
        (
            ("log_dir=o1", "distributed.trace_collectives=o1/metrics.jsonl"),
            ("distributed.trace_collectives", "log_dir o1"),
        ),
        (("log_dir=o1", "data_cache_dir=o1/metrics.jsonl"), ("data_cache_dir", "log_dir o1")),
        (("log_dir=o1", "tensorboard_dir=o1/metrics.jsonl"), ("tensorboard_dir", "log_dir o1")),
        (("log_dir=o1", "save=o1/.megatron_topo.lock"), ("save", "log_dir o1")),
        (
            ("log_dir=o1", "data_cache_dir=o1/tensorboard/events.out.tfevents.x"),
            ("data_cache_dir", "log_dir o1/tensorboard"),
        ),
    ],
)
def test_output_named_as_another_outputs_file_is_refused_up_front(sets, keys, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = _train("checkpoint_factor=1", *sets)
    _refused(capfd, rc, before, d, *keys, "not a name")
    assert not (d / "o1").exists()


# ------------------------------------------------------------------ F6 a file where a folder goes
@pytest.mark.parametrize(
    "sets, words",
    [
        (("tensorboard_dir=cfg.yml",), ("tensorboard_dir cfg.yml exists and is not a directory",)),
        (("tensorboard_dir=lf",), ("tensorboard_dir lf exists and is not a directory",)),
        (("data_cache_dir=cfg.yml",), ("data_cache_dir cfg.yml exists and is not a directory",)),
        (("data_cache_dir=cfg.yml/sub",), ("data_cache_dir cfg.yml/sub", "is a file, not a directory")),
        (("data_cache_dir=data/toy.bin/a/b",), ("data_cache_dir data/toy.bin/a/b", "is a file, not a directory")),
        (("log_dir=cfg.yml/sub",), ("log_dir cfg.yml/sub", "is a file, not a directory")),
        (("log_dir=data/toy.idx/a/b",), ("log_dir data/toy.idx/a/b", "is a file, not a directory")),
        (("tensorboard_dir=x/../cfg.yml",), ("tensorboard_dir x/../cfg.yml", "not a directory")),
    ],
)
def test_file_where_an_output_folder_goes(sets, words, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = _train(*sets)
    _refused(capfd, rc, before, d, *words)


@pytest.mark.parametrize("key", ["tensorboard_dir", "data_cache_dir", "log_dir", "save"])
def test_dangling_link_where_an_output_folder_goes(key, world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    (d / "links").mkdir()
    os.symlink("nowhere", d / "links" / "dangling")
    before = snapshot(d, skip=("links",))
    rc = _train(f"{key}=links/dangling")
    assert rc == 2
    line = one_error_line(capfd)
    assert f"{key} links/dangling is a symbolic link (to 'nowhere') that leads nowhere" in line, line
    assert snapshot(d, skip=("links",)) == before and os.listdir(d / "links") == ["dangling"]


def test_prepare_data_cache_dir_is_a_file(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    before = snapshot(d)
    rc = call(P.main, ["cfg.yml", "--set", "data_cache_dir=cfg.yml", "--world-size", "1"])
    _refused(capfd, rc, before, d, "data_cache_dir cfg.yml exists and is not a directory")


# ------------------------------------------------------------------ D7 one folder, several roles
def test_one_folder_for_every_role_of_one_run_resumes(world, tmp_path, monkeypatch, capfd):
    """save = log_dir = data_cache_dir = trace folder: the run's own; the same config run again
    resumes from it (auto_resume), and so does an explicit load of it."""
    d = scratch(world, tmp_path, monkeypatch)
    roles = ("save=o1", "log_dir=o1", "data_cache_dir=o1", "distributed.trace_collectives=o1", "checkpoint_factor=1")
    assert _train("train_iters=1", *roles) == 0
    assert (d / "o1" / "latest").read_text() == "global_step1\n"
    assert _train("train_iters=2", "auto_resume=true", *roles) == 0
    assert (d / "o1" / "latest").read_text() == "global_step2\n"
    assert _train("train_iters=3", "load=o1", *roles) == 0
    assert (d / "o1" / "latest").read_text() == "global_step3\n"
    steps = [line for line in (d / "o1" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(steps) == 3


@pytest.mark.parametrize(
    "roles",
    [
        ("save=o1/s", "log_dir=o1"),
        ("save=o1", "log_dir=o1/l"),
        ("save=o1/tensorboard", "log_dir=o1"),
        ("save=o1", "tensorboard_dir=o1", "log_dir=lg"),
        ("save=o1/s", "data_cache_dir=o1", "log_dir=lg"),
    ],
)
def test_two_roles_in_one_folder_run_twice(roles, world, tmp_path, monkeypatch, capfd):
    """Two outputs of one run sharing a folder (probe 9's D7 pairs): accepted, and the same config
    run again resumes (the folders are the run's own)."""
    scratch(world, tmp_path, monkeypatch)
    assert _train("train_iters=1", *roles) == 0
    assert _train("train_iters=2", "auto_resume=true", *roles) == 0
    save = next(r.split("=", 1)[1] for r in roles if r.startswith("save="))
    assert open(os.path.join(save, "latest")).read() == "global_step2\n"


def test_resume_saving_into_its_old_log_folder_with_a_new_log_dir(world, tmp_path, monkeypatch, capfd):
    """save = log_dir = o1, then a resume that moves log_dir to o2: o1 holds the run's checkpoints
    (and its old metrics.jsonl), so saving there continues the run; another run's tensorboard_dir
    inside o2 (now a finished run's log folder) is refused."""
    d = scratch(world, tmp_path, monkeypatch)
    assert _train("train_iters=1", "save=o1", "log_dir=o1") == 0
    assert _train("train_iters=2", "save=o1", "log_dir=o2", "auto_resume=true") == 0
    assert (d / "o1" / "latest").read_text() == "global_step2\n"
    capfd.readouterr()
    before = snapshot(d)
    rc = _train("train_iters=3", "save=o3", "log_dir=o3", "tensorboard_dir=o2/tb")
    _refused(capfd, rc, before, d, "tensorboard_dir o2/tb", "another run's log folder")
