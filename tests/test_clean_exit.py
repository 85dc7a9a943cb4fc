"""A finished distributed run destroys its process groups before the interpreter's teardown: left
to the teardown, gloo's worker threads can still hold tensors when the interpreter is gone and the
rank aborts (SIGABRT, exit -6 after a successful "done:"), and NCCL warns that the group was never
destroyed. Seen once in CI (test_global_batch, rank 1 of 2); with the groups destroyed it was seen
once more (a real-Slurm run), so the rank then leaves through ``_leave`` (os._exit after the atexit
handlers), which this test replaces to observe it."""

from __future__ import annotations

import subprocess

from .test_lifecycle import PY, _args, _port, _rank_env, cache  # noqa: F401

WRAP = (
    "import os, sys, torch.distributed as d; import megatron_topo.commands.train as T; left = []; "
    "T._leave = left.append; rc = T.main(sys.argv[1:]); "
    "print('process group left:', d.is_initialized(), 'left with:', left, flush=True); "
    "sys.stderr.flush(); os._exit(rc)"
)
# The wrapper leaves through os._exit as _leave does: a plain sys.exit would hand the rank to the
# interpreter's teardown, the very abort (gloo threads, SIGABRT) that _leave exists to avoid.


def test_a_finished_distributed_run_destroys_its_process_group(cache, tmp_path):  # noqa: F811
    args = _args(cache, tmp_path, 1)[1:]  # train.py's arguments, without the script
    port, procs = _port(), []
    for r in range(2):
        procs.append(
            subprocess.Popen(
                [PY, "-c", WRAP, *args],
                env=_rank_env(r, 2, port),
                cwd=str(tmp_path),
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out, err in outs:
        assert "process group left: False left with: [0]" in out, (out, err)


def _fsdp_job(tmp_path, *sets: str) -> list[tuple[int, str, str]]:
    """tools/fsdp_baseline.py as a 2-rank local job on the tiny config: (exit, stdout, stderr) per rank."""
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = ["tools/fsdp_baseline.py", "configs/tiny.yml", "configs/local_cpu.yml", "--set", "train_iters=2"]
    argv += ["--set", "save=null"]  # tiny.yml saves; fsdp_baseline writes no checkpoint (fsdp_keys)
    argv += ["--set", f"log_dir={tmp_path / 'logs'}", "--set", f"data_cache_dir={tmp_path / 'cache'}"]
    argv += ["--set", "builtin_corpus_bytes=100000", *[x for s in sets for x in ("--set", s)]]
    port = _port()
    procs = [
        subprocess.Popen(
            [PY, *argv], env=_rank_env(r, 2, port), cwd=repo, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def test_fsdp_baseline_ranks_leave_cleanly_and_refuse_a_bad_topology_once(tmp_path):
    # a finished 2-rank FSDP2 run: both ranks exit 0 (lifecycle.leave_rank, no teardown abort)
    done = _fsdp_job(tmp_path / "ok", "topology.gpus_per_node=1", "topology.gcds_per_gpu=2")
    assert [rc for rc, _, _ in done] == [0, 0], done
    assert "done: step 2" in done[0][1]
    # 2 ranks cannot fill a node of 2 x 2 GCDs: one error: line for the job (rank 0), exit 2 on
    # both ranks, no traceback (before: a ConfigError traceback on every rank, exit 1)
    bad = _fsdp_job(tmp_path / "bad", "topology.gpus_per_node=2", "topology.gcds_per_gpu=2")
    assert [rc for rc, _, _ in bad] == [2, 2], bad
    lines = [ln for _, _, err in bad for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: world size 2 is not a multiple"), lines
