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
    "import sys, torch.distributed as d; import megatron_topo.commands.train as T; left = []; "
    "T._leave = left.append; rc = T.main(sys.argv[1:]); "
    "print('process group left:', d.is_initialized(), 'left with:', left, flush=True); sys.exit(rc)"
)


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
