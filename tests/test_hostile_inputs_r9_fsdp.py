"""Probe 9 (issue 29), tools/fsdp_baseline.py: F3 (tracebacks: OMP_NUM_THREADS, one process without
launcher variables), F4 (train.py's keys it does not implement were accepted and silently ignored:
`load=ck` trained from scratch, exit 0) and its Ctrl-C (a KeyboardInterrupt traceback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .cli_cases import BASE_CFG, ENV_VARS, ROOT, call, one_error_line, write_dataset


@pytest.fixture
def fs_dir(tmp_path, monkeypatch):
    (tmp_path / "cfg.yml").write_text(BASE_CFG)
    write_dataset(tmp_path / "data" / "toy", 16, 0)
    monkeypatch.chdir(tmp_path)
    for k in list(ENV_VARS) + [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def _main(argv):
    from megatron_topo.commands.fsdp_baseline import main

    return call(main, argv)


# ---------------------------------------------------------------- F4: keys it does not implement
@pytest.mark.parametrize(
    "sets,named",
    [
        (["load=ck"], ["load"]),
        (["save=sv", "checkpoint_factor=1", "keep_last=1"], ["save", "checkpoint_factor", "keep_last"]),
        (["save=sv", "extra_save_iters=[1]", "save_interval_minutes=1"], ["extra_save_iters", "save_interval_minutes"]),
        (["save=sv", "auto_resume=true"], ["save", "auto_resume"]),
        (["finetune_from=hf"], ["finetune_from"]),
        (["load=ck", "finetune=true", "no_load_optim=true"], ["load", "finetune", "no_load_optim"]),
        (["eval_interval=1", "eval_iters=1", "split=50,50,0"], ["eval_interval", "eval_iters"]),
        (["train_data_paths=[data/toy]", "valid_data_paths=[data/toy]", "eval_interval=1"], ["valid_data_paths"]),
        (["tensorboard_dir=tb"], ["tensorboard_dir"]),
        (["profile=true", "profile_step_start=0", "profile_step_stop=1"], ["profile", "profile_step_start"]),
        (["distributed.trace_collectives=tr"], ["distributed.trace_collectives"]),
        (["zero_topo.preset=zeropp"], ["zero_topo.preset"]),
        (["zero_topo.preset=topo", "zero_topo.secondary_degree=1"], ["zero_topo.secondary_degree"]),
        (["precision=fp16"], ["precision fp16"]),
        (["max_bad_steps=2"], ["max_bad_steps"]),
        (["distributed.rendezvous_timeout_s=5"], ["distributed.rendezvous_timeout_s"]),
        (["progress_bar=true"], ["progress_bar"]),
    ],
)
def test_fsdp_baseline_refuses_keys_it_does_not_implement(sets, named, fs_dir, capfd):
    rc = _main(["cfg.yml", "--set", "log_dir=nl", *[x for s in sets for x in ("--set", s)]])
    line = one_error_line(capfd)
    assert rc == 2, line
    assert "fsdp_baseline does not implement" in line and "run train.py" in line, line
    listed = line.split("does not implement ", 1)[1].split(": it trains only", 1)[0]
    for k in named:
        assert k in listed.split(", ") or listed.startswith(k) or f", {k}" in listed, (k, line)
    assert not (fs_dir / "nl").exists()  # refused before anything was written


def test_fsdp_baseline_accepts_what_bench_sharding_passes_and_what_changes_nothing(fs_dir):
    """The keys bench_sharding gives every FSDP2 run (tiny.yml + local_cpu.yml + its --set list) and
    keys that change nothing here (save's keys without save, eval_interval beyond train_iters)."""
    from megatron_topo.commands.fsdp_keys import unimplemented
    from megatron_topo.config import load_config

    sets = ["topology.gpus_per_node=2", "topology.gcds_per_gpu=2", "train_iters=8", "log_interval=1"]
    sets += ["eval_interval=0", "save=null", "load=null", "log_dir=x", "progress_bar=false"]
    cfg = load_config([os.path.join(ROOT, "configs", f) for f in ("tiny.yml", "local_cpu.yml")], sets)
    assert unimplemented(cfg) == []
    cfg = load_config(["cfg.yml"], ["checkpoint_factor=1", "keep_last=3", "eval_interval=50", "finetune=true"])
    assert unimplemented(cfg) == []
    cfg = load_config(["cfg.yml"], ["train_data_paths=[data/toy]", "valid_data_paths=[data/toy]", "eval_interval=0"])
    assert unimplemented(cfg) == []  # validation data that no evaluation reads (train.py reads none either)


def _other_value(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v / 2 + 0.25
    if isinstance(v, str):
        return v + "x"
    if isinstance(v, list):
        return [*v, v[-1]] if v else [1]
    return "x"  # None (an unset optional key or block)


def test_every_schema_key_is_implemented_or_refused():
    """Every field of config/schema*.py: used by fsdp_baseline (IMPLEMENTED or a whole section), or
    refused once its value differs from the default (INERT keys: unless the value changes nothing).
    A key added to the schema is refused by fsdp_baseline until it is implemented there."""
    import megatron_topo.commands.fsdp_keys as K
    from megatron_topo.config.schema import Config

    keys = dict(K.schema_keys(Config()))
    assert len(keys) > 150
    for k in K.IMPLEMENTED | set(K.INERT):
        assert k in keys or any(x.startswith(k + ".") for x in keys), f"{k} is not a schema key"
    checked = 0
    for key, default in keys.items():
        if K.implemented(key) or key in K.INERT:
            continue
        cfg = Config()
        *path, last = key.split(".")
        obj = cfg
        for p in path:
            obj = getattr(obj, p)
        if key in ("system", "zero_optimization"):  # an optional block given: every field of it acts
            from megatron_topo.config.deepspeed import ZeroOptimizationBlock
            from megatron_topo.config.schema import SystemConfig

            setattr(cfg, key, {"system": SystemConfig, "zero_optimization": ZeroOptimizationBlock}[key]())
            assert any(x.startswith(key) for x in K.unimplemented(cfg)), key
        else:
            setattr(obj, last, _other_value(default))
            assert K._shown(key) in K.unimplemented(cfg), key
        checked += 1
    assert checked > 20


# ---------------------------------------------------------------- F3: OMP_NUM_THREADS, no launcher
@pytest.mark.parametrize("value", ["abc", "", "0", "-1", "1.5", "1,2", "٣", "99999999999"])
def test_fsdp_baseline_omp_num_threads_one_line(value, fs_dir, capfd, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    rc = _main(["cfg.yml", "--set", "log_dir=nl"])
    line = one_error_line(capfd)
    assert rc == 2 and "OMP_NUM_THREADS" in line and "1..4096" in line, line
    assert not (fs_dir / "nl").exists()


@pytest.mark.parametrize("value", ["abc", "", "-1", "1.5"])
def test_fsdp_baseline_script_omp_num_threads_is_the_only_line(value, fs_dir):
    """tools/fsdp_baseline.py checks OMP_NUM_THREADS before torch loads OpenMP, whose runtime would
    print its own 'libgomp: Invalid value ...' line first."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS=value)
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "fsdp_baseline.py"), "cfg.yml", "--set", "log_dir=nl"],
        cwd=fs_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("error: OMP_NUM_THREADS=") and "1..4096" in lines[0], lines
    assert not (fs_dir / "nl").exists()


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["log_dir=cfg.yml"], "error: log_dir cfg.yml exists and is not a directory; point log_dir at a directory"),
        (["log_dir=cfg.yml/sub"], "error: log_dir cfg.yml/sub: cfg.yml exists and is not a directory"),
        (["log_dir=nl", "data_cache_dir=cfg.yml"], "error: data_cache_dir cfg.yml exists and is not a directory"),
        (["log_dir=nl", "data_path=nope"], "error: nope.idx: file not found"),
        (["log_dir=nl", "vocab_size=8"], "error: data/toy: token id"),
    ],
)
def test_fsdp_baseline_bad_data_or_output_folder_one_line(sets, needle, fs_dir, capfd):
    """Found once the single process ran (its traceback was hidden behind F3's): one line, exit 2."""
    before = (fs_dir / "cfg.yml").read_text()
    rc = _main(["cfg.yml", *[x for s in sets for x in ("--set", s)]])
    line = one_error_line(capfd)
    assert rc == 2 and line.startswith(needle), line
    assert (fs_dir / "cfg.yml").read_text() == before


@pytest.mark.parametrize("mode", ["full", "hsdp"])
def test_fsdp_baseline_runs_as_one_rank_without_launcher_variables(mode, fs_dir, capfd):
    rc = _main(["cfg.yml", "--set", "log_dir=nl", "--mode", mode])
    out, err = capfd.readouterr()
    assert rc == 0, err[-2000:]
    assert "Traceback" not in err and "done: step 2" in out
    recs = [json.loads(x) for x in (fs_dir / "nl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]


# ---------------------------------------------------------------- Ctrl-C
def test_fsdp_baseline_ctrl_c_is_one_line_exit_130(fs_dir):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    p = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tools", "fsdp_baseline.py"), "cfg.yml", "--set", "log_dir=nl"]
        + ["--set", "train_iters=2000"],
        cwd=fs_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if line.startswith("step 1:") or not line:
            break
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("note: ")]
    assert p.returncode == 130, err[-2000:]
    assert lines == ["error: interrupted; metrics.jsonl holds the steps logged so far"], err[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_baseline_ctrl_c_two_ranks_one_line(fs_dir):
    """A Ctrl-C reaches the ranks one after another (0.5 s apart here): rank 0 prints the one line,
    rank 1, whose collective failed when rank 0 left, exits 130 silently (no gloo traceback)."""
    port = _free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE="2")
        env.update(LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tools", "fsdp_baseline.py"), "cfg.yml", "--set", "log_dir=nl"]
                + ["--set", "train_iters=2000"],
                cwd=fs_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        )
    deadline = time.time() + 90
    while time.time() < deadline:
        line = procs[0].stdout.readline()
        if line.startswith("step 2:") or not line:
            break
    procs[0].send_signal(signal.SIGINT)
    time.sleep(0.5)
    procs[1].send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=60) for p in procs]
    errs = [[x for x in e.splitlines() if x.strip() and not x.startswith("note: ")] for _, e in outs]
    assert [p.returncode for p in procs] == [130, 130], [e[-1500:] for _, e in outs]
    assert errs == [["error: interrupted; metrics.jsonl holds the steps logged so far"], []], errs


def test_fsdp_baseline_data_error_two_ranks_one_line(fs_dir):
    """A data error every rank finds (token ids beyond vocab_size): rank 0's line only, exit 2 on both."""
    port = _free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
        env.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tools", "fsdp_baseline.py"), "cfg.yml"]
                + ["--set", "log_dir=nl", "--set", "vocab_size=8"],
                cwd=fs_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    errs = [[x for x in e.splitlines() if x.strip() and not x.startswith("note: ")] for _, e in outs]
    assert [p.returncode for p in procs] == [2, 2], [e[-1500:] for _, e in outs]
    assert len(errs[0]) == 1 and errs[0][0].startswith("error: data/toy: token id") and errs[1] == [], errs
