"""Issue 29, probe 4, outputs: a tool removes or moves back only the temporary folders it marked as
its own; a run writes no output folder into another artifact's folder (a checkpoint save folder or
step, a HuggingFace export) nor through a symbolic link it did not name; meta.json's informational
fields (precision, topology, plan, config.file) are validated like the others.

Every refusal is one ``error:`` line, exit 2, and the files already there are unchanged."""

import json
import os
import shutil

import pytest

from megatron_topo.commands import convert_to_hf as H
from megatron_topo.commands import train as train_cli
from megatron_topo.pids import pid_alive
from megatron_topo.zero_topo.checkpoint.meta_schema import MetaError, validate

from .cli_cases import build_hostile_world, call, one_error_line, scratch, snapshot


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = build_hostile_world(tmp_path_factory.mktemp("r4outputs"))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert H.main(["--checkpoint", "ck", "--output", "hf"]) == 0
    finally:
        os.chdir(cwd)
    return d


def _dead_pid():
    pid = 999_999
    while pid_alive(pid):
        pid -= 1
    return pid


# ------------------------------------------------------------------- convert_to_hf temporaries
def _tree(p):
    return {os.path.relpath(os.path.join(dp, f), p) for dp, _, fs in os.walk(p) for f in fs}


def _marked(folder, **over):
    folder.mkdir()
    H.write_marker(str(folder))
    if over:
        rec = json.loads((folder / H.MARKER).read_text())
        rec.update(over)
        (folder / H.MARKER).write_text(json.dumps(rec))


@pytest.mark.parametrize(
    "case", ["user-folder", "user-old-folder", "marked-with-user-file", "marker-of-another-tool", "marker-symlink"]
)
def test_convert_leaves_folders_it_did_not_make(case, world, tmp_path, monkeypatch, capfd):
    """A folder named like a dead conversion's temporary is removed (or moved back onto the
    output) only when it carries the conversion's marker and holds export files only (was: any
    such folder was removed, or renamed onto the output, whatever it held)."""
    d = scratch(world, tmp_path, monkeypatch)
    pid = _dead_pid()
    name = f".hf2.tmp.{pid}" + (".old" if case == "user-old-folder" else "")
    t = d / name
    if case in ("user-folder", "user-old-folder"):
        t.mkdir()
        (t / "notes.txt").write_text("my notes\n")
    elif case == "marked-with-user-file":
        _marked(t)
        (t / "notes.txt").write_text("my notes\n")
    elif case == "marker-of-another-tool":
        _marked(t, tool="something_else")
        (t / "config.json").write_text("{}")
    else:  # the marker is a link to a record elsewhere
        t.mkdir()
        (d / "rec.json").write_text(json.dumps({"tool": "convert_to_hf", "host": os.uname()[1], "token": "0" * 32}))
        os.symlink(d / "rec.json", t / H.MARKER)
    before = {p: (t / p).read_bytes() for p in _tree(t)}
    capfd.readouterr()
    assert call(H.main, ["--checkpoint", "ck", "--output", "hf2"]) == 0
    err = capfd.readouterr().err
    assert {p: (t / p).read_bytes() for p in _tree(t)} == before  # untouched, in place
    warns = [x for x in err.splitlines() if x.startswith("warning:") and name in x]
    assert len(warns) == 1 and "left" in warns[0] and "alone" in warns[0], err
    assert "Traceback" not in err
    assert (d / "hf2" / "config.json").is_file() and not (d / "hf2" / "notes.txt").exists()
    assert not (d / "hf2" / H.MARKER).exists()


def test_convert_removes_and_restores_its_own_marked_temporaries(world, tmp_path, monkeypatch, capfd):
    """What a killed conversion marked is still cleaned: its temporary removed, an export it moved
    aside put back when the output is missing."""
    d = scratch(world, tmp_path, monkeypatch)
    pid = _dead_pid()
    aside = d / f".hf2.tmp.{pid}.old"
    shutil.copytree(d / "hf", aside)
    H.write_marker(str(aside))
    half = d / f".hf2.tmp.{pid - 1 if not pid_alive(pid - 1) else pid}"
    if half != aside and not half.exists():
        _marked(half)
        (half / "config.json").write_text("{}")
    assert sorted(H.clean_stale_temporaries(str(d / "hf2")))[0].startswith("removed")
    assert sorted(os.listdir(d / "hf2")) == sorted(os.listdir(d / "hf"))  # the marker is gone
    assert not aside.exists() and not half.exists()


# ---------------------------------------------------------------------- train output folders
def _neox_checkpoint(d):
    (d / "nx" / "global_step5").mkdir(parents=True)
    (d / "nx" / "global_step5" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (d / "nx" / "latest").write_text("global_step5")


@pytest.mark.parametrize(
    "case,sets,key,words",
    [
        ("log-dir-is-save-root", ["log_dir=ck"], "log_dir", "checkpoint save folder"),
        ("log-dir-in-save-root", ["log_dir=ck/logs"], "log_dir", "checkpoint save folder"),
        ("data-cache-is-save-root", ["data_cache_dir=ck"], "data_cache_dir", "checkpoint save folder"),
        ("tensorboard-is-hf-export", ["tensorboard_dir=hf"], "tensorboard_dir", "HuggingFace model folder"),
        ("log-dir-in-hf-export", ["log_dir=hf/logs"], "log_dir", "HuggingFace model folder"),
        ("save-is-hf-export", ["save=hf"], "save", "HuggingFace model folder"),
        ("log-dir-is-neox-checkpoint", ["log_dir=nx"], "log_dir", "checkpoint save folder"),
        ("tensorboard-symlink-in-log-dir", ["log_dir=lg"], "log_dir", "symbolic link"),
        ("index-symlink-in-cache", ["data_cache_dir=dc"], "data_cache_dir", "symbolic link"),
        ("tensorboard-dir-links-to-hf", ["tensorboard_dir=tblink"], "tensorboard_dir", "HuggingFace model folder"),
        (
            "profile-symlink",
            ["tensorboard_dir=tb", "profile=true", "profile_step_start=0", "profile_step_stop=1"],
            "tensorboard_dir",
            "symbolic link",
        ),
        ("superseded-symlink", ["log_dir=lg2", "load=ck", "train_iters=3"], "log_dir", "metrics.jsonl.superseded"),
        ("log-dir-is-load-of-another-run", ["log_dir=ck", "load=ck", "train_iters=3"], "log_dir", "save folder"),
    ],
)
def test_train_output_folder_inside_another_artifact_is_refused(
    case, sets, key, words, world, tmp_path, monkeypatch, capfd
):
    """Before the run writes anything: one line naming the key, the folder and what owns it (was:
    metrics.jsonl, config.yml, the lock, index caches or event files written into it)."""
    d = scratch(world, tmp_path, monkeypatch)
    (d / "mine").mkdir()
    (d / "mine" / "notes.txt").write_text("mine\n")
    _neox_checkpoint(d)
    (d / "lg").mkdir()
    os.symlink(d / "mine", d / "lg" / "tensorboard")
    (d / "dc").mkdir()
    os.symlink(d / "mine", d / "dc" / "index")
    os.symlink(d / "hf", d / "tblink")
    (d / "tb").mkdir()
    os.symlink(d / "mine", d / "tb" / "profile")
    (d / "lg2").mkdir()  # records past the resumed step 2 are moved to metrics.jsonl.superseded
    (d / "lg2" / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "loss": 1.0}}\n' for i in range(1, 6)))
    os.symlink(d / "mine" / "notes.txt", d / "lg2" / "metrics.jsonl.superseded")
    before = snapshot(d)
    capfd.readouterr()
    argv = ["cfg.yml"] + [a for s in sets for a in ("--set", s)] + ["--set", "train_iters=1"] * ("load=ck" not in sets)
    assert call(train_cli.main, argv) == 2
    line = one_error_line(capfd)
    assert key in line and words in line, line
    assert snapshot(d) == before  # nothing written, nothing changed
    assert not os.path.exists(d / "log")


def _run(argv):
    return call(train_cli.main, ["cfg.yml"] + [a for s in argv for a in ("--set", s)])


def test_normal_layouts_still_train_and_resume(world, tmp_path, monkeypatch, capfd):
    """save inside the log folder (the README layout), save and log_dir one folder, a resume of the
    run's own save folder with load and with auto_resume, and logs inside the run's own save folder."""
    d = scratch(world, tmp_path, monkeypatch)
    assert _run(["save=runs/tiny/checkpoints", "log_dir=runs/tiny", "train_iters=1"]) == 0
    assert _run(["save=runs/tiny/checkpoints", "log_dir=runs/tiny", "train_iters=2", "load=runs/tiny/checkpoints"]) == 0
    assert _run(["save=runs/tiny/checkpoints", "log_dir=runs/tiny", "train_iters=3", "auto_resume=true"]) == 0
    assert (d / "runs" / "tiny" / "checkpoints" / "latest").read_text().strip() == "global_step3"
    assert _run(["save=sv", "log_dir=sv", "data_cache_dir=sv/cache", "train_iters=1"]) == 0
    assert _run(["save=sv", "log_dir=sv/logs", "train_iters=2", "auto_resume=true"]) == 0
    assert (d / "sv" / "latest").read_text().strip() == "global_step2"
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------------- meta.json informational fields
META = "ck/global_step2/meta.json"


def _meta(d):
    return json.loads((d / META).read_text())


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("precision", "\x1b[31m" + "A" * 5000, "precision: expected one of fp32, bf16, fp16"),
        ("precision", "fp64", "precision: expected one of"),
        ("precision", 16, "precision: expected one of"),
        ("topology", [], "topology: expected an object"),
        ("topology", {"world_size": 1}, "topology.gcds_per_gpu: missing"),
        ("topology", {"world_size": 2, "gcds_per_gpu": 1, "gpus_per_node": 1}, "topology.world_size: 2 differs"),
        ("topology", {"world_size": 1, "gcds_per_gpu": 1, "gpus_per_node": "1"}, "topology.gpus_per_node"),
        ("plan.preset", "Z" * 3000, "plan.preset: expected a short name"),
        ("plan.note", {"x": [1] * 100}, "plan.note: expected null"),
        ("plan.weight_bits", "16", "plan.weight_bits: expected an integer"),
        ("plan.prefetch", "yes", "plan.prefetch: expected true or false"),
        ("config.file", "../../etc/passwd", "config.file: expected 'config.yml'"),
    ],
)
def test_resume_refuses_bad_informational_meta_fields(field, value, words, world, tmp_path, monkeypatch, capfd):
    """One line naming meta.json and the field (was: any value resumed with exit 0)."""
    d = scratch(world, tmp_path, monkeypatch)
    m = _meta(d)
    if "." in field:
        a, b = field.split(".")
        m[a][b] = value
    else:
        m[field] = value
    (d / META).write_text(json.dumps(m))
    before = snapshot(d)
    capfd.readouterr()
    assert _run(["load=ck", "train_iters=3", "save=null"]) == 2
    line = one_error_line(capfd)
    assert "meta.json" in line and words in line, line
    assert len(line) < 600 and "\x1b" not in line
    assert snapshot(d, skip=("log", "cache")) == {k: v for k, v in before.items() if not k.startswith(("log", "cache"))}


def test_meta_without_informational_fields_still_resumes(world, tmp_path, monkeypatch, capfd):
    """An older checkpoint that records no precision or topology (or null) and fewer plan fields."""
    d = scratch(world, tmp_path, monkeypatch)
    m = _meta(d)
    del m["precision"]
    m["topology"] = None
    for k in ("combine_bits", "publish_bits", "deterministic"):
        del m["plan"][k]
    (d / META).write_text(json.dumps(m))
    assert _run(["load=ck", "train_iters=3", "save=null"]) == 0


def test_meta_schema_accepts_what_a_save_writes(world):
    m = json.loads((world / META).read_text())
    meta = validate(m, (1, 2))
    assert meta.precision == "fp32" and meta.topology == m["topology"] and meta.plan == m["plan"]
    for bad in ({**m, "precision": None, "topology": "x"}, {**m, "plan": {**m["plan"], "Bad-Key": 1}}):
        with pytest.raises(MetaError):
            validate(bad, (1, 2))


def test_save_cleanup_takes_only_the_names_a_save_writes(world, tmp_path, monkeypatch):
    """A save removes the leftovers of interrupted saves by their exact names only (was: any
    '.tmp_global_step*' folder, 'global_step*.old' folder or 'latest.tmp.*' entry of the save folder)."""
    d = scratch(world, tmp_path, monkeypatch)
    mine = {".tmp_global_step_backup/notes.txt": "a", "latest.tmp.mine": "b", "global_step1.old.keep/n.txt": "c"}
    for rel, text in mine.items():
        (d / "sv" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "sv" / rel).write_text(text)
    (d / "sv" / ".tmp_global_step7").mkdir()  # a killed save's own leftover: removed
    (d / "sv" / "latest.tmp.123").write_text("global_step7\n")
    assert _run(["save=sv", "train_iters=1"]) == 0
    assert all((d / "sv" / rel).read_text() == text for rel, text in mine.items())
    assert not (d / "sv" / ".tmp_global_step7").exists() and not (d / "sv" / "latest.tmp.123").exists()


def test_folders_that_only_look_like_artifacts_are_not_refused(world, tmp_path, monkeypatch):
    """A run folder holding a file named latest (not a step name), an empty global_step9 folder, or a
    config.json without weights is not mistaken for a checkpoint or an export."""
    d = scratch(world, tmp_path, monkeypatch)
    (d / "lg").mkdir()
    (d / "lg" / "latest").write_text("my latest notes\n")
    (d / "lg" / "global_step9").mkdir()
    (d / "lg" / "config.json").write_text("{}")
    assert _run(["log_dir=lg", "tensorboard_dir=lg/tb", "data_cache_dir=lg/cache", "train_iters=1"]) == 0
    assert (d / "lg" / "latest").read_text() == "my latest notes\n"


def test_convert_never_clears_a_folder_under_its_own_temporary_name(world, tmp_path, monkeypatch, capfd):
    """The temporary name of this very process (``.hf2.tmp.<our pid>``) taken by a user's folder is
    refused in one line (was: removed before the export was written)."""
    d = scratch(world, tmp_path, monkeypatch)
    t = d / f".hf2.tmp.{os.getpid()}"
    t.mkdir()
    (t / "notes.txt").write_text("mine\n")
    capfd.readouterr()
    assert call(H.main, ["--checkpoint", "ck", "--output", "hf2"]) == 2
    line = one_error_line(capfd)
    assert t.name in line and "not removed" in line, line
    assert (t / "notes.txt").read_text() == "mine\n" and not (d / "hf2").exists()


@pytest.mark.parametrize(
    "cache,words", [("ck", "checkpoint save folder"), ("hf/c", "HuggingFace model folder"), ("dc", "symbolic link")]
)
def test_prepare_data_cache_dir_inside_another_artifact_is_refused(cache, words, world, tmp_path, monkeypatch, capfd):
    """prepare_data.py writes the same index caches as train.py: the same refusal (was: written)."""
    from megatron_topo.commands import prepare_data

    d = scratch(world, tmp_path, monkeypatch)
    (d / "mine").mkdir()
    (d / "dc").mkdir()
    os.symlink(d / "mine", d / "dc" / "index")
    before = snapshot(d)
    capfd.readouterr()
    assert call(prepare_data.main, ["cfg.yml", "--world-size", "1", "--set", f"data_cache_dir={cache}"]) == 2
    line = one_error_line(capfd)
    assert "data_cache_dir" in line and words in line, line
    assert snapshot(d) == before
