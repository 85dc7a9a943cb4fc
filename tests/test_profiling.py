"""GPT-NeoX's profiling keys (megatron_topo/training/profiling.py, docs/profiling.md): the window's
trace per rank, bit-identical training, no collective added, files never replaced, and one error
line for each bad value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from megatron_topo.config import ConfigError, load_config
from megatron_topo.training import Trainer, profiling

from .dist_utils import run_distributed
from .train_utils import datasets, local_runtime, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny.yml")


def _train(rank, world, tmp, tag, profile, tb=None, until=None, **over):
    sets = {"train.train_iters": 3, "train.gradient_accumulation_steps": 2, **over}
    if profile:
        sets.update({"logging.profile": True, "logging.profile_step_start": 1, "logging.profile_step_stop": 2})
    cfg = small_config(tmp, **sets)
    cfg.logging.log_dir = str(tmp / tag)
    cfg.logging.tensorboard_dir = tb
    tr = Trainer(cfg, local_runtime(rank, world), datasets=datasets(cfg))
    tr.train(until=until)
    losses = [json.loads(x)["loss"] for x in open(tmp / tag / "metrics.jsonl")] if rank == 0 else None
    params = {n: p.clone() for n, p in tr.engine.full_parameters().items()}
    return losses, params, (tr.profiler.written if tr.profiler is not None else None)


def _events(path) -> list:
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_the_window_is_traced_once_and_training_is_bit_identical(tmp_path):
    """Window [1, 2): step 2 of 3 (GPT-NeoX counts steps done) is traced into exactly
    rank0_steps2-2.pt.trace.json, a Chrome trace with the step's ranges and its ops; the losses and
    weights equal a run without profiling bit for bit. A second run into the same folder never
    replaces the first trace: it takes the next free name."""
    tb = tmp_path / "tb"
    plain_losses, plain, _ = _train(0, 1, tmp_path, "plain", False)
    losses, params, written = _train(0, 1, tmp_path, "prof", True, tb=str(tb))
    assert losses == plain_losses and len(losses) == 3
    for name, want in plain.items():
        assert torch.equal(params[name], want), name
    trace = tb / "profile" / "rank0_steps2-2.pt.trace.json"
    assert written == [str(trace)]
    assert sorted(os.listdir(tb / "profile")) == [trace.name]  # no temporary file left
    names = [e.get("name") for e in _events(trace)]
    assert names.count("step 2") == 1 and "step 1" not in names and "step 3" not in names
    assert names.count("forward") == 2 and names.count("backward") == 2 and names.count("optimizer step") == 1
    assert any(n and n.startswith("aten::mm") for n in names)
    first = trace.read_bytes()
    _, _, again = _train(0, 1, tmp_path, "prof2", True, tb=str(tb))
    assert again == [str(tb / "profile" / "rank0_steps2-2.1.pt.trace.json")]
    assert trace.read_bytes() == first


def test_a_run_stopped_inside_the_window_writes_the_steps_it_ran(tmp_path):
    losses, _, written = _train(
        0, 1, tmp_path, "cut", True, until=2, **{"logging.profile_step_start": 1, "logging.profile_step_stop": 3}
    )
    assert len(losses) == 2
    assert [os.path.basename(p) for p in written] == ["rank0_steps2-2.pt.trace.json"]


def _two_ranks(rank, world, tmp, profile):
    trace = tmp / ("traced" if profile else "plain")
    losses, _, written = _train(
        rank, world, tmp, f"run{int(profile)}", profile, **{"distributed.trace_collectives": str(trace)}
    )
    return losses, written


def test_two_ranks_write_one_trace_each_and_issue_the_same_collectives(tmp_path):
    """Each rank writes its own trace; the collective trace (distributed.trace_collectives) of a
    profiled run equals the plain run's on every rank: profiling adds and reorders no collective."""
    prof = run_distributed(_two_ranks, 2, tmp_path, True)
    plain = run_distributed(_two_ranks, 2, tmp_path, False)
    assert prof[0][0] == plain[0][0]  # rank 0's losses: bit-identical
    folder = tmp_path / "run1" / "tensorboard" / "profile"
    assert sorted(os.listdir(folder)) == ["rank0_steps2-2.pt.trace.json", "rank1_steps2-2.pt.trace.json"]
    assert [os.path.basename(w[0]) for _, w in prof] == sorted(os.listdir(folder))
    for r in range(2):
        assert "step 2" in {e.get("name") for e in _events(folder / f"rank{r}_steps2-2.pt.trace.json")}
        a = (tmp_path / "traced" / f"rank_{r}.jsonl").read_text()
        b = (tmp_path / "plain" / f"rank_{r}.jsonl").read_text()
        assert a == b and a.count("\n") > 0


@pytest.mark.parametrize(
    "sets, line",
    [
        (
            ["profile=true", "profile_step_start=2", "profile_step_stop=2"],
            "profile_step_start 2 is not below profile_step_stop 2: no step profiled; valid: 0 <= "
            "profile_step_start < profile_step_stop <= train_iters 3",
        ),
        (["profile=true", "profile_step_start=-1"], "profile_step_start must be >= 0, got -1"),
        (
            ["profile=true"],
            "profile_step_stop 12 (default) is beyond train_iters 3: steps 11..12 of the window never run; "
            "valid: 0 <= profile_step_start < profile_step_stop <= train_iters 3",
        ),
        (
            ["profile=true", "profile_step_start=1", "profile_step_stop=5"],
            "profile_step_stop 5 is beyond train_iters 3: steps 4..5 of the window never run; valid: 0 <= "
            "profile_step_start < profile_step_stop <= train_iters 3",
        ),
        (
            ["profile_step_start=1"],
            "profile_step_start is set but takes effect only with profile: true or memory_profiling: true, "
            "which is not set; set it or drop profile_step_start",
        ),
        (
            ["profile_backward=true"],
            "profile_backward is set but takes effect only with profile: true, which is not set; set it or "
            "drop profile_backward",
        ),
        (
            ["memory_profiling_path=snap"],
            "memory_profiling_path is set but takes effect only with memory_profiling: true, which is not "
            "set; set it or drop memory_profiling_path",
        ),
    ],
)
def test_a_bad_window_or_a_key_without_its_switch_is_one_error(sets, line):
    with pytest.raises(ConfigError) as e:
        load_config([TINY], ["train_iters=3", *sets])
    assert str(e.value) == line


def _cfg(tmp_path, *sets):
    return load_config([TINY], ["train_iters=3", f"log_dir={tmp_path / 'run'}", *sets])


def test_what_the_device_or_the_folders_cannot_do_is_one_error(tmp_path):
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^memory_profiling records the CUDA allocator's history .* device is cpu"):
        profiling.check(_cfg(tmp_path, "memory_profiling=true", "profile_step_start=0", "profile_step_stop=1"), cpu)
    with pytest.raises(ConfigError, match=r"^profile_backward emits an NVTX range per backward op .* device is cpu"):
        profiling.check(
            _cfg(tmp_path, "profile=true", "profile_backward=true", "profile_step_start=0", "profile_step_stop=1"), cpu
        )
    (tmp_path / "file").write_text("mine")
    bad = _cfg(
        tmp_path,
        "profile=true",
        "profile_step_start=0",
        "profile_step_stop=1",
        f"tensorboard_dir={tmp_path / 'file' / 'tb'}",
    )
    with pytest.raises(ConfigError) as e:
        profiling.check(bad, cpu)
    assert str(e.value) == (
        f"tensorboard_dir: the profile traces go to {tmp_path / 'file' / 'tb' / 'profile'}, but "
        f"{tmp_path / 'file'} is not a folder; set tensorboard_dir elsewhere"
    )
    step = tmp_path / "ckpt" / "global_step4"
    step.mkdir(parents=True)
    with pytest.raises(ConfigError, match="lies inside the checkpoint folder"):
        profiling.check(
            _cfg(tmp_path, "profile=true", "profile_step_start=0", "profile_step_stop=1", f"tensorboard_dir={step}"),
            cpu,
        )
    profiling.check(
        _cfg(tmp_path, "profile=true", "profile_step_start=0", "profile_step_stop=1"), cpu
    )  # the default folder: fine


def test_the_cli_prints_one_error_line_and_writes_nothing(tmp_path):
    args = [sys.executable, os.path.join(ROOT, "train.py"), TINY, "--set", f"log_dir={tmp_path / 'run'}"]
    args += [
        "--set",
        "train_iters=3",
        "--set",
        "profile=true",
        "--set",
        "profile_step_start=3",
        "--set",
        "profile_step_stop=3",
    ]
    r = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert lines == [
        "error: profile_step_start 3 is not below profile_step_stop 3: no step profiled; valid: 0 <= "
        "profile_step_start < profile_step_stop <= train_iters 3"
    ], lines
    assert not (tmp_path / "run").exists()


def test_a_published_file_never_replaces_another(tmp_path):
    path = str(tmp_path / "rank0_steps1-1.pt.trace.json")
    (tmp_path / "rank0_steps1-1.pt.trace.json").write_text("theirs")
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / "rank0_steps1-1.1.pt.trace.json"))
    tmp = tmp_path / "t.tmp"
    tmp.write_text("ours")
    got = profiling.publish(str(tmp), path, profiling.TRACE_SUFFIX)
    assert got == str(tmp_path / "rank0_steps1-1.2.pt.trace.json")
    assert open(got).read() == "ours" and open(path).read() == "theirs" and not tmp.exists()
    assert not (tmp_path / "elsewhere").exists()  # the link was not followed


def test_backward_ranges_wrap_every_node_and_change_no_gradient():
    """profile_backward's ranges (NVTX on a GPU; recorded here): one balanced range per autograd
    node, named as the node, and the gradients equal those of a plain backward."""
    torch.manual_seed(0)
    w, x = torch.randn(8, 8, requires_grad=True), torch.randn(4, 8)
    plain = torch.autograd.grad(torch.tanh(x @ w).square().sum(), w)[0]
    events, depth = [], [0]

    def push(name):
        events.append(name)
        depth[0] += 1

    def pop():
        events.append(None)
        depth[0] -= 1
        assert depth[0] >= 0

    loss = torch.tanh(x @ w).square().sum()
    n = profiling.backward_ranges(loss, push, pop)
    loss.backward()
    assert torch.equal(w.grad, plain)
    names = [e for e in events if e is not None]
    assert depth[0] == 0 and len(names) == n == 5
    assert {"SumBackward0", "PowBackward0", "TanhBackward0", "MmBackward0", "torch::autograd::AccumulateGrad"} == set(
        names
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
def test_on_a_gpu_the_trace_has_kernels_and_the_memory_snapshot_is_written(tmp_path):
    cfg = small_config(
        tmp_path,
        **{
            "train.train_iters": 2,
            "logging.profile": True,
            "logging.profile_backward": True,
            "logging.memory_profiling": True,
            "logging.profile_step_start": 0,
            "logging.profile_step_stop": 1,
        },
    )
    rt = local_runtime(0, 1)
    rt.device = torch.device("cuda", torch.cuda.current_device())
    tr = Trainer(cfg, rt, datasets=datasets(cfg))
    tr.train()
    folder = tmp_path / "run" / "tensorboard" / "profile"
    assert sorted(os.listdir(folder)) == ["rank0_steps1-1.mem_snapshot.pickle", "rank0_steps1-1.pt.trace.json"]
    assert any(e.get("cat") == "kernel" for e in _events(folder / "rank0_steps1-1.pt.trace.json"))


def test_a_trace_that_cannot_be_written_is_one_line_and_training_goes_on(tmp_path, capsys):
    """The folder turned into a file after the start's check: the rank says so in one line and the
    run trains to its end."""
    cfg = small_config(
        tmp_path,
        **{
            "train.train_iters": 3,
            "logging.profile": True,
            "logging.profile_step_start": 1,
            "logging.profile_step_stop": 2,
        },
    )
    tr = Trainer(cfg, local_runtime(0, 1), datasets=datasets(cfg))
    folder = tmp_path / "run" / "tensorboard" / "profile"
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder")
    tr.train()
    assert tr.state.step == 3 and tr.profiler.written == []
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("profile:")]
    assert len(lines) == 1 and lines[0].startswith(f"profile: rank 0 could not write {folder}/rank0_steps2-2"), lines
    assert lines[0].endswith("; training goes on")
    assert folder.read_text() == "not a folder"


def test_a_step_stopped_between_micro_batches_ends_the_window_with_the_last_whole_step(tmp_path):
    """A stop signal inside the window: the partial step returns None and the trace holds the whole
    steps before it; stopped inside the window's first step, nothing is written (one line says so)."""
    cfg = _cfg(tmp_path, "profile=true", "profile_step_start=1", "profile_step_stop=3")
    lines = []
    prof = profiling.StepProfiler(cfg, 0, torch.device("cpu"), lines.append)
    assert prof.step(0, lambda: {"s": 1}) == {"s": 1} and prof.written == []  # before the window
    assert prof.step(1, lambda: {"s": 2}) == {"s": 2}
    assert prof.step(2, lambda: None) is None
    assert [os.path.basename(p) for p in prof.written] == ["rank0_steps2-2.pt.trace.json"]
    assert lines == [f"profile: step 2 written: {prof.written[0]} (and the same per rank)"]
    again = profiling.StepProfiler(cfg, 0, torch.device("cpu"), lines.append)
    assert again.step(1, lambda: None) is None and again.written == []
    assert lines[-1] == "profile: the run stopped inside step 2, the window's first: nothing written"
