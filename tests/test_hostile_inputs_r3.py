"""Hostile inputs, round 3 (issue 29), the table: each case exits != 0 with exactly one ``error:``
line naming the problem (no traceback), within 30 s, with every file on disk unchanged.

Families (several members each, so that another member of a family is caught too):
paths read from files (a checkpoint's ``latest``, an HF index's ``weight_map``): absolute, ``..``,
symlinks out, FIFOs, devices, oversized files, echoed content; fields of meta.json and of an HF
config.json / index (types, bounds, missing); a checkpoint without file records; finetune_from
with another architecture; a consumed_samples outside the data; a step's size; min_lr above lr;
outputs over files the run did not create (log_dir). The behaviour tests that go with them (the
unverified load and the architecture change when asked for, ``--set`` strings) are at the end;
the kernel cache is tests/test_hostile_inputs_kernel_cache.py.
"""

import hashlib
import json
import os
import stat
import time

import pytest

from megatron_topo.commands import consolidate_checkpoint, convert_to_hf, generate, plot_metrics
from megatron_topo.commands import plan as plan_tool
from megatron_topo.commands import train as train_cli

from .cli_cases import ROOT, build_hostile_world, call, one_error_line, scratch

STEP = "ck/global_step2"
T, C, H, G = train_cli.main, consolidate_checkpoint.main, convert_to_hf.main, generate.main
PL, PM = plan_tool.main, plot_metrics.main
LOAD = ["cfg.yml", "--set", "load=ck"]
FT = ["cfg.yml", "--set", "finetune_from=hf"]
GEN = ["--checkpoint", "ck", "--prompt-ids", "1,2", "--max-new-tokens", "2"]


def S(*sets):
    out = ["cfg.yml"]
    for s in sets:
        out += ["--set", s]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The hostile-input world (tests/cli_cases.py) plus hf/, the HF export of its checkpoint."""
    d = build_hostile_world(tmp_path_factory.mktemp("hostile3"))
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert convert_to_hf.main(["--checkpoint", "ck", "--output", "hf"]) == 0
    finally:
        os.chdir(cwd)
    assert sorted(os.listdir(d / "hf")) == ["config.json", "model.safetensors"]
    return d


def snap(root):
    """Every entry under ``root`` without opening anything but regular files (a FIFO or a link to a
    device must not hang the snapshot): sha256 of files, the target of links, the kind of others."""
    out = {}
    for dp, dirs, fs in os.walk(root):
        for f in fs + [x for x in dirs if os.path.islink(os.path.join(dp, x))]:
            p = os.path.join(dp, f)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(p, root)] = "-> " + os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
            else:
                out[os.path.relpath(p, root)] = f"kind {stat.S_IFMT(st.st_mode)}"
    return out


# ------------------------------------------------------------------------------ mutations
def _write(rel, data):
    def f(d):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            p.unlink()
        (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)

    return f


def _fifo(rel):
    def f(d):
        (d / rel).unlink(missing_ok=True)
        os.mkfifo(d / rel)

    return f


def _link(rel, target):
    def f(d):
        (d / rel).unlink(missing_ok=True)
        os.symlink(target if os.path.isabs(target) else d / target, d / rel)

    return f


def _edit_json(rel, fn):
    def f(d):
        p = d / rel
        data = json.loads(p.read_text())
        fn(data)
        p.write_text(json.dumps(data))

    return f


def _meta(fn):
    return _edit_json(f"{STEP}/meta.json", fn)


def _hf_config(fn):
    return _edit_json("hf/config.json", fn)


def _set(path, value):
    def fn(data):
        *head, last = path
        cur = data
        for k in head:
            cur = cur[k]
        cur[last] = value

    return fn


def _delete(path):
    def fn(data):
        *head, last = path
        cur = data
        for k in head:
            cur = cur[k]
        del cur[last]

    return fn


def _index(weight_map=None, raw=None, extra=None):
    """hf/model.safetensors.index.json mapping every tensor to model.safetensors, then ``weight_map``
    entries over it (or ``raw`` as the whole file); ``extra`` prepares more files."""

    def f(d):
        from safetensors import safe_open

        if extra:
            extra(d)
        with safe_open(str(d / "hf" / "model.safetensors"), framework="pt") as fh:
            names = list(fh.keys())
        wm = {n: "model.safetensors" for n in names}
        if weight_map:
            wm[names[0]] = list(weight_map.values())[-1]  # the planted entry
        text = raw if raw is not None else json.dumps({"metadata": {}, "weight_map": wm})
        (d / "hf" / "model.safetensors.index.json").write_text(text)

    return f


def _outside(d):
    (d / "outside").mkdir(exist_ok=True)
    os.link(d / "hf" / "model.safetensors", d / "outside" / "x.safetensors")


def _fifo_in_hf(d):
    os.mkfifo(d / "hf" / "pipe.safetensors")


def _link_out_of_hf(d):
    _outside(d)
    os.symlink(d / "outside" / "x.safetensors", d / "hf" / "link.safetensors")


def _dev_in_hf(d):
    os.symlink("/dev/zero", d / "hf" / "zero.safetensors")


def _step_dir_link_out(d):
    os.rename(d / STEP, d / "elsewhere")
    os.symlink(d / "elsewhere", d / STEP)


def _user_config_in_log(d):
    (d / "mylog").mkdir()
    (d / "mylog" / "config.yml").write_text("# my own notes\nnum_layers: 2\n")


# (id, entry point, argv, mutation, exit code, text the one stderr line contains)
CASES = [
    # ---- a checkpoint's `latest`: size-capped, non-blocking, inside its folder, echoed only in part
    ("latest-fifo", T, LOAD, _fifo("ck/latest"), 2, "ck/latest: 'latest' is a FIFO, not a file"),
    (
        "latest-huge",
        T,
        LOAD,
        _write("ck/latest", "global_step2" * 2_000_000),
        2,
        "ck/latest is 24,000,000 bytes; a file of this kind is at most 4,096 bytes",
    ),
    (
        "latest-symlink-out",
        T,
        LOAD,
        lambda d: (_write("elsewhere_latest", "global_step2\n")(d), _link("ck/latest", "elsewhere_latest")(d)),
        2,
        "is a symbolic link out of ck",
    ),
    ("latest-to-a-device", T, LOAD, _link("ck/latest", "/dev/zero"), 2, "is a symbolic link out of ck"),
    (
        "latest-dotdot",
        T,
        LOAD,
        _write("ck/latest", "../ck/global_step2\n"),
        2,
        "holds '../ck/global_step2', not a global_stepN directory name",
    ),
    (
        "latest-absolute",
        C,
        ["--checkpoint", "ck", "--output", "o.pt"],
        _write("ck/latest", "/etc\n"),
        2,
        "holds '/etc', not a global_stepN directory name",
    ),
    (
        "latest-binary-is-escaped",
        H,
        ["--checkpoint", "ck", "--output", "hf2"],
        _write("ck/latest", b"\x1b[2J\x00" + b"A" * 500),
        2,
        "holds '\\x1b[2J\\x00AAAA",
    ),
    ("latest-step-dir-symlink-out", G, GEN, _step_dir_link_out, 2, "names global_step2, a symbolic link out of ck"),
    # ---- meta.json: one schema, one line naming the file and the field
    ("meta-step-string", T, LOAD, _meta(_set(["step"], "2")), 2, "meta.json: step: expected an integer, got str '2'"),
    (
        "meta-step-negative",
        C,
        ["--checkpoint", "ck", "--output", "o.pt"],
        _meta(_set(["step"], -1)),
        2,
        "meta.json: step: must lie in [0,",
    ),
    (
        "meta-world-size-float",
        T,
        LOAD,
        _meta(_set(["world_size"], 1.0)),
        2,
        "world_size: expected an integer, got float",
    ),
    ("meta-trainer-not-object", T, LOAD, _meta(_set(["trainer"], "abc")), 2, "trainer: expected an object, got str"),
    (
        "meta-trainer-no-consumed",
        T,
        LOAD + ["--set", "train_iters=3"],
        _meta(_delete(["trainer", "consumed_samples"])),
        2,
        "meta.json: trainer.consumed_samples: missing",
    ),
    (
        "meta-trainer-consumed-a-string",
        G,
        GEN,
        _meta(_set(["trainer", "consumed_samples"], "8")),
        2,
        "trainer.consumed_samples: expected an integer, got str '8'",
    ),
    (
        "meta-consumed-negative",
        T,
        LOAD + ["--set", "train_iters=3"],
        _meta(_set(["trainer", "consumed_samples"], -5)),
        2,
        "trainer.consumed_samples: must lie in [0,",
    ),
    (
        "meta-consumed-beyond-data",
        T,
        LOAD + ["--set", "train_iters=3"],
        _meta(_set(["trainer", "consumed_samples"], 10**12)),
        2,
        "trainer.consumed_samples 1,000,000,000,000 in meta.json is beyond the",
    ),
    (
        "meta-consumed-beyond-int64",
        T,
        LOAD,
        _meta(_set(["trainer", "consumed_samples"], 10**30)),
        2,
        "trainer.consumed_samples: must lie in [0, 4,611,686,018,427,387,904]",
    ),
    (
        "meta-trainer-step-differs",
        T,
        LOAD,
        _meta(_set(["trainer", "step"], 7)),
        2,
        "trainer.step: 7 differs from step 2",
    ),
    (
        "meta-param-shape",
        T,
        LOAD,
        _meta(lambda m: m["units"][0]["params"][0].__setitem__(3, [999])),
        2,
        "units[0].params[0]: shape [999] has 999 elements, numel says",
    ),
    (
        "meta-param-offset-negative",
        H,
        ["--checkpoint", "ck", "--output", "hf2"],
        _meta(lambda m: m["units"][1]["params"][0].__setitem__(1, -4)),
        2,
        "units[1].params[0][1] (offset): must lie in",
    ),
    (
        "meta-param-past-unit",
        C,
        ["--checkpoint", "ck", "--output", "o.pt"],
        _meta(lambda m: m["units"][1]["params"][-1].__setitem__(1, m["units"][1]["numel"])),
        2,
        "runs past the unit's",
    ),
    (
        "meta-param-overlap",
        T,
        LOAD,
        _meta(lambda m: m["units"][1]["params"][1].__setitem__(1, 0)),
        2,
        "overlaps the parameter before it",
    ),
    ("meta-units-not-list", T, LOAD, _meta(_set(["units"], {"0": 1})), 2, "units: expected a list, got dict"),
    (
        "meta-plan-factor-zero",
        T,
        LOAD,
        _meta(_set(["plan", "optimizer_factor"], 0)),
        2,
        "plan.optimizer_factor: must lie in [1, 1]",
    ),
    ("meta-padded-below-numel", T, LOAD, _meta(_set(["units", 0, "padded"], 1)), 2, "units[0].padded: must lie in"),
    (
        "meta-file-record-bad-sha",
        T,
        LOAD,
        _meta(_set(["files", "rank_00000.pt", "sha256"], "xyz")),
        2,
        "files.rank_00000.pt.sha256: expected 64 lowercase hex digits",
    ),
    (
        "meta-file-record-odd-name",
        T,
        LOAD,
        _meta(_set(["files", "../x.pt"], {"bytes": 1, "sha256": "0" * 64})),
        2,
        "files: '../x.pt' is not a rank file name",
    ),
    (
        "meta-huge-nesting",
        T,
        LOAD,
        _write(f"{STEP}/meta.json", "[" * 100000 + "]" * 100000),
        2,
        "meta.json is unreadable",
    ),
    (
        "meta-is-a-fifo",
        T,
        ["cfg.yml", "--set", f"load={STEP}"],
        _fifo(f"{STEP}/meta.json"),
        2,
        "meta.json is a FIFO, not a file; refusing to read it",
    ),
    # ---- a checkpoint without its file records: refused unless asked for
    (
        "meta-no-file-records",
        T,
        LOAD + ["--set", "train_iters=3"],
        _meta(_delete(["files"])),
        2,
        "no size and SHA-256 recorded for rank_00000.pt, so its bytes cannot be verified",
    ),
    (
        "meta-no-file-records-finetune",
        T,
        S("finetune_from=ck"),
        _meta(_delete(["files"])),
        2,
        "set load_unverified: true to load it anyway",
    ),
    (
        "meta-no-file-records-convert",
        H,
        ["--checkpoint", "ck", "--output", "hf2"],
        _meta(_delete(["files", "rank_00000.pt"])),
        2,
        "no size and SHA-256 recorded for rank_00000.pt",
    ),
    # ---- finetune_from one of our checkpoints: the architecture is compared as resume does
    (
        "finetune-other-rotary",
        T,
        S("finetune_from=ck", "rotary_pct=0.5"),
        None,
        2,
        "the model config differs from the checkpoint's (rotary_pct 0.25 -> 0.5)",
    ),
    (
        "finetune-other-eps-and-residual",
        T,
        S("finetune_from=ck", "layernorm_epsilon=1e-6", "gpt_j_residual=false"),
        None,
        2,
        "(gpt_j_residual True -> False; layernorm_epsilon 1e-05 -> 1e-06)",
    ),
    (
        "finetune-other-rotary-base",
        T,
        S("finetune_from=ck", "rotary_emb_base=500"),
        None,
        2,
        "rotary_emb_base 10000 -> 500",
    ),
    (
        "no-load-optim-other-norm",
        T,
        S("load=ck", "no_load_optim=true", "train_iters=4", "rotary_pct=1.0"),
        None,
        2,
        "set finetune_architecture_change: true to change it deliberately",
    ),
    # ---- HF index: files inside the folder only, no hang, one line per bad field
    (
        "hf-index-dotdot",
        T,
        FT,
        _index({"x": "../outside/x.safetensors"}, extra=_outside),
        2,
        "'../outside/x.safetensors', which leads out of hf ('..')",
    ),
    ("hf-index-absolute", T, FT, _index({"x": "/etc/passwd"}), 2, "names '/etc/passwd', an absolute path"),
    (
        "hf-index-fifo",
        T,
        FT,
        _index({"x": "pipe.safetensors"}, extra=_fifo_in_hf),
        2,
        "'pipe.safetensors' is a FIFO, not a file",
    ),
    (
        "hf-index-symlink-out",
        T,
        FT,
        _index({"x": "link.safetensors"}, extra=_link_out_of_hf),
        2,
        "'link.safetensors' is a symbolic link out of hf",
    ),
    (
        "hf-index-device",
        T,
        FT,
        _index({"x": "zero.safetensors"}, extra=_dev_in_hf),
        2,
        "'zero.safetensors' is a symbolic link out of hf",
    ),
    ("hf-index-missing-file", T, FT, _index({"x": "nope.safetensors"}), 2, "which does not exist in hf"),
    ("hf-index-no-weight-map", T, FT, _index(raw='{"metadata": {}}'), 2, "index.json: weight_map: missing"),
    (
        "hf-index-weight-map-list",
        T,
        FT,
        _index(raw='{"weight_map": ["a"]}'),
        2,
        "weight_map: expected a non-empty object of tensor name -> file, got list",
    ),
    (
        "hf-index-file-a-number",
        T,
        FT,
        _index(raw='{"weight_map": {"a": 3}}'),
        2,
        "weight_map['a']: expected a file name, got int 3",
    ),
    ("hf-index-not-json", T, FT, _index(raw="{weight_map"), 2, "index.json: not valid JSON"),
    # ---- HF config.json: every field we read
    ("hf-config-no-hidden-size", T, FT, _hf_config(_delete(["hidden_size"])), 2, "config.json: hidden_size: missing"),
    (
        "hf-config-hidden-size-abc",
        T,
        FT,
        _hf_config(_set(["hidden_size"], "abc")),
        2,
        "config.json: hidden_size: expected an integer in [1, 2147483647], got str 'abc'",
    ),
    (
        "hf-config-layers-fraction",
        T,
        FT,
        _hf_config(_set(["num_hidden_layers"], 2.5)),
        2,
        "num_hidden_layers: expected an integer",
    ),
    (
        "hf-config-heads-zero",
        T,
        FT,
        _hf_config(_set(["num_attention_heads"], 0)),
        2,
        "num_attention_heads: expected an integer in [1,",
    ),
    ("hf-config-vocab-bool", T, FT, _hf_config(_set(["vocab_size"], True)), 2, "vocab_size: expected an integer"),
    (
        "hf-config-eps-string",
        T,
        FT,
        _hf_config(_set(["layer_norm_eps"], "1e-5")),
        2,
        "layer_norm_eps: expected a finite number > 0, got str",
    ),
    (
        "hf-config-rotary-pct-above-one",
        T,
        FT,
        _hf_config(_set(["rotary_pct"], 3)),
        2,
        "rotary_pct: expected a finite number in [0, 1], got int 3",
    ),
    (
        "hf-config-tie-yes",
        T,
        FT,
        _hf_config(_set(["tie_word_embeddings"], "yes")),
        2,
        "tie_word_embeddings: expected true or false, got str 'yes'",
    ),
    (
        "hf-config-rope-a-list",
        T,
        FT,
        _hf_config(_set(["rope_parameters"], [1])),
        2,
        "rope_parameters: expected an object, got list",
    ),
    (
        "hf-config-huge",
        T,
        FT,
        _write("hf/config.json", "{" + " " * (5 << 20) + "}"),
        2,
        "config.json is 5,242,882 bytes; a file of this kind is at most 4,194,304 bytes",
    ),
    (
        "hf-config-symlink-out",
        T,
        FT,
        lambda d: (
            _write("cfg_out.json", (d / "hf" / "config.json").read_text())(d),
            _link("hf/config.json", "cfg_out.json")(d),
        ),
        2,
        "'config.json' is a symbolic link out of hf",
    ),
    # ---- a step's size, the schedule
    (
        "step-accumulation-1e6",
        T,
        S("gradient_accumulation_steps=1e6"),
        None,
        2,
        "gradient_accumulation_steps must lie in [1, 16384], got 1000000",
    ),
    (
        "step-seq-length-1e9",
        T,
        S("seq_length=1e9", "max_position_embeddings=1e9"),
        None,
        2,
        "seq_length must lie in [1, 1048576], got 1000000000",
    ),
    (
        "step-micro-batch-1e7",
        T,
        S("train_micro_batch_size_per_gpu=10000000"),
        None,
        2,
        "train_micro_batch_size_per_gpu must lie in [1, 65536]",
    ),
    (
        "step-tokens-per-rank",
        T,
        S("train_micro_batch_size_per_gpu=65536", "gradient_accumulation_steps=16384", "seq_length=16"),
        None,
        2,
        "the bound is 4,294,967,296 (2**32)",
    ),
    ("sched-min-lr-above-lr", T, S("min_lr=0.01"), None, 2, "min_lr 0.01 is above optimizer.params.lr 0.001"),
    (
        "sched-min-lr-above-lr-in-a-file",
        T,
        ["cfg.yml", "s.yml"],
        _write("s.yml", "min_lr: 0.5\n"),
        2,
        "min_lr 0.5 is above optimizer.params.lr 0.001",
    ),
    (
        "sched-min-lr-above-a-lowered-lr",
        T,
        S("optimizer.params.lr=1e-5", "min_lr=1e-4"),
        None,
        2,
        "min_lr 0.0001 is above optimizer.params.lr 1e-05",
    ),
    # ---- an empty model file is an error, not the default model
    ("empty-config-file", T, ["cfg.yml", "empty.yml"], _write("empty.yml", ""), 2, "empty.yml: the file sets no keys"),
    (
        "comment-only-config-file",
        T,
        ["cfg.yml", "c.yml"],
        _write("c.yml", "# seq_length: 32\n"),
        2,
        "c.yml: the file sets no keys (it is empty or only comments)",
    ),
    ("empty-mapping-config-file", T, ["cfg.yml", "e.yml"], _write("e.yml", "{}\n"), 2, "e.yml: the file sets no keys"),
    (
        "plan-empty-model-file",
        PL,
        ["--model", "empty.yml", "--system", os.path.join(ROOT, "configs", "frontier.yml"), "--nodes", "2"],
        _write("empty.yml", "\n\n"),
        2,
        "empty.yml: the file sets no keys",
    ),
    # ---- outputs over files the run did not create
    (
        "log-dir-inside-checkpoint-step",
        T,
        S(f"log_dir={STEP}"),
        None,
        2,
        f"log_dir {STEP} lies inside the checkpoint folder",
    ),
    ("log-dir-below-checkpoint-step", T, S(f"log_dir={STEP}/logs"), None, 2, "lies inside the checkpoint folder"),
    (
        "log-dir-holds-users-config",
        T,
        S("log_dir=mylog"),
        _user_config_in_log,
        2,
        "log_dir mylog holds a config.yml that no run wrote",
    ),
    (
        "log-dir-config-is-the-input",
        T,
        ["mylog/config.yml", "--set", "log_dir=mylog"],
        lambda d: (d / "mylog").mkdir() or (d / "mylog" / "config.yml").write_text((d / "cfg.yml").read_text()),
        2,
        "holds a config.yml that no run wrote",
    ),
    (
        "log-dir-config-is-a-fifo",
        T,
        S("log_dir=mylog"),
        lambda d: (d / "mylog").mkdir() or _fifo("mylog/config.yml")(d),
        2,
        "holds a config.yml that no run wrote",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_r3(case, world, tmp_path, monkeypatch, capfd):
    cid, entry, argv, mutate, code, needle = case
    d = scratch(world, tmp_path, monkeypatch)
    if mutate:
        mutate(d)
    before = snap(d)
    capfd.readouterr()
    t0 = time.perf_counter()
    rc = call(entry, argv)
    took = time.perf_counter() - t0
    line = one_error_line(capfd)
    assert rc == code, (rc, line)
    assert needle in line, line
    assert len(line) < 600, line  # file contents are never echoed beyond a short excerpt
    assert took < 30, f"{cid} took {took:.1f} s"
    after = snap(d)
    after = {k: v for k, v in after.items() if not k.startswith("cache/")}
    before = {k: v for k, v in before.items() if not k.startswith("cache/")}
    assert after == before, ({p for p in before if before[p] != after.get(p)}, set(after) - set(before))


def test_cases_are_documented():
    doc = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    missing = [c[0] for c in CASES if f"`{c[0]}`" not in doc]
    assert not missing, missing


# ------------------------------------------------------------------------------ asked for: correct behaviour
def test_unverified_load_when_asked_for(world, tmp_path, monkeypatch, capfd):
    d = scratch(world, tmp_path, monkeypatch)
    _meta(_delete(["files"]))(d)
    assert call(T, LOAD + ["--set", "train_iters=3", "--set", "load_unverified=true"]) == 0


def test_architecture_change_when_asked_for(world, tmp_path, monkeypatch):
    scratch(world, tmp_path, monkeypatch)
    assert call(T, S("finetune_from=ck", "rotary_pct=0.5", "finetune_architecture_change=true")) == 0


def test_finetune_from_with_the_same_architecture_trains(world, tmp_path, monkeypatch):
    scratch(world, tmp_path, monkeypatch)
    assert call(T, S("finetune_from=ck", "log_dir=log_ft")) == 0
    assert call(T, FT + ["--set", "log_dir=log_hf"]) == 0  # the HF export, through the checked index/config


def test_an_index_of_a_hub_cache_snapshot_may_link_into_its_blobs(world, tmp_path, monkeypatch):
    """HuggingFace's hub cache links snapshots/REV/FILE to ../../blobs/HASH: that is not 'out'."""
    d = scratch(world, tmp_path, monkeypatch)
    snap_dir = d / "hub" / "models--x" / "snapshots" / "rev"
    blobs = d / "hub" / "models--x" / "blobs"
    snap_dir.mkdir(parents=True)
    blobs.mkdir()
    _index()(d)  # hf/model.safetensors.index.json
    for f in ("config.json", "model.safetensors", "model.safetensors.index.json"):
        os.rename(d / "hf" / f, blobs / f)
        os.symlink(os.path.join("..", "..", "blobs", f), snap_dir / f)
    assert call(T, ["cfg.yml", "--set", f"finetune_from={snap_dir}", "--set", "log_dir=log_hub"]) == 0


def test_log_dir_of_an_earlier_run_is_reused(world, tmp_path, monkeypatch):
    """The config.yml a run wrote is replaced by the next run with that log_dir (resume, rerun)."""
    d = scratch(world, tmp_path, monkeypatch)
    assert call(T, S("log_dir=lg", "save=ck2")) == 0
    first = (d / "lg" / "config.yml").read_text()
    assert call(T, S("log_dir=lg", "load=ck2", "save=ck2", "train_iters=3")) == 0
    assert (d / "lg" / "config.yml").read_text() != first and "train_iters: 3" in (d / "lg" / "config.yml").read_text()


MODEL = ["num_layers=2", "hidden_size=32", "num_attention_heads=4", "seq_length=16", "max_position_embeddings=16"]


@pytest.mark.parametrize(
    "value",
    [
        "run #2/ck",
        "a: b",
        "[x, y]",
        "{k: v}",
        "&anchor",
        "*alias",
        "'half",
        "- item",
        "x # y # z",
        "!!python/object foo",
        "%TAG",
        "`tick`",
        "@at",
        "| block",
    ],
)
def test_set_keeps_yaml_syntax_as_text_for_string_keys(value):
    from megatron_topo.config import load_config

    cfg = load_config([], [f"save={value}", "zero_topo.preset=zero1", "vocab_size=64", f"log_dir={value}", *MODEL])
    assert cfg.checkpoint.save == value and cfg.logging.log_dir == value


def test_set_still_parses_yaml_for_other_keys_and_quoted_or_null_strings():
    from megatron_topo.config import load_config

    cfg = load_config(
        [],
        [
            "seq_length=32 # tokens",
            "train_data_paths=[a, b]",
            "save='q # x'",
            "load=null",
            "eval_interval=0",
            "vocab_size=64",
            *MODEL[:3],
            "max_position_embeddings=32",
        ],
    )
    assert cfg.model.seq_length == 32 and cfg.data.train_data_paths == ["a", "b"]
    assert cfg.checkpoint.save == "q # x" and cfg.checkpoint.load is None


def test_plot_metrics_says_which_non_finite_points_it_did_not_draw(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text(
        "".join(f'{{"step": {i}, "loss": {v}}}\n' for i, v in enumerate(["1.0", "NaN", "Infinity", "0.5", "-Infinity"]))
    )
    capfd.readouterr()
    assert call(PM, ["r", "--out", "o.png"]) == 0
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert err == ["plot_metrics: warning: r: loss: 3 non-finite value(s) not drawn (step 1, 2, 4)"], err
