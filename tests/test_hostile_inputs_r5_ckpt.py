"""Hostile inputs, round 5 (issue 29, probe 5): the checkpoint, HF and kernel-cache readers.

Families (several members each; each case failed on main before this change):

* a file a checkpoint reader opens (a step's rank_*.pt, meta.json, config.yml; the ``.old`` copy a
  crash left; ``latest`` when a save fails; a GPT-NeoX checkpoint's step folder) that is a symbolic
  link out of its folder is one ``error:`` line in every reader (generate, convert_to_hf,
  consolidate_checkpoint, a resume, finetune_from), as the HF reader refuses one; a link within
  the folder is still read;
* meta.json's informational fields with values no plan has (bit widths, block sizes, the
  cross-replica reduction, the preset, factors, the topology, a padded size) or that contradict the
  checkpoint (its precision against the saved config.yml, a unit's padded size against the rank
  file) are one line, the same line in every reader;
* the kernel cache's ``.sha256`` record that is not a small regular file (a FIFO blocked the rank
  for good) counts as missing: the library is rebuilt with one warning;
* an HF weight index that is a FIFO or a folder (skipped without a word) and an index entry naming
  a tensor its shard lacks (ignored) are one line.
"""

import json
import os
import re
import shutil
import threading
import time

import pytest

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError
from megatron_topo.zero_topo.checkpoint import CheckpointError, live, meta_schema
from megatron_topo.zero_topo.kernels import _cache

from .cli_cases import build_hostile_world, call, one_error_line, scratch
from .test_hostile_inputs_r3 import snap

STEP = "ck/global_step2"
T, C, H, G = train_cli.main, consolidate_checkpoint.main, convert_to_hf.main, generate.main
READERS = {
    "gen": (G, ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--greedy"]),
    "conv": (H, ["--checkpoint", "ck", "--output", "hf2"]),
    "cons": (C, ["--checkpoint", "ck", "--output", "o.pt"]),
    "load": (T, ["cfg.yml", "--set", "load=ck", "--set", "train_iters=3"]),
    "finetune": (T, ["cfg.yml", "--set", "finetune_from=ck", "--set", "train_iters=1"]),
}
FT_HF = ["cfg.yml", "--set", "finetune_from=hf", "--set", "train_iters=1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world (tests/cli_cases.py) plus hf/, the HF export of its checkpoint."""
    d = build_hostile_world(tmp_path_factory.mktemp("hostile5c"))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert convert_to_hf.main(["--checkpoint", "ck", "--output", "hf"]) == 0
    finally:
        os.chdir(cwd)
    return d


def _refused(d, capfd, entry, argv, out=None):
    """One ``error:`` line, exit 2, within 30 s, nothing that was there changed, no output written."""
    before = snap(d)
    t0 = time.monotonic()
    rc = call(entry, argv)
    took = time.monotonic() - t0
    line = one_error_line(capfd)
    assert rc == 2, line
    assert took < 30, took
    assert "Traceback" not in line and "\x1b" not in line and len(line) < 600, line
    after = snap(d)
    changed = sorted(k for k, v in before.items() if after.get(k) != v)
    assert not changed, changed[:5]
    if out:
        assert not os.path.exists(d / out)
    return line


def _release_after(path, seconds=20.0):
    """Unblock a reader stuck on the FIFO ``path`` after ``seconds`` (the test then fails on time,
    instead of hanging the suite)."""

    def release():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass

    t = threading.Timer(seconds, release)
    t.start()
    return t


# ------------------------------------------------------------------ S1: symbolic links out of the folder
def _link_out(rel, outside):
    """``rel`` becomes a symbolic link to an identical copy outside its folder (absolute target)."""

    def f(d):
        shutil.copy(d / rel, d / outside)
        os.unlink(d / rel)
        os.symlink(d / outside, d / rel)

    return f


def _link_to_sibling_step(d):
    """The rank file links into another step folder of the same checkpoint: still out of its folder."""
    os.makedirs(d / "ck/global_step1")
    shutil.copy(d / STEP / "rank_00000.pt", d / "ck/global_step1/rank_00000.pt")
    os.unlink(d / STEP / "rank_00000.pt")
    os.symlink("../global_step1/rank_00000.pt", d / STEP / "rank_00000.pt")


def _link_chain_out(d):
    """A link within the folder that leads to a second link, which leads out."""
    shutil.copy(d / STEP / "meta.json", d / "m.json")
    os.symlink(d / "m.json", d / STEP / "hop.json")
    os.unlink(d / STEP / "meta.json")
    os.symlink("hop.json", d / STEP / "meta.json")


LINKS_OUT = {
    "rank-file": _link_out(f"{STEP}/rank_00000.pt", "elsewhere.pt"),
    "meta-json": _link_out(f"{STEP}/meta.json", "m.json"),
    "config-yml": _link_out(f"{STEP}/config.yml", "c2.yml"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", sorted(LINKS_OUT))
def test_a_checkpoint_file_linked_out_of_its_step_folder_is_refused(world, tmp_path, monkeypatch, capfd, case, reader):
    """All exited 0 reading the file through the link (probe 5 S1, rankfile/metajson/stepcfg-symlink-out-*)."""
    d = scratch(world, tmp_path, monkeypatch)
    LINKS_OUT[case](d)
    entry, argv = READERS[reader]
    line = _refused(d, capfd, entry, argv, "hf2" if reader == "conv" else "o.pt" if reader == "cons" else None)
    assert "is a symbolic link out of ck/global_step2" in line and "only files inside it are read" in line, line


@pytest.mark.parametrize(
    "case, reader",
    [
        (_link_to_sibling_step, "gen"),
        (_link_to_sibling_step, "load"),
        (_link_chain_out, "cons"),
        (_link_chain_out, "gen"),
    ],
)
def test_links_out_by_way_of_other_folders_or_links_are_refused(world, tmp_path, monkeypatch, capfd, case, reader):
    d = scratch(world, tmp_path, monkeypatch)
    case(d)
    entry, argv = READERS[reader]
    line = _refused(d, capfd, entry, argv)
    assert "is a symbolic link out of ck/global_step2" in line, line


def test_a_link_within_the_step_folder_is_still_read(world, tmp_path, monkeypatch, capfd):
    """As the HF reader: a link that stays inside the folder is fine."""
    d = scratch(world, tmp_path, monkeypatch)
    os.rename(d / STEP / "rank_00000.pt", d / STEP / "rank_00000.real")
    os.symlink("rank_00000.real", d / STEP / "rank_00000.pt")
    entry, argv = READERS["gen"]
    assert call(entry, argv) == 0
    assert "ids:" in capfd.readouterr().out


def test_the_old_copy_of_a_step_linked_out_is_refused(world, tmp_path, monkeypatch, capfd):
    """A crash while re-saving a step leaves global_stepN.old, which resolve() reads when
    global_stepN is gone: as a link out of the checkpoint folder it is refused like the step itself."""
    d = scratch(world, tmp_path, monkeypatch)
    shutil.move(d / STEP, d / "elsewhere_step")
    os.symlink(d / "elsewhere_step", d / "ck/global_step2.old")
    line = _refused(d, capfd, *READERS["gen"])
    assert "global_step2.old" in line and "is a symbolic link out of ck" in line, line


@pytest.mark.parametrize("kind", ["huge", "fifo", "link-out"])
def test_a_failed_save_reads_latest_as_a_reader_does(tmp_path, kind):
    """The line of a failed save named the previous checkpoint by reading ``latest`` whole, through
    links (a FIFO blocked it; a 20 MB file went into the line): now capped, non-blocking, no link out."""
    root = tmp_path / "ck"
    root.mkdir()
    latest = root / "latest"
    if kind == "huge":
        latest.write_text("global_step2" + "x" * (1 << 20))
    elif kind == "fifo":
        os.mkfifo(latest)
    else:
        (tmp_path / "secret").write_text("global_step9\n")
        os.symlink(tmp_path / "secret", latest)
    timer = _release_after(str(latest)) if kind == "fifo" else None
    t0 = time.monotonic()
    try:
        with pytest.raises(CheckpointError) as e:
            live._abandon_save(str(root), str(root / ".tmp_global_step3"), 1, 3, [0], "write failed (No space)")
    finally:
        if timer:
            timer.cancel()
    msg = str(e.value)
    assert time.monotonic() - t0 < 5
    assert len(msg) < 400 and "global_step9" not in msg and "'latest' is left as it was" in msg, msg


def test_the_previous_checkpoint_is_still_named_when_a_save_fails(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    (root / "latest").write_text("global_step2\n")
    with pytest.raises(CheckpointError, match=r"the previous checkpoint \(global_step2\) is intact"):
        live._abandon_save(str(root), str(root / ".tmp_global_step3"), 1, 3, [0], "write failed (No space)")


# GPT-NeoX checkpoints: the step folder `latest` names, and the layer files
def _neox(d, link_step_out=False, link_layer_within=False):
    from megatron_topo.config import ModelConfig
    from megatron_topo.model import build_model

    from .test_neox_checkpoint import ARCH, neox_layer_files, write_neox

    files = neox_layer_files(build_model(ModelConfig(**ARCH), seed=3), ARCH["num_layers"])
    write_neox(d / "nx", files)
    step = d / "nx" / "global_step7"
    if link_step_out:
        shutil.move(step, d / "nx_elsewhere")
        os.symlink(d / "nx_elsewhere", step)
    if link_layer_within:
        name = "layer_00-model_00-model_states.pt"
        os.rename(step / name, step / "embedding.real")
        os.symlink("embedding.real", step / name)


def test_a_neox_step_folder_linked_out_of_its_checkpoint_is_refused(world, tmp_path, monkeypatch, capfd):
    """Our checkpoints refuse a `latest` naming a step folder that links out; GPT-NeoX's imported it."""
    d = scratch(world, tmp_path, monkeypatch)
    _neox(d, link_step_out=True)
    line = _refused(d, capfd, T, ["cfg.yml", "--set", "finetune_from=nx", "--set", "train_iters=1"])
    assert "finetune_from nx" in line and "'global_step7' is a symbolic link out of nx" in line, line
    from megatron_topo.model.neox_checkpoint import NeoxWeights

    with pytest.raises(ConfigError, match="is a symbolic link out of"):
        NeoxWeights(str(d / "nx"), 2)


def test_a_neox_layer_file_linked_within_its_folder_is_read(world, tmp_path, monkeypatch, capfd):
    """Consistent with the HF reader: a link within the folder is read (it was refused as a link);
    one out of it is refused."""
    from megatron_topo.model.neox_checkpoint import NeoxWeights

    d = scratch(world, tmp_path, monkeypatch)
    _neox(d, link_layer_within=True)
    w = NeoxWeights(str(d / "nx"), 2)
    assert "gpt_neox.embed_in.weight" in w.names()
    assert w.get("gpt_neox.embed_in.weight").shape == (64, 32)
    step = d / "nx" / "global_step7"
    os.rename(step / "embedding.real", d / "embedding.out")
    os.unlink(step / "layer_00-model_00-model_states.pt")
    os.symlink(d / "embedding.out", step / "layer_00-model_00-model_states.pt")
    with pytest.raises(ConfigError, match="is a symbolic link out of"):
        NeoxWeights(str(d / "nx"), 2)


# ------------------------------------------------------------------ meta.json's informational fields
def _meta(fn):
    def f(d):
        p = d / STEP / "meta.json"
        m = json.loads(p.read_text())
        fn(m)
        p.write_text(json.dumps(m, indent=1))

    return f


def _plan(k, v):
    return _meta(lambda m: m["plan"].__setitem__(k, v))


def _unit0(k, v):
    return _meta(lambda m: m["units"][0].__setitem__(k, v(m["units"][0]) if callable(v) else v))


META = {  # case: (edit, what the line says)
    "grad-bits-7": (_plan("grad_bits", 7), "plan.grad_bits: expected one of 16, 8, 4, got int 7"),
    "weight-bits-12": (_plan("weight_bits", 12), "plan.weight_bits: expected one of 16, 8, got int 12"),
    "combine-bits-4": (_plan("combine_bits", 4), "plan.combine_bits: expected one of 16, 8, got int 4"),
    "quant-block-3": (_plan("quant_block_size", 3), "plan.quant_block_size: expected a power of two in [64, 8192]"),
    "grad-block-100": (_plan("grad_quant_block_size", 100), "plan.grad_quant_block_size: expected a power of two"),
    "quant-block-huge": (_plan("quant_block_size", 1 << 20), "plan.quant_block_size: expected a power of two"),
    "inter-node-unknown": (_plan("inter_node_reduce", "x"), "plan.inter_node_reduce: expected one of allreduce"),
    "preset-unknown": (_plan("preset", "zzz"), "plan.preset: expected one of ddp, zero1"),
    "topology-per-node-3": (
        _meta(lambda m: m["topology"].__setitem__("gpus_per_node", 3)),
        "topology: world_size 1 is not a multiple of gpus_per_node x gcds_per_gpu = 3",
    ),
    "padded-huge": (_unit0("padded", 2**62), "units[0].padded: 4,611,686,018,427,387,904 pads numel"),
    "padded-plus-16": (  # within a plan's padding, but not the rank file's
        _unit0("padded", lambda u: u["padded"] + 16),
        "unit 0 padded is 2,048 in the rank file, meta.json's units[0].padded is 2,064",
    ),
    "precision-bf16": (
        _meta(lambda m: m.__setitem__("precision", "bf16")),
        "precision: 'bf16' differs from the saved config.yml's precision 'fp32'",
    ),
    "precision-fp16": (
        _meta(lambda m: m.__setitem__("precision", "fp16")),
        "precision: 'fp16' differs from the saved config.yml's precision 'fp32'",
    ),
}


@pytest.mark.parametrize("reader", ["load", "cons", "gen"])
@pytest.mark.parametrize("case", sorted(META))
def test_an_impossible_informational_meta_field_is_refused_alike_by_every_reader(
    world, tmp_path, monkeypatch, capfd, case, reader
):
    """The resume exited 0 on all of these (probe 5 meta5-plan-*, meta5-precision-bf16-load,
    meta5-unit-padded-huge-load, where generate refused the same checkpoint with another line)."""
    d = scratch(world, tmp_path, monkeypatch)
    edit, needle = META[case]
    edit(d)
    entry, argv = READERS[reader]
    line = _refused(d, capfd, entry, argv, "o.pt" if reader == "cons" else None)
    assert needle in line and "ck/global_step2" in line, line


@pytest.mark.parametrize("case", ["padded-huge", "padded-plus-16", "precision-bf16", "grad-bits-7"])
def test_every_reader_gives_the_same_line_for_a_field_they_must_agree_on(world, tmp_path, monkeypatch, capfd, case):
    lines = set()
    for reader in ("gen", "conv", "cons", "load", "finetune"):
        d = scratch(world, tmp_path / reader, monkeypatch)
        META[case][0](d)
        entry, argv = READERS[reader]
        line = _refused(d, capfd, entry, argv)
        lines.add(re.sub(r"^error: (finetune_from ck: |load ck: )?", "", line))
    assert len(lines) == 1, lines


GOOD = {
    "format": 2,
    "step": 3,
    "world_size": 8,
    "topology": {"world_size": 8, "gcds_per_gpu": 1, "gpus_per_node": 4},
    "plan": {
        "weight_factor": 2,
        "grad_factor": 4,
        "optimizer_factor": 4,
        "preset": "mics",
        "secondary_degree": 2,
        "combine_bits": 8,
    },
    "shard_holders": 4,
    "units": [{"padded": 64, "numel": 6, "params": [["w", 0, 6, [6]]]}],
    "trainer": {"step": 3, "consumed_samples": 24},
    "files": {f"rank_0000{r}.pt": {"bytes": 100, "sha256": "ab" * 32} for r in range(8)},
}


@pytest.mark.parametrize(
    "path, value, needle",
    [
        (("plan", "grad_factor"), 1, "plan.grad_factor: 1 is not a multiple of plan.weight_factor 2"),
        (("plan", "optimizer_factor"), 2, "plan.optimizer_factor: 2 is not a multiple of plan.grad_factor 4"),
        (("plan", "weight_factor"), 3, "plan.weight_factor: 3 does not divide world_size 8"),
        (("plan", "secondary_degree"), 3, "plan.secondary_degree: 3 does not divide world_size 8"),
        (("units", 0, "padded"), 66, "units[0].padded: 66 is not a multiple of plan.optimizer_factor 4"),
        (("shard_holders",), 2, "shard_holders: 2 differs from plan.optimizer_factor 4"),
        (("plan", "deterministic"), True, "plan.combine_bits: 8 with plan.deterministic true"),
        (("plan", "inter_node_reduce"), "reduce_scatter", "plan.inter_node_reduce: reduce_scatter with plan.optimizer"),
    ],
)
def test_plan_factors_must_describe_a_layout(path, value, needle):
    rec = json.loads(json.dumps(GOOD))
    meta_schema.validate(rec, (1, 2))  # the record as it is: valid
    cur = rec
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    with pytest.raises(meta_schema.MetaError, match=re.escape(needle)):
        meta_schema.validate(rec, (1, 2))


def test_an_unedited_checkpoint_still_loads_in_every_reader(world, tmp_path, monkeypatch, capfd):
    for reader in ("gen", "cons", "load"):
        scratch(world, tmp_path / reader, monkeypatch)
        entry, argv = READERS[reader]
        assert call(entry, argv) == 0, capfd.readouterr().err[-2000:]


# ------------------------------------------------------------------ HF weight index
def _index(d, edit=None, bin_=False):
    """hf/model.safetensors.index.json mapping every tensor of model.safetensors to it, edited."""
    from safetensors import safe_open

    with safe_open(str(d / "hf/model.safetensors"), framework="pt") as f:
        wm = {k: "model.safetensors" for k in f.keys()}
    if edit:
        edit(d, wm)
    (d / "hf/model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


def _ghost(d, wm):
    wm["gpt_neox.ghost.weight"] = "model.safetensors"


def _moved(d, wm):
    """embed_out.weight mapped to a second shard that holds only the final norm's weight."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(d / "hf/model.safetensors"), framework="pt") as f:
        save_file(
            {"gpt_neox.final_layer_norm.weight": f.get_tensor("gpt_neox.final_layer_norm.weight")},
            str(d / "hf/model-00002-of-00002.safetensors"),
        )
    wm["gpt_neox.final_layer_norm.weight"] = "model-00002-of-00002.safetensors"
    wm["embed_out.weight"] = "model-00002-of-00002.safetensors"


@pytest.mark.parametrize(
    "edit, needle",
    [
        (_ghost, "weight_map puts 'gpt_neox.ghost.weight' in 'model.safetensors', which holds no such tensor"),
        (_moved, "weight_map puts 'embed_out.weight' in 'model-00002-of-00002.safetensors', which holds no such"),
    ],
)
def test_an_index_entry_naming_a_tensor_its_shard_lacks_is_refused(world, tmp_path, monkeypatch, capfd, edit, needle):
    """probe 5 hfidx-weight-map-key-not-in-file: the entry was ignored (exit 0)."""
    d = scratch(world, tmp_path, monkeypatch)
    _index(d, edit)
    line = _refused(d, capfd, T, FT_HF)
    assert "hf/model.safetensors.index.json" in line and needle in line, line


def test_a_consistent_index_is_read(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    _index(d, lambda d, wm: None)
    assert call(T, FT_HF) == 0, capfd.readouterr().err[-2000:]


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling-link"])
def test_an_index_that_is_not_a_file_is_refused_not_skipped(world, tmp_path, monkeypatch, capfd, kind):
    """probe 5 hfidx-fifo: the FIFO was skipped without a word and model.safetensors used."""
    d = scratch(world, tmp_path, monkeypatch)
    p = d / "hf/model.safetensors.index.json"
    timer = None
    if kind == "fifo":
        os.mkfifo(p)
        timer = _release_after(str(p))
    elif kind == "folder":
        p.mkdir()
    else:
        os.symlink("model-index-gone.json", p)
    try:
        line = _refused(d, capfd, T, FT_HF)
    finally:
        if timer:
            timer.cancel()
    assert "model.safetensors.index.json" in line, line
    want = {"fifo": "is a FIFO, not a file", "folder": "is a directory, not a file", "dangling-link": "does not exist"}
    assert want[kind] in line, line


# ------------------------------------------------------------------ kernel cache records
def _lib(tmp_path):
    d = tmp_path / "kc"
    d.mkdir(mode=0o700)
    lib = d / "mt_cpu_fast_x.so"
    lib.write_bytes(b"\x7fELF not really a library")
    os.chmod(lib, 0o600)
    return str(lib)


@pytest.mark.parametrize("kind", ["fifo", "folder", "link", "huge", "devnull-link"])
def test_a_kernel_record_that_is_not_a_small_file_counts_as_missing(tmp_path, kind):
    """probe 5 kc5-record-fifo: verified() opened the record with a blocking open() and the rank
    waited for good; now the record is read non-blocking with a cap: anything but a small regular
    file means rebuild (the caller's one warning), never a wait or a link followed."""
    lib = _lib(tmp_path)
    rec = lib + _cache.RECORD_SUFFIX
    digest = _cache.file_sha256(lib)
    if kind == "fifo":
        os.mkfifo(rec)
    elif kind == "folder":
        os.mkdir(rec)
    elif kind == "link":  # to a file holding the right digest: still not followed
        (tmp_path / "elsewhere").write_text(digest + "\n")
        os.symlink(tmp_path / "elsewhere", rec)
    elif kind == "huge":
        with open(rec, "w") as f:
            f.write(digest + "\n" + " " * (1 << 20))
    else:
        os.symlink("/dev/null", rec)
    timer = _release_after(rec) if kind == "fifo" else None
    t0 = time.monotonic()
    try:
        ok, why = _cache.verified(lib)
    finally:
        if timer:
            timer.cancel()
    assert time.monotonic() - t0 < 5
    assert not ok and why and "no usable SHA-256 record" in why, why


def test_a_kernel_record_that_is_a_small_file_verifies(tmp_path):
    lib = _lib(tmp_path)
    _cache.write_record(lib, _cache.file_sha256(lib))
    assert _cache.verified(lib) == (True, None)
    os.unlink(lib + _cache.RECORD_SUFFIX)
    assert _cache.verified(lib) == (False, "has no recorded SHA-256")


@pytest.mark.slow  # two library builds in fresh interpreters (~25 s on a busy 2-core machine)
@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
def test_a_fifo_record_in_the_cache_is_rebuilt_with_one_warning(tmp_path):
    """End to end: the FIFO record is replaced by the rebuild's record, one warning, library used."""
    from megatron_topo.zero_topo.kernels import cpu_fast as CF

    from .test_hostile_inputs_kernel_cache import _run

    mine = tmp_path / "mine"
    out, _ = _run({CF.CACHE_ENV: str(mine)}, tmp_path)
    assert out.startswith("available"), out
    lib = out.split()[1]
    os.unlink(lib + ".sha256")
    os.mkfifo(lib + ".sha256")
    out, err = _run({CF.CACHE_ENV: str(mine)}, tmp_path)  # _run's own 240 s limit: hung before
    assert out == f"available {lib}", out
    assert len(err) == 1 and "no usable SHA-256 record" in err[0] and "rebuilding it" in err[0], err
    assert os.path.isfile(lib + ".sha256") and not os.path.islink(lib + ".sha256")
    out, err = _run({CF.CACHE_ENV: str(mine)}, tmp_path)
    assert out == f"available {lib}" and err == [], (out, err)


@pytest.mark.parametrize("kind", ["fifo", "dir", "dangling"])
@pytest.mark.parametrize("via_latest", [True, False])
def test_a_meta_json_that_is_not_a_file_is_named_as_such(tmp_path, kind, via_latest):
    """Probe 5's observation: a meta.json that is a FIFO, a folder or a dangling link was reported as
    'missing or incomplete (no global_step2/meta.json)'; the line now says what it is."""
    from megatron_topo.zero_topo.checkpoint import CheckpointError, storage

    step = tmp_path / "ck" / "global_step2"
    step.mkdir(parents=True)
    (tmp_path / "ck" / "latest").write_text("global_step2\n")
    meta = step / "meta.json"
    if kind == "fifo":
        os.mkfifo(meta)
    elif kind == "dir":
        meta.mkdir()
    else:
        meta.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(CheckpointError) as e:
        storage.resolve(str(tmp_path / "ck" if via_latest else step))
    msg = str(e.value)
    assert "missing or incomplete" not in msg, msg
    assert ("is a FIFO" if kind == "fifo" else "is a directory" if kind == "dir" else "file not found") in msg, msg
