"""The Frontier Slurm scripts, run under a fake sbatch/srun/scontrol/module.

The fakes are shell scripts first on PATH: ``sbatch`` sets the batch job's SLURM_* variables for
the ``#SBATCH --nodes`` of the script (or ``--nodes=`` on its command line) and runs it; ``srun``
records its arguments and runs the launched command for a few simulated tasks with SLURM_PROCID,
SLURM_LOCALID, ... set as srun's block distribution would; ``python`` (the venv's) records its
arguments and environment. The tests then check the launch line, the environment and the topology
the trainer derives from it (``topology_from_config`` + ``launcher_env``).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from megatron_topo.config import load_config
from megatron_topo.topology import launcher_env, topology_from_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM = os.path.join(REPO, "slurm")
SCRIPTS = ["frontier_20b.sh", "frontier_10b.sh", "frontier_generic.sh", "frontier_collectives.sh"]
TASKS = [0, 1, 2, 3, 6, 7, 8, 9, 383]  # simulated ranks (383: last GCD of node 47)

FAKE_SBATCH = r"""#!/bin/bash
printf '%s\n' "$@" > "$FAKE_LOG/sbatch_args"
nodes=""
for a in "$@"; do case "$a" in --nodes=*) nodes="${a#--nodes=}";; esac; done
script="${@: -1}"
if [ -z "$nodes" ]; then
    nodes=$(sed -n 's/^#SBATCH --nodes=\([0-9]*\).*/\1/p' "$script" | head -n 1)
fi
export SLURM_JOB_ID="$FAKE_JOB_ID" SLURM_JOB_NAME=fake SLURM_SUBMIT_DIR="$PWD"
export SLURM_NNODES="$nodes" SLURM_JOB_NUM_NODES="$nodes"
export SLURM_NODELIST="frontier[00001-$(printf '%05d' "$nodes")]"
export SLURM_NTASKS_PER_NODE=8 SLURM_NTASKS=$((nodes * 8))
exec bash "$script"
"""

FAKE_SCONTROL = r"""#!/bin/bash
printf '%s\n' "$*" >> "$FAKE_LOG/scontrol_calls"
if [ "$1 $2" = "show hostnames" ]; then
    last=$(printf '%s' "$3" | sed -n 's/.*-0*\([0-9]*\)\]$/\1/p')
    for i in $(seq 1 "$last"); do printf 'frontier%05d\n' "$i"; done
fi
"""

FAKE_MODULE = r"""#!/bin/bash
printf '%s\n' "$*" >> "$FAKE_LOG/module_calls"
"""

FAKE_SRUN = r"""#!/bin/bash
printf '%s\n' "$@" > "$FAKE_LOG/srun_args"
env > "$FAKE_LOG/srun_env"
ntasks=""; per=""
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case "$1" in
        --ntasks=*) ntasks="${1#--ntasks=}";;
        --ntasks-per-node=*) per="${1#--ntasks-per-node=}";;
    esac
    shift
done
for r in $FAKE_TASKS; do
    [ "$r" -lt "$ntasks" ] || continue
    SLURM_PROCID=$r SLURM_LOCALID=$((r % per)) SLURM_NODEID=$((r / per)) SLURM_NTASKS=$ntasks \
    SLURM_NPROCS=$ntasks SLURM_NTASKS_PER_NODE=$per SLURM_STEP_NUM_TASKS=$ntasks "$@" || exit $?
done
"""

FAKE_PYTHON = r"""#!/bin/bash
printf '%s\n' "$@" > "$FAKE_LOG/task_${SLURM_PROCID}.args"
env > "$FAKE_LOG/task_${SLURM_PROCID}.env"
"""


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def _env_file(path) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def _lines(path) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir, log, home, venv = (tmp_path / d for d in ("bin", "log", "home", "venv"))
    for d in (bin_dir, log, home / "aws-ofi-rccl" / "lib", venv / "bin"):
        d.mkdir(parents=True)
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("module", FAKE_MODULE)):
        _write(bin_dir / name, text)
    _write(venv / "bin" / "python", FAKE_PYTHON)
    job = f"77{os.getpid()}"
    user = "pytest-fake-user"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "USER": user, "FAKE_LOG": str(log),
           "FAKE_JOB_ID": job, "FAKE_TASKS": " ".join(map(str, TASKS)), "VENV": str(venv)}

    def submit(script, *sbatch_args, extra_env=None):
        e = dict(env, **(extra_env or {}))
        return subprocess.run(["sbatch", *sbatch_args, os.path.join("slurm", script)], cwd=REPO, env=e,
                              capture_output=True, text=True, timeout=60)

    yield {"submit": submit, "log": str(log), "job": job, "venv": str(venv), "home": str(home), "user": user}
    for d in glob.glob(f"/tmp/{user}-miopen-{job}") + glob.glob(f"/mnt/bb/{user}/miopen-{job}"):
        shutil.rmtree(d, ignore_errors=True)


def _launched(log: str, rank: int):
    """(train.py arguments, environment) of simulated task ``rank``."""
    args = _lines(os.path.join(log, f"task_{rank}.args"))
    return args, _env_file(os.path.join(log, f"task_{rank}.env"))


def _config_from_args(args: list[str]):
    assert args[:2] == ["-u", "train.py"], args
    rest = args[2:]
    files = []
    while rest and not rest[0].startswith("--"):
        files.append(rest.pop(0))
    overrides = []
    while rest:
        flag = rest.pop(0)
        assert flag == "--set", f"unexpected train.py argument {flag}"
        overrides.append(rest.pop(0))
    return files, overrides


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("script", sorted(os.listdir(SLURM)))
def test_bash_syntax(script):
    r = subprocess.run(["bash", "-n", os.path.join(SLURM, script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_sbatch_header(script):
    text = open(os.path.join(SLURM, script)).read()
    head = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    for needed in ("--account=", "--partition=", "--nodes=48", "--time=", "--ntasks-per-node=8",
                   "--cpus-per-task=7", "--gpus-per-node=8", "-C nvme"):
        assert any(needed in line for line in head), f"{script}: no #SBATCH {needed}"
    # the user's settings sit in one block at the top, before any command runs
    first_cmd = min(i for i, line in enumerate(text.splitlines())
                    if line.startswith(("set ", "cd ", "module", "srun", "source")))
    assert "edit this block" in "\n".join(text.splitlines()[:first_cmd])
    assert "torchrun" not in text.replace("(not torchrun)", "")


@pytest.mark.parametrize("script,model", [("frontier_20b.sh", "configs/20B.yml"),
                                          ("frontier_10b.sh", "configs/10B.yml"),
                                          ("frontier_generic.sh", "configs/20B.yml")])
def test_launch_under_fake_slurm(fake_slurm, script, model):
    r = fake_slurm["submit"](script)
    assert r.returncode == 0, r.stdout + r.stderr
    log = fake_slurm["log"]
    modules = _lines(os.path.join(log, "module_calls"))
    for m in ("load PrgEnv-", "load rocm", "load craype-accel-amd-gfx90a"):
        assert any(line.startswith(m) for line in modules), modules
    assert _lines(os.path.join(log, "scontrol_calls")) == ["show hostnames frontier[00001-00048]"]

    srun = _lines(os.path.join(log, "srun_args"))
    opts = [a for a in srun if a.startswith("-")][: srun.index(next(a for a in srun if not a.startswith("-")))]
    for o in ("--nodes=48", "--ntasks=384", "--ntasks-per-node=8", "--cpus-per-task=7",
              "--gpus-per-task=1", "--gpu-bind=closest", "--distribution=block"):
        assert o in opts, (o, opts)
    cmd = srun[len(opts):]
    assert cmd[0] == os.path.join(REPO, "slurm", "srun_task.sh")
    assert cmd[1] == os.path.join(fake_slurm["venv"], "bin", "python")
    assert cmd[2:8] == ["-u", "train.py", model, "configs/topo.yml", "configs/frontier.yml", "--set"]
    assert not any("torchrun" in a for a in srun)

    seen_ranks = set()
    for rank in TASKS:
        args, env = _launched(log, rank)
        assert env["RANK"] == env["SLURM_PROCID"] == str(rank)
        assert env["WORLD_SIZE"] == "384" and env["LOCAL_WORLD_SIZE"] == "8"
        assert env["LOCAL_RANK"] == str(rank % 8)
        assert env["MASTER_ADDR"] == "frontier00001" and env["MASTER_PORT"] == "29500"
        for k, v in (("NCCL_SOCKET_IFNAME", "hsn0"), ("FI_CXI_ATS", "0"), ("NCCL_NET_GDR_LEVEL", "3"),
                     ("FI_CXI_DISABLE_CQ_HUGETLB", "1"), ("HSA_ENABLE_SDMA", "0"), ("NCCL_CROSS_NIC", "1"),
                     ("FI_CXI_RDZV_THRESHOLD", "0"), ("FI_CXI_RDZV_GET_MIN", "0"), ("FI_CXI_RDZV_EAGER_SIZE", "0")):
            assert env.get(k) == v, (k, env.get(k))
        aws = os.path.join(fake_slurm["home"], "aws-ofi-rccl", "lib")
        assert env["LD_LIBRARY_PATH"].split(":")[0] == aws
        miopen = env["MIOPEN_USER_DB_PATH"]
        assert miopen.startswith(("/tmp/", "/mnt/bb/")) and fake_slurm["job"] in miopen
        assert os.path.isdir(miopen), "srun_task.sh creates the MIOpen DB directory on every node"

        # the topology the trainer derives from this environment
        files, overrides = _config_from_args(args)
        assert files == [model, "configs/topo.yml", "configs/frontier.yml"]
        cfg = load_config([os.path.join(REPO, f) for f in files], overrides)
        assert cfg.zero_topo.preset == "topo" and cfg.precision == "fp16"
        le = launcher_env(env)
        slurm_only = {k: v for k, v in env.items()
                      if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        assert launcher_env(slurm_only) == le  # the same from SLURM_* alone
        assert le == {"world_size": 384, "rank": rank, "local_rank": rank % 8, "local_world_size": 8}
        topo = topology_from_config(cfg.topology, le["world_size"], le["local_world_size"])
        assert (topo.world_size, topo.num_nodes, topo.gpus_per_node, topo.gcds_per_gpu) == (384, 48, 4, 2)
        assert topo.coords(rank)[0] == int(env["SLURM_NODEID"])
        seen_ranks.add(le["rank"])
    assert seen_ranks == set(TASKS)
    for k in range(192):  # the two GCDs of every MI250X are ranks 2k, 2k+1
        assert topo.level([2 * k, 2 * k + 1]) == "intra_gpu"
    assert topo.level([0, 2]) == "intra_node" and topo.level([7, 8]) == "inter_node"


def test_generic_follows_nodes_and_configs(fake_slurm):
    r = fake_slurm["submit"]("frontier_generic.sh", "--nodes=2", extra_env={
        "MODEL_CONFIG": "configs/10B.yml", "PRESET_CONFIG": "configs/zeropp.yml",
        "EXTRA_ARGS": "--set train_iters=20"})
    assert r.returncode == 0, r.stdout + r.stderr
    srun = _lines(os.path.join(fake_slurm["log"], "srun_args"))
    assert "--nodes=2" in srun and "--ntasks=16" in srun
    args, env = _launched(fake_slurm["log"], 9)
    files, overrides = _config_from_args(args)
    assert files == ["configs/10B.yml", "configs/zeropp.yml", "configs/frontier.yml"]
    assert "train_iters=20" in overrides
    cfg = load_config([os.path.join(REPO, f) for f in files], overrides)
    le = launcher_env(env)
    topo = topology_from_config(cfg.topology, le["world_size"], le["local_world_size"])
    assert topo.describe() == "2 node(s) x 4 GPU(s) x 2 GCD(s) = 16 ranks"
    assert cfg.train.train_iters == 20 and cfg.zero_topo.preset == "zeropp"
    assert not os.path.exists(os.path.join(fake_slurm["log"], "task_383.args"))  # only 16 ranks


def test_missing_venv_is_one_clear_error(fake_slurm, tmp_path):
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"VENV": str(tmp_path / "nope")})
    assert r.returncode == 2
    assert "VENV" in r.stderr and "docs/frontier.md" in r.stderr
    assert not os.path.exists(os.path.join(fake_slurm["log"], "srun_args"))


def test_collectives_job_under_fake_slurm(fake_slurm):
    """The measurement that settles the perf model's paper comparison runs like training: one
    task per GCD, the same RCCL/CXI environment, tools/measure_collectives.py on every rank."""
    r = fake_slurm["submit"]("frontier_collectives.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    log = fake_slurm["log"]
    srun = _lines(os.path.join(log, "srun_args"))
    for o in ("--nodes=48", "--ntasks=384", "--ntasks-per-node=8", "--gpus-per-task=1", "--gpu-bind=closest",
              "--distribution=block"):
        assert o in srun, (o, srun)
    args, env = _launched(log, 383)
    out = f"runs/collectives-48n-{fake_slurm['job']}"
    assert args == ["-u", "tools/measure_collectives.py", "--sizes-mb", "16,64,128,256,512,1024", "--iters", "10",
                    "--out", out]
    assert env["RANK"] == "383" and env["WORLD_SIZE"] == "384" and env["MASTER_ADDR"] == "frontier00001"
    for k, v in (("NCCL_SOCKET_IFNAME", "hsn0"), ("FI_CXI_RDZV_THRESHOLD", "0"), ("HSA_ENABLE_SDMA", "0")):
        assert env.get(k) == v, k
    r = fake_slurm["submit"]("frontier_collectives.sh", "--nodes=2", extra_env={"SIZES_MB": "1,2"})
    args, env = _launched(log, 9)
    assert r.returncode == 0 and args[3] == "1,2" and env["WORLD_SIZE"] == "16"
