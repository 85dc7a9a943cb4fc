"""Hostile inputs, round 7 (issue 29, probe 7): config numbers and launcher variables.

Families: F1, a JSON config (DeepSpeed / GPT-NeoX .json) read an integer key's float literal as an
integer after rounding (``{"keep_last": 1e-400}`` was keep_last 0, ``32.0000000000000001`` was 32):
JSON numbers now keep their text as YAML's do, so one rule refuses them everywhere. F2, a YAML
explicit tag whose text its constructor cannot read (``!!int 1e-400``, ``!!bool 1``, ``!!timestamp
2024-13-45``) was a traceback (or Python's bare message): now one line naming the file, line, key
and value. F7, an error about a job-wide launcher variable (MASTER_PORT=29500.0) was printed by every
rank: now by rank 0 only. And: SLURM_NNODES=-1/1.0, ``!!float 1_`` / ``"1_"``, meta.json format 2e0.
"""

import json
import os
import shutil
import subprocess
import sys
import typing

import pytest

from megatron_topo.commands import check_neox_configs, gpu_check, plan, predict_perf, prepare_data
from megatron_topo.commands import generate as generate_cli
from megatron_topo.commands import train as train_cli
from megatron_topo.config import ConfigError, load_config
from megatron_topo.config.deepspeed import SchedulerBlock, ZeroOptimizationBlock
from megatron_topo.config.options import _strip_optional
from megatron_topo.config.schema import Config, SystemConfig, _declared

from .cli_cases import call, one_error_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.yml")
FRONTIER = os.path.join(ROOT, "configs", "frontier.yml")
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
)


@pytest.fixture
def cfg_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    shutil.copy(TINY, tmp_path / "cfg.yml")
    return tmp_path


def _problems(paths, sets=(), require=True):
    with pytest.raises(ConfigError) as e:
        load_config(list(paths), list(sets), require=require)
    return str(e.value).splitlines()


def _nested(dotted: str, value):
    out = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _int_keys():
    """Every declared integer key (and list-of-integer key) as (dotted key, is_list)."""
    cfg = Config(system=SystemConfig(), zero_optimization=ZeroOptimizationBlock())
    cfg.train.scheduler = SchedulerBlock()
    out = []
    for path, _value, _meta, tp in _declared(cfg, with_type=True):
        t = _strip_optional(tp)
        is_list = typing.get_origin(t) in (list, tuple)
        if is_list:
            t = (typing.get_args(t) or (None,))[0]
        if t is int:
            out.append((path, is_list))
    return out


INT_KEYS = _int_keys()


# ------------------------------------------------------------------------------ F1: JSON number literals
@pytest.mark.parametrize("literal", ["1e-400", "-1e-400", "2e-324", "5.0000000000000001", "7.00000000000000000001e0"])
def test_a_json_config_refuses_a_non_integer_literal_for_every_integer_key(cfg_dir, literal):
    """Before: json.loads gave float 0.0 / 5.0 and the integer check took it (no text kept), so
    keep_last 1e-400 was keep_last 0 (keep every step) and 5.0000000000000001 was 5, silently. Now the
    line names the file, the key and the literal as written (never "got 0")."""
    assert len(INT_KEYS) > 60 and ("keep_last", False) in INT_KEYS and ("extra_save_iters", True) in INT_KEYS
    bad = []
    for key, is_list in INT_KEYS:
        (cfg_dir / "k.json").write_text(
            json.dumps(_nested(key, "@")).replace('"@"', f"[{literal}]" if is_list else literal)
        )
        try:
            lines = _problems(["k.json"], require=False)
        except BaseException as e:  # accepted (pytest's Failed) or another exception
            bad.append((key, "accepted" if "DID NOT RAISE" in str(e) else repr(e)[:200]))
            continue
        item = "[0]" if is_list else ""
        want = f"k.json: {key}{item}: expected an integer, got float {literal}"
        if want not in lines:
            bad.append((key, lines))
    assert not bad, bad[:6]


@pytest.mark.parametrize(
    "doc, want",
    [
        ('{"keep_last": 1e-400}', "k.json: keep_last: expected an integer, got float 1e-400"),
        ('{"pipe_parallel_size": -1e-400}', "k.json: pipe_parallel_size: expected an integer, got float -1e-400"),
        ('{"extra_save_iters": [4, 1e-400]}', "k.json: extra_save_iters[1]: expected an integer, got float 1e-400"),
        (
            '{"zero_optimization": {"stage": 2e-324}}',
            "k.json: zero_optimization.stage: expected an integer, got float 2e-324",
        ),
        (
            '{"num_workers": 2.0000000000000001}',
            "k.json: num_workers: expected an integer, got float 2.0000000000000001",
        ),
    ],
)
def test_a_json_config_beside_a_yaml_config_is_one_line_through_train(cfg_dir, capfd, doc, want):
    """The probe's form: cfg.yml plus a DeepSpeed JSON (before: exit 0 and the value rounded)."""
    (cfg_dir / "k.json").write_text(doc)
    assert call(train_cli.main, ["cfg.yml", "k.json", "--set", "train_iters=1"]) == 2
    assert one_error_line(capfd) == f"error: {want}"
    assert call(prepare_data.main, ["cfg.yml", "k.json", "--world-size", "1"]) == 2
    assert one_error_line(capfd) == f"error: {want}"


def test_a_json_model_for_plan_and_predict_perf_is_refused_the_same_way(cfg_dir, capfd):
    model = {k: v for k, v in _tiny_dict().items() if k not in ("distributed",)}
    text = json.dumps(model).replace(f'"hidden_size": {model["hidden_size"]}', '"hidden_size": 64.0000000000000001')
    (cfg_dir / "m.json").write_text(text)
    want = "error: m.json: hidden_size: expected an integer, got float 64.0000000000000001"
    assert call(plan.main, ["--model", "m.json", "--system", FRONTIER, "--nodes", "1"]) == 2
    assert one_error_line(capfd) == want
    assert call(predict_perf.main, ["--model", "m.json", "--system", FRONTIER, "--gcds", "8"]) == 2
    assert one_error_line(capfd) == want


def _tiny_dict():
    import yaml

    with open(TINY) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize(
    "literal, value", [("2.0", 2), ("5e3", 5000), ("1E2", 100), ("7", 7), ("-0.0e0", 0), ("0.5e1", 5)]
)
def test_control_integral_json_literals_still_read(cfg_dir, literal, value):
    (cfg_dir / "k.json").write_text(f'{{"seed": {literal}, "optimizer": {{"params": {{"lr": 6e-4}}}}}}')
    cfg = load_config([str(cfg_dir / "k.json")], require=False)
    assert cfg.train.seed == value and type(cfg.train.seed) is int
    assert cfg.train.optimizer.params.lr == 6e-4


def test_a_json_number_for_a_text_key_keeps_its_text_as_from_yaml(cfg_dir):
    """``"save": 1e3`` was the folder '1000.0' from JSON and '1e3' from YAML; now '1e3' from both."""
    (cfg_dir / "k.json").write_text('{"save": 1e3, "log_dir": 0.50}')
    cfg = load_config([str(cfg_dir / "k.json")], require=False)
    assert (cfg.checkpoint.save, cfg.logging.log_dir) == ("1e3", "0.50")


def test_a_json_integer_of_too_many_digits_is_one_line(cfg_dir):
    (cfg_dir / "k.json").write_text('{"seed": ' + "9" * 5000 + "}")
    assert _problems(["k.json"], require=False) == [
        "k.json: an integer of 5,000 digits; a config value has at most 1000"
    ]


# ------------------------------------------------------------------------------ F2: YAML explicit tags
TAG_FORMS = [
    ("!!int 1e-400", "is not an integer"),
    ("!!int ''", "is not an integer"),
    ("!!int 0x", "is not an integer"),
    ("!!int 0o", "is not an integer"),
    ("!!int 1.5", "is not an integer"),
    ("!!int abc", "is not an integer"),
    ("!!int 0b101", "is not an integer"),
    ("!!int 1:30", "is not an integer"),
    ("!!int 1_", "is not an integer"),
    ("!!int _1", "is not an integer"),
    ("!!int 1__0", "is not an integer"),
    ("!!int +", "is not an integer"),
    ("!!int 0x_", "is not an integer"),
    ("!!float abc", "is not a number"),
    ("!!float ''", "is not a number"),
    ("!!float 1:30", "is not a number"),
    ("!!float 1_", "is not a number"),
    ("!!float 1.5_", "is not a number"),
    ("!!float 1e", "is not a number"),
    ("!!float .", "is not a number"),
    ("!!float inf", "is not a number"),
    ("!!float 0x10", "is not a number"),
    ("!!bool 1", "is not a boolean"),
    ("!!bool yes", "is not a boolean"),
    ("!!bool ''", "is not a boolean"),
    ("!!timestamp 2024-13-45", "cannot be read as !!timestamp: month must be in 1..12"),
    ("!!timestamp 2024-02-30", "cannot be read as !!timestamp"),
]
TAG_KEYS = ["seed", "optimizer.params.lr", "save", "zero_optimization.stage", "checkpoint_factor"]


def _yaml_of(key: str, value: str) -> str:
    parts = key.split(".")
    return (
        "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
        + f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}\n"
    )


@pytest.mark.parametrize("form, what", TAG_FORMS, ids=[f[0] for f in TAG_FORMS])
def test_a_bad_explicit_tag_in_a_file_is_one_line_naming_file_line_key_value(cfg_dir, form, what):
    """Before: ValueError / KeyError tracebacks from int(), float(), PyYAML's bool table and
    datetime. Every key, nested or not, names its line and dotted key."""
    shown = form
    for key in TAG_KEYS:
        (cfg_dir / "y.yml").write_text("# a comment line\n" + _yaml_of(key, form))
        line_no = 1 + len(key.split("."))
        lines = _problems(["cfg.yml", "y.yml"])
        assert len(lines) == 1, (key, lines)
        assert lines[0].startswith(f"y.yml: line {line_no}: {key}: {shown!r} {what}"), (key, lines[0])


@pytest.mark.parametrize("form, what", TAG_FORMS, ids=[f[0] for f in TAG_FORMS])
def test_a_bad_explicit_tag_in_set_and_in_a_merge_key_is_one_line(cfg_dir, form, what):
    shown = form
    for key in ("seed", "optimizer.params.lr", "zero_optimization.stage"):  # save: a text key keeps '!!int x' as text
        lines = _problems(["cfg.yml"], [f"{key}={form}"])
        assert lines == [f"--set {key}={form}: {shown!r} {what}"] or (
            len(lines) == 1 and lines[0].startswith(f"--set {key}={form}: {shown!r} {what}")
        ), lines
    (cfg_dir / "m.yml").write_text(f"base: &b {{seed: {form}}}\n<<: *b\n")
    lines = _problems(["cfg.yml", "m.yml"])
    assert len(lines) == 1 and lines[0].startswith(f"m.yml: line 1: seed: {shown!r} {what}"), lines
    (cfg_dir / "l.yml").write_text(f"extra_save_iters: [2, {form}]\n")
    lines = _problems(["cfg.yml", "l.yml"])
    assert len(lines) == 1 and lines[0].startswith(f"l.yml: line 1: extra_save_iters[1]: {shown!r} {what}"), lines


@pytest.mark.parametrize(
    "entry, argv",
    [
        (train_cli.main, ["cfg.yml", "y.yml", "--set", "train_iters=1"]),
        (train_cli.main, ["cfg.yml", "y.yml", "--dry-run"]),
        (prepare_data.main, ["cfg.yml", "y.yml", "--world-size", "1"]),
        (generate_cli.main, ["cfg.yml", "y.yml", "--set", "text_gen_type=unconditional"]),
        (gpu_check.main, ["cfg.yml", "y.yml", "--small"]),
        (plan.main, ["--model", "y.yml", "--system", FRONTIER, "--nodes", "1"]),
        (predict_perf.main, ["--model", "y.yml", "--system", FRONTIER, "--gcds", "8"]),
    ],
    ids=["train", "dry-run", "prepare_data", "generate", "gpu_check", "plan", "predict_perf"],
)
@pytest.mark.parametrize("form", ["!!int 1e-400", "!!float abc", "!!bool 1", "!!timestamp 2024-13-45"])
def test_every_config_tool_prints_the_tag_error_in_one_line(cfg_dir, capfd, entry, argv, form):
    """Before: train/prepare_data/generate/gpu_check printed a traceback, --dry-run/plan/predict_perf
    Python's bare message (no file, line or key)."""
    (cfg_dir / "y.yml").write_text(f"seed: {form}\n")
    assert call(entry, argv) == 2
    line = one_error_line(capfd)
    assert line.startswith(f"error: y.yml: line 1: seed: {form!r} "), line


def test_check_neox_configs_names_the_tag_error(cfg_dir, capfd):
    (cfg_dir / "nx").mkdir()
    (cfg_dir / "nx" / "a.yml").write_text("seed: !!int 1e-400\n")
    call(check_neox_configs.main, ["nx"])
    out = capfd.readouterr()
    assert "Traceback" not in out.err
    assert "line 1: seed: '!!int 1e-400' is not an integer" in out.out, out.out[-2000:]


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("seed: !!int 5", "seed", 5),
        ("seed: !!int 0x10", "seed", 16),
        ("seed: !!int +0o17", "seed", 15),
        ("seed: !!int 1_000", "seed", 1000),
        ("seed: 1_000", "seed", 1000),
        ("seed: 2.0", "seed", 2),
        ("seed: 5e3", "seed", 5000),
        ("seed: '1_000'", "seed", 1000),
        ("optimizer: {params: {lr: !!float 6e-4}}", "lr", 6e-4),
        ("optimizer: {params: {lr: !!float 0.1_25}}", "lr", 0.125),
        ("optimizer: {params: {lr: !!float 1}}", "lr", 1.0),
        ("optimizer: {params: {lr: 1.}}", "lr", 1.0),
        ("fp16: {enabled: !!bool true}", "fp16", True),
    ],
)
def test_control_valid_tags_and_literals_still_read(cfg_dir, text, key, value):
    (cfg_dir / "v.yml").write_text(text + "\n")
    cfg = load_config(["v.yml"], require=False)
    got = {
        "seed": lambda: cfg.train.seed,
        "lr": lambda: cfg.train.optimizer.params.lr,
        "fp16": lambda: cfg.train.fp16.enabled,
    }[key]()
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("form", ["1_", "_1", "1__0", "1_e3"])
def test_underscores_follow_pythons_rule_for_plain_and_quoted_values(cfg_dir, form):
    """``!!float 1_`` was read as 1 and a plain/quoted ``1_`` for an integer key as 1 ('_' removed
    everywhere); int()/float() refuse them, and so does the config now, whichever way it is written."""
    for text in (f"seed: {form}", f"seed: '{form}'"):
        (cfg_dir / "u.yml").write_text(text + "\n")
        lines = _problems(["u.yml"], require=False)
        assert lines == [f"u.yml: seed: expected an integer, got str {form!r}"], lines
    (cfg_dir / "u.yml").write_text(f"optimizer: {{params: {{lr: {form}}}}}\n")
    lines = _problems(["u.yml"], require=False)
    assert len(lines) == 1 and form in lines[0], lines


# ------------------------------------------------------------------------------ meta.json format
def test_meta_json_format_must_be_a_json_integer(tmp_path):
    """``"format": 2e0`` was read as format 2 while ``"step": 2.0`` is refused (shape and offset
    floats are refused already): one rule for every integer field of meta.json."""
    from megatron_topo.zero_topo.checkpoint import meta_schema

    with pytest.raises(meta_schema.MetaError, match=r"format: checkpoint format 2\.0 is not supported"):
        meta_schema.validate({"format": 2.0}, (1, 2))


# ------------------------------------------------------------------------------ SLURM_* variables
@pytest.mark.parametrize(
    "env, line",
    [
        (
            {"SLURM_NNODES": "-1"},
            "SLURM_NNODES=-1 is not a node count of this job; valid: 1..1 (at most one node per task)",
        ),
        ({"SLURM_NNODES": "0"}, "SLURM_NNODES=0 is not a node count of this job; valid: 1..1"),
        ({"SLURM_NNODES": "2"}, "SLURM_NNODES=2 is not a node count of this job; valid: 1..1"),
        ({"SLURM_NNODES": "1.0"}, "SLURM_NNODES='1.0' is not an integer of at most 24 digits"),
        ({"SLURM_NNODES": "0x1"}, "SLURM_NNODES='0x1' is not an integer of at most 24 digits"),
        ({"SLURM_NNODES": "1e0"}, "SLURM_NNODES='1e0' is not an integer of at most 24 digits"),
        ({"SLURM_LOCALID": "\u00b2"}, "SLURM_LOCALID='\u00b2' is not an integer of at most 24 digits"),
    ],
)
def test_slurm_variables_are_one_line_naming_the_variable(cfg_dir, capfd, env, line):
    """Before: SLURM_NNODES=-1 was taken as 1 (silently) and 1.0 / 0x1 gave Python's "invalid literal
    for int()" without the variable's name; a superscript digit passed isdigit() and crashed int()."""
    base = {"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
    for k, v in {**base, **env}.items():
        os.environ[k] = v
    try:
        assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
        got = one_error_line(capfd)
    finally:
        for k in {**base, **env}:
            os.environ.pop(k, None)
    assert got.startswith(f"error: launcher environment: {line}"), got


@pytest.mark.parametrize(
    "env, line",
    [
        ({"SLURM_NTASKS": "1.0"}, "SLURM_NTASKS='1.0' is not an integer of at most 24 digits"),
        ({"SLURM_PROCID": "0.0"}, "SLURM_PROCID='0.0' is not an integer of at most 24 digits"),
        ({"SLURM_LOCALID": "x"}, "SLURM_LOCALID='x' is not an integer of at most 24 digits"),
        (
            {"SLURM_NTASKS_PER_NODE": "1.0(x2)"},
            "SLURM_NTASKS_PER_NODE='1.0(x2)' is not an integer of at most 24 digits",
        ),
    ],
)
def test_control_other_slurm_forms_stay_one_line(cfg_dir, capfd, env, line):
    test_slurm_variables_are_one_line_naming_the_variable(cfg_dir, capfd, env, line)


def test_control_slurm_nnodes_divides_the_tasks():
    from megatron_topo.topology import launcher_env

    le = launcher_env({"SLURM_NTASKS": "8", "SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NNODES": "2"})
    assert le == {"world_size": 8, "rank": 3, "local_rank": 3, "local_world_size": 4}


# ------------------------------------------------------------------------------ F7: once per job
def _two_ranks(cfg_dir, extra_env, launcher, rank_env=({}, {}), port="29581"):
    """Two train.py processes as ranks 0 and 1 of one job (``launcher``: the variables torchrun or
    srun sets, or none: ranks started by hand); (exit codes, the error: lines of both)."""
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        if launcher == "torchrun":
            env.update(TORCHELASTIC_RUN_ID="r7")
        elif launcher == "srun":
            env.update(SLURM_STEP_ID="0", SLURM_PROCID=str(r), SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2")
        env.update(extra_env)
        env.update(rank_env[r])
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "train.py"), "cfg.yml", "--set", "train_iters=1"],
                cwd=cfg_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    lines = [ln for o, e in outs for ln in (o + e).splitlines() if ln.startswith("error:")]
    return [p.returncode for p in procs], lines, [e for _o, e in outs]


JOB_WIDE = [
    ({"MASTER_PORT": "29500.0"}, "error: MASTER_PORT='29500.0' is not a port number"),
    ({"MASTER_PORT": "3e4"}, "error: MASTER_PORT='3e4' is not a port number"),
    ({"MASTER_PORT": "0x7530"}, "error: MASTER_PORT='0x7530' is not a port number"),
    ({"MASTER_PORT": "30_011"}, "error: MASTER_PORT='30_011' is not a port number"),
    ({"MASTER_PORT": "+30013"}, "error: MASTER_PORT='+30013' is not a port number"),
    ({"MASTER_PORT": "70000"}, "error: MASTER_PORT='70000' is not a port number"),
    ({"MASTER_ADDR": "localhost."}, "error: MASTER_ADDR='localhost.' cannot be resolved"),
    ({"MASTER_ADDR": " 127.0.0.1 "}, "error: MASTER_ADDR=' 127.0.0.1 ' cannot be resolved"),
    ({"MASTER_ADDR": ""}, "error: MASTER_ADDR is not set"),
]


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "by-hand"])
@pytest.mark.parametrize("env, want", JOB_WIDE[:1] + JOB_WIDE[6:7], ids=["port-float", "addr-dot"])
def test_a_job_wide_launcher_variable_error_is_one_line_per_job(cfg_dir, launcher, env, want):
    """Before: each of the two ranks printed the same line (the probe's two processes)."""
    rcs, lines, _ = _two_ranks(cfg_dir, env, launcher)
    assert rcs == [2, 2]
    assert len(lines) == 1 and lines[0].startswith(want), lines


def test_every_job_wide_form_is_refused_by_rank_0_alone(cfg_dir, capfd, monkeypatch):
    """In-process (fast): rank 1 of a launched job prints nothing for each form, rank 0 prints it."""
    for env, want in JOB_WIDE:
        for rank, launcher in ((1, {"TORCHELASTIC_RUN_ID": "r7"}), (1, {}), (0, {"TORCHELASTIC_RUN_ID": "r7"})):
            base = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
            full = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29582", **launcher, **env}
            for k, v in full.items():
                monkeypatch.setenv(k, v)
            assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
            if rank == 0 or (not launcher and env == {"MASTER_ADDR": ""}):  # by hand, no MASTER_ADDR: no job
                assert one_error_line(capfd).startswith(want)
            else:
                assert capfd.readouterr().err == "", (env, launcher)
            for k in full:
                monkeypatch.delenv(k, raising=False)
    # WORLD_SIZE past its bound: the same on every rank of a torchrun job; rank 1 quiet, rank 0 says it
    for rank in (1, 0):
        env = {"RANK": str(rank), "WORLD_SIZE": str(2**21), "TORCHELASTIC_RUN_ID": "r7"}
        for k, v in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29582"}.items():
            monkeypatch.setenv(k, v)
        assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
        err = capfd.readouterr().err
        assert (err == "") if rank else ("WORLD_SIZE=2097152 must lie in 1..1,048,576" in err), err


def test_control_rank_specific_launcher_errors_are_still_printed_by_their_rank(cfg_dir, capfd, monkeypatch):
    """LOCAL_RANK / RANK belong to one process: rank 1 still says its own line."""
    for env, want in [
        ({"LOCAL_RANK": "5"}, "LOCAL_RANK=5 is not a rank on this node"),
        ({"LOCAL_RANK": "0.0"}, "LOCAL_RANK='0.0' is not an integer"),
    ]:
        full = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "r7"}
        full.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583", **env)
        for k, v in full.items():
            monkeypatch.setenv(k, v)
        assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
        assert want in one_error_line(capfd)


def test_a_lone_process_without_a_world_still_prints_a_job_wide_error(cfg_dir, capfd, monkeypatch):
    """RANK=1 alone (no WORLD_SIZE, MASTER_*): not a rank of a job; and a 1-rank run prints."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_NNODES", "-1")
    assert call(train_cli.main, ["cfg.yml", "--set", "train_iters=1"]) == 2
    assert "SLURM_NNODES=-1" in one_error_line(capfd)


def test_control_a_good_master_port_still_trains_two_ranks(cfg_dir):
    from .dist_utils import free_port

    rcs, lines, errs = _two_ranks(cfg_dir, {}, "by-hand", port=str(free_port()))
    assert rcs == [0, 0] and lines == [], errs


@pytest.mark.parametrize("form", ["!!map [1]", "!!set [1, 2]", "!!map [[1, 2]]"])
def test_a_mapping_tag_on_a_list_is_one_line(cfg_dir, form):
    """Before: TypeError (the repeated-key check unpacked a list's items as key/value pairs)."""
    (cfg_dir / "y.yml").write_text(f"zero_topo: {form}\n")
    assert _problems(["cfg.yml", "y.yml"]) == [
        "y.yml: line 1: invalid YAML: expected a mapping node, but found sequence"
    ]
    assert _problems(["cfg.yml"], [f"zero_topo={form}"]) == ["zero_topo: expected a mapping, got str"]  # the text


def _float_keys():
    cfg = Config(system=SystemConfig(), zero_optimization=ZeroOptimizationBlock())
    cfg.train.scheduler = SchedulerBlock()
    out = []
    for path, _value, _meta, tp in _declared(cfg, with_type=True):
        t = _strip_optional(tp)
        if typing.get_origin(t) in (list, tuple):
            continue
        if t is float:
            out.append(path)
    return out


@pytest.mark.parametrize("literal", ["1e-400", "-2e-330", "0.1e-323"])
def test_a_float_literal_that_underflows_to_0_is_refused_for_every_float_key(cfg_dir, literal):
    """Before: read as 0.0 without a word (hidden_dropout 1e-400 = 0) or refused by a bound quoting a
    value the user never wrote (``optimizer.params.eps must lie in (0, 1], got 0``)."""
    keys = _float_keys()
    assert len(keys) > 30 and "optimizer.params.eps" in keys and "hidden_dropout" in keys
    bad = []
    want = f"{literal} is below the smallest float (about 5e-324) and would be read as 0; write 0 if zero is meant"
    for key in keys:
        (cfg_dir / "k.json").write_text(json.dumps(_nested(key, "@")).replace('"@"', literal))
        for how, args in (("json", (["k.json"], [])), ("set", ([], [f"{key}={literal}"]))):
            try:
                load_config(*args, require=False)
                bad.append((key, how, "accepted"))
            except ConfigError as e:
                lines = str(e).splitlines()
                if not any(ln.endswith(f"{key}: {want}") for ln in lines):
                    bad.append((key, how, lines))
    assert not bad, bad[:6]


@pytest.mark.parametrize(
    "literal, value", [("0.0", 0.0), ("-0e5", 0.0), ("0", 0.0), ("5e-324", 5e-324), ("1e-5", 1e-5)]
)
def test_control_zero_and_subnormal_float_literals_still_read(cfg_dir, literal, value):
    (cfg_dir / "k.json").write_text(f'{{"hidden_dropout": {literal}}}')
    assert load_config(["k.json"], require=False).model.hidden_dropout == value
    assert load_config([], [f"hidden_dropout={literal}"], require=False).model.hidden_dropout == value
