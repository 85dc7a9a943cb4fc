"""The Frontier Slurm scripts, run under a fake sbatch/srun/scontrol/module.

The fakes are shell scripts first on PATH: ``sbatch`` sets the batch job's SLURM_* variables for
the ``#SBATCH --nodes`` of the script (or ``--nodes=`` on its command line) and runs a copy of it
in a spool folder, as Slurm does (``scontrol show job`` then names the original in ``Command=``),
with the script's arguments; ``srun``
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
import sys

import pytest

from megatron_topo.config import load_config
from megatron_topo.topology import launcher_env, topology_from_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLURM = os.path.join(REPO, "slurm")
SCRIPTS = ["frontier_20b.sh", "frontier_10b.sh", "frontier_generic.sh", "frontier_collectives.sh"]
TASKS = [0, 1, 2, 3, 6, 7, 8, 9, 383]  # simulated ranks (383: last GCD of node 47)

FAKE_SBATCH = r"""#!/bin/bash
# like sbatch: options, then the script and its arguments; the job runs a copy of the script in a
# spool folder, with SLURM_SUBMIT_DIR = the submitting folder
printf '%s\n' "$@" > "$FAKE_LOG/sbatch_args"
nodes=""
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac
    shift
done
script="$1"; shift
if [ -z "$nodes" ]; then
    nodes=$(sed -n 's/^#SBATCH --nodes=\([0-9]*\).*/\1/p' "$script" | head -n 1)
fi
printf '%s\n' "$(cd "$(dirname "$script")" && pwd)/$(basename "$script")" > "$FAKE_LOG/command"
mkdir -p "$FAKE_LOG/spool"
cp "$script" "$FAKE_LOG/spool/slurm_script"
export SLURM_JOB_ID="$FAKE_JOB_ID" SLURM_JOB_NAME=fake SLURM_SUBMIT_DIR="$PWD"
export SLURM_NNODES="$nodes" SLURM_JOB_NUM_NODES="$nodes"
export SLURM_NODELIST="frontier[00001-$(printf '%05d' "$nodes")]"
export SLURM_NTASKS_PER_NODE=8 SLURM_NTASKS=$((nodes * 8))
cd "$FAKE_LOG/spool"
exec bash slurm_script "$@"
"""

FAKE_SCONTROL = r"""#!/bin/bash
printf '%s\n' "$*" >> "$FAKE_LOG/scontrol_calls"
if [ "$1 $2" = "show hostnames" ]; then
    last=$(printf '%s' "$3" | sed -n 's/.*-0*\([0-9]*\)\]$/\1/p')
    for i in $(seq 1 "$last"); do printf 'frontier%05d\n' "$i"; done
elif [ "$1 $2" = "show job" ] && [ -f "$FAKE_LOG/command" ]; then
    echo "JobId=$3 JobName=fake TimeLimit=02:00:00 Command=$(cat "$FAKE_LOG/command") WorkDir=$PWD"
fi
"""

FAKE_MODULE = r"""#!/bin/bash
printf '%s\n' "$*" >> "$FAKE_LOG/module_calls"
# FAKE_MISSING_MODULES: modules this site does not have
if [ "$1" = is-avail ] && [[ " ${FAKE_MISSING_MODULES:-} " == *" $2 "* ]]; then exit 1; fi
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

# the venv's python: records each task's arguments and environment; outside srun (the batch
# shell's plugin check and data preparation) it records its calls and succeeds
FAKE_PYTHON = r"""#!/bin/bash
if [ -z "${SLURM_PROCID:-}" ]; then printf '%s\n' "$*" >> "$FAKE_LOG/batch_python_calls"; exit 0; fi
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
    bin_dir, log, home, venv, work = (tmp_path / d for d in ("bin", "log", "home", "venv", "work"))
    plugin = home / "aws-ofi-rccl" / "lib"
    for d in (bin_dir, log, plugin, venv / "bin", work):
        d.mkdir(parents=True)
    (plugin / "librccl-net.so").write_bytes(b"")  # "loads" under the fake python
    for name, text in (
        ("sbatch", FAKE_SBATCH),
        ("srun", FAKE_SRUN),
        ("scontrol", FAKE_SCONTROL),
        ("module", FAKE_MODULE),
    ):
        _write(bin_dir / name, text)
    _write(venv / "bin" / "python", FAKE_PYTHON)
    job = f"77{os.getpid()}"
    user = "pytest-fake-user"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "USER": user,
        "FAKE_LOG": str(log),
        "FAKE_JOB_ID": job,
        "FAKE_TASKS": " ".join(map(str, TASKS)),
        "VENV": str(venv),
        "WORK_DIR": str(work),
    }

    def submit(script, *args, sbatch_args=(), extra_env=None, cwd=REPO, drop=()):
        e = dict(env, **(extra_env or {}))
        for k in drop:
            e.pop(k, None)
        return subprocess.run(
            [
                "sbatch",
                *sbatch_args,
                os.path.join(REPO, "slurm", script) if cwd != REPO else os.path.join("slurm", script),
                *args,
            ],
            cwd=cwd,
            env=e,
            capture_output=True,
            text=True,
            timeout=60,
        )

    yield {
        "submit": submit,
        "log": str(log),
        "job": job,
        "venv": str(venv),
        "home": str(home),
        "user": user,
        "work": str(work),
        "plugin": str(plugin),
    }
    for d in glob.glob(f"/tmp/{user}-miopen-{job}") + glob.glob(f"/mnt/bb/{user}/miopen-{job}"):
        shutil.rmtree(d, ignore_errors=True)


def _launched(log: str, rank: int):
    """(train.py arguments, environment) of simulated task ``rank``."""
    args = _lines(os.path.join(log, f"task_{rank}.args"))
    return args, _env_file(os.path.join(log, f"task_{rank}.env"))


def _config_from_args(args: list[str]):
    assert args[:2] == ["-u", os.path.join(REPO, "train.py")], args
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


def _cfg(name):
    return os.path.join(REPO, "configs", name)


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("script", sorted(os.listdir(SLURM)))
def test_bash_syntax(script):
    r = subprocess.run(["bash", "-n", os.path.join(SLURM, script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_sbatch_header(script):
    text = open(os.path.join(SLURM, script)).read()
    head = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    for needed in (
        "--account=",
        "--partition=",
        "--nodes=48",
        "--time=",
        "--ntasks-per-node=8",
        "--cpus-per-task=7",
        "--gpus-per-node=8",
        "-C nvme",
        "--network=disable_rdzv_get",
    ):
        assert any(needed in line for line in head), f"{script}: no #SBATCH {needed}"
    if script != "frontier_collectives.sh":  # training jobs ask for the walltime warning, to the batch shell
        assert any(line.split()[1].startswith("--signal=B:USR1@") for line in head), head
    # the user's settings sit in one block at the top, before any command runs
    first_cmd = min(
        i
        for i, line in enumerate(text.splitlines())
        if line.startswith(("set ", "cd ", "module", "srun", "source", "if ", "for "))
    )
    assert "edit this block" in "\n".join(text.splitlines()[:first_cmd])
    assert "Orion" in "\n".join(text.splitlines()[:first_cmd])  # WORK_DIR's default is stated there
    assert "torchrun" not in text.replace("(not torchrun)", "")
    assert "--nodes=1 slurm/frontier_20b.sh" not in text  # 20B topo does not fit on one node


FRONTIER_ENV = {  # value, source: HPE's shs-ccl-docs (ccl_env.sh / rccl_tuning_guide.md), OLCF guide, seed 004
    "NCCL_SOCKET_IFNAME": "hsn0",
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_CROSS_NIC": "1",
    "HSA_FORCE_FINE_GRAIN_PCIE": "1",
    "FI_MR_CACHE_MONITOR": "userfaultfd",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_DEFAULT_TX_SIZE": "2048",
    "FI_CXI_RDZV_PROTO": "alt_read",
    "FI_CXI_RX_MATCH_MODE": "hybrid",
    "FI_CXI_RDZV_EAGER_SIZE": "0",
    "FI_CXI_RDZV_GET_MIN": "0",
    "FI_CXI_RDZV_THRESHOLD": "0",
    "NCCL_NET": "AWS Libfabric",
}


@pytest.mark.parametrize(
    "script,model", [("frontier_20b.sh", "20B.yml"), ("frontier_10b.sh", "10B.yml"), ("frontier_generic.sh", "20B.yml")]
)
def test_launch_under_fake_slurm(fake_slurm, script, model):
    r = fake_slurm["submit"](script)
    assert r.returncode == 0, r.stdout + r.stderr
    log = fake_slurm["log"]
    modules = _lines(os.path.join(log, "module_calls"))
    loads = [m for m in modules if m.startswith("load ")]
    # one pinned block [OLCF-26]; the plugin module after rocm
    assert [m.split()[1] for m in loads] == [
        "PrgEnv-gnu/8.7.0",
        "cpe/26.03",
        "rocm/7.1.1",
        "craype-accel-amd-gfx90a",
        "rccl-net-plugin",
    ]
    calls = _lines(os.path.join(log, "scontrol_calls"))
    assert f"show job {fake_slurm['job']} -o" in calls and "show hostnames frontier[00001-00048]" in calls

    srun = _lines(os.path.join(log, "srun_args"))
    opts = srun[: srun.index(os.path.join(REPO, "slurm", "srun_task.sh"))]
    for o in (
        "--nodes=48",
        "--ntasks=384",
        "--ntasks-per-node=8",
        "--cpus-per-task=7",
        "--gpus-per-task=1",
        "--gpu-bind=closest",
        "--distribution=block",
    ):
        assert o in opts, (o, opts)
    assert not any(o.startswith("--network") for o in opts)  # on the allocation (#SBATCH), where OLCF puts it
    cmd = srun[len(opts) :]
    assert cmd[1] == os.path.join(fake_slurm["venv"], "bin", "python")
    assert cmd[2:7] == ["-u", os.path.join(REPO, "train.py"), _cfg(model), _cfg("topo.yml"), _cfg("frontier.yml")]
    assert not any("torchrun" in a for a in srun)
    # the data caches were built once, by the batch shell, for the run's 384 ranks
    prep = [c for c in _lines(os.path.join(log, "batch_python_calls")) if "prepare_data.py" in c]
    assert len(prep) == 1 and "--world-size 384" in prep[0], prep

    seen_ranks = set()
    work = fake_slurm["work"]
    for rank in TASKS:
        args, env = _launched(log, rank)
        assert env["RANK"] == env["SLURM_PROCID"] == str(rank)
        assert env["WORLD_SIZE"] == "384" and env["LOCAL_WORLD_SIZE"] == "8"
        assert env["LOCAL_RANK"] == str(rank % 8)
        # a port per job (two jobs on one node never collide)
        assert env["MASTER_ADDR"] == "frontier00001" and env["MASTER_PORT"] == str(
            10000 + int(fake_slurm["job"]) % 20000
        )
        for k, v in FRONTIER_ENV.items():
            assert env.get(k) == v, (k, env.get(k))
        for dropped in ("FI_CXI_ATS", "FI_CXI_DISABLE_CQ_HUGETLB", "HSA_ENABLE_SDMA"):  # no current source
            assert dropped not in env
        assert env["LD_LIBRARY_PATH"].split(":")[0] == fake_slurm["plugin"]
        miopen = env["MIOPEN_USER_DB_PATH"]
        assert miopen.startswith(("/tmp/", "/mnt/bb/")) and fake_slurm["job"] in miopen
        assert os.path.isdir(miopen), "srun_task.sh creates the MIOpen DB directory on every node"
        assert env["PWD"] == work  # relative paths of the YAML files land in WORK_DIR

        # the topology the trainer derives from this environment
        files, overrides = _config_from_args(args)
        assert files == [_cfg(model), _cfg("topo.yml"), _cfg("frontier.yml")]
        name = model.replace(".yml", "")
        assert overrides == [
            f"log_dir={work}/runs/{name}-topo",
            f"save={work}/checkpoints/{name}-topo",
            "auto_resume=true",
        ]
        cfg = load_config(files, overrides)
        assert cfg.zero_topo.preset == "topo" and cfg.precision == "fp16"
        assert cfg.checkpoint.auto_resume and cfg.checkpoint.load is None
        le = launcher_env(env)
        slurm_only = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
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


def test_arguments_reach_train_py_unchanged_and_exported_variables_change_nothing(fake_slurm):
    stray = {
        "MODEL_CONFIG": "configs/10B.yml",
        "PRESET_CONFIG": "configs/zero3.yml",
        "CKPT_DIR": "/x/ckpt",
        "RUN_NAME": "other",
        "LOG_DIR": "/x/log",
        "EXTRA_ARGS": "--set train_iters=7",
    }
    r = fake_slurm["submit"](
        "frontier_20b.sh", "--set", "train_iters=50", "--set", "data_path=/data dir/*", extra_env=stray
    )
    assert r.returncode == 0, r.stdout + r.stderr
    files, overrides = _config_from_args(_launched(fake_slurm["log"], 0)[0])
    assert files == [_cfg("20B.yml"), _cfg("topo.yml"), _cfg("frontier.yml")]
    assert overrides[-2:] == ["train_iters=50", "data_path=/data dir/*"]  # one word each, no globbing
    assert not any("/x/" in o or "train_iters=7" in o for o in overrides)
    assert "job fake" not in r.stdout and "neox" not in r.stdout


def test_submitted_from_another_folder_and_checkpoints_independent_of_node_count(fake_slurm):
    r = fake_slurm["submit"]("frontier_20b.sh", cwd=os.path.join(REPO, "slurm"), sbatch_args=("--nodes=2",))
    assert r.returncode == 0, r.stdout + r.stderr
    _, overrides = _config_from_args(_launched(fake_slurm["log"], 9)[0])
    assert f"save={fake_slurm['work']}/checkpoints/20B-topo" in overrides  # the 48-node run's folder too
    srun = _lines(os.path.join(fake_slurm["log"], "srun_args"))
    assert "--nodes=2" in srun and "--ntasks=16" in srun


def test_a_wrong_repo_is_one_clear_error(fake_slurm, tmp_path):
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"REPO": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"slurm: error: REPO={tmp_path} is not the megatron_topo repository (no "
        f"slurm/frontier_env.sh, train.py); set REPO=/path/to/megatron_topo"
    )
    assert not os.path.exists(os.path.join(fake_slurm["log"], "srun_args"))


def test_work_dir_that_cannot_be_created_is_one_clear_error(fake_slurm):
    # the default: Orion scratch of the job's account (Orion's project folders are lower case)
    r = fake_slurm["submit"]("frontier_20b.sh", drop=("WORK_DIR",), extra_env={"SLURM_JOB_ACCOUNT": "ABC123"})
    assert r.returncode == 2
    assert r.stderr.startswith(
        "slurm: error: WORK_DIR=/lustre/orion/abc123/scratch/pytest-fake-user/megatron_topo "
        "cannot be created or written (its parent must exist)"
    ), r.stderr
    assert not os.path.exists("/lustre/orion/abc123")


def test_generic_takes_model_and_preset_as_arguments(fake_slurm):
    r = fake_slurm["submit"](
        "frontier_generic.sh",
        "configs/10B.yml",
        "configs/zeropp.yml",
        "--set",
        "train_iters=20",
        sbatch_args=("--nodes=2",),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    srun = _lines(os.path.join(fake_slurm["log"], "srun_args"))
    assert "--nodes=2" in srun and "--ntasks=16" in srun
    args, env = _launched(fake_slurm["log"], 9)
    files, overrides = _config_from_args(args)
    assert files == [_cfg("10B.yml"), _cfg("zeropp.yml"), _cfg("frontier.yml")]
    assert overrides[-1] == "train_iters=20" and f"save={fake_slurm['work']}/checkpoints/10B-zeropp" in overrides
    cfg = load_config(files, overrides)
    le = launcher_env(env)
    topo = topology_from_config(cfg.topology, le["world_size"], le["local_world_size"])
    assert topo.describe() == "2 node(s) x 4 GPU(s) x 2 GCD(s) = 16 ranks"
    assert cfg.train.train_iters == 20 and cfg.zero_topo.preset == "zeropp"
    assert not os.path.exists(os.path.join(fake_slurm["log"], "task_383.args"))  # only 16 ranks
    r = fake_slurm["submit"]("frontier_generic.sh", "configs/nope.yml")
    assert r.returncode == 2 and "config file configs/nope.yml not found" in r.stderr


def test_missing_venv_is_one_clear_error(fake_slurm, tmp_path):
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"VENV": str(tmp_path / "nope")})
    assert r.returncode == 2
    assert "VENV" in r.stderr and "docs/frontier.md" in r.stderr
    assert not os.path.exists(os.path.join(fake_slurm["log"], "srun_args"))


def test_multi_node_without_a_network_plugin_stops(fake_slurm):
    os.remove(os.path.join(fake_slurm["plugin"], "librccl-net.so"))  # a folder is not a plugin
    r = fake_slurm["submit"]("frontier_20b.sh", sbatch_args=("--nodes=2",))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm: error: no loadable RCCL network plugin"), r.stderr
    assert "module rccl-net-plugin loaded" in lines[0] and f"PLUGIN_DIR={fake_slurm['plugin']}" in lines[0]
    assert "PLUGIN_MODULE=" in lines[0] and "rocm/7.1.1" in lines[0]  # what it tried and how to override
    assert not os.path.exists(os.path.join(fake_slurm["log"], "srun_args"))
    r = fake_slurm["submit"]("frontier_10b.sh", sbatch_args=("--nodes=1",))  # one node: RCCL needs no network
    assert r.returncode == 0, r.stderr
    assert "NCCL_NET" not in _launched(fake_slurm["log"], 0)[1]


def test_a_plugin_that_does_not_load_is_not_a_plugin(fake_slurm, tmp_path):
    """The load check runs the venv's python on the library: a real python refuses a broken file."""
    venv = tmp_path / "realvenv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    with open(os.path.join(fake_slurm["plugin"], "librccl-net.so"), "wb") as f:
        f.write(b"not an ELF file")
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"VENV": str(venv)}, sbatch_args=("--nodes=2",))
    assert r.returncode == 2 and "no loadable RCCL network plugin" in r.stderr, r.stderr


@pytest.mark.parametrize("rocm,fallback", [("rocm/7.0.2", "aws-ofi-nccl"), ("rocm/6.2.4", "aws-ofi-rccl")])
def test_plugin_module_fallbacks_by_rocm_version(fake_slurm, rocm, fallback):
    """rccl-net-plugin first [OLCF-26]; where a site lacks it, the older module for the ROCm major."""
    r = fake_slurm["submit"](
        "frontier_20b.sh", extra_env={"ROCM_MODULE": rocm, "FAKE_MISSING_MODULES": "rccl-net-plugin"}
    )
    assert r.returncode == 0, r.stderr
    loads = [m for m in _lines(os.path.join(fake_slurm["log"], "module_calls")) if m.startswith("load ")]
    assert loads.index(f"load {rocm}") < loads.index(f"load {fallback}")
    assert "load rccl-net-plugin" not in loads and len([m for m in loads if "ofi" in m]) == 1
    os.remove(os.path.join(fake_slurm["plugin"], "librccl-net.so"))
    r = fake_slurm["submit"](
        "frontier_20b.sh",
        sbatch_args=("--nodes=2",),
        extra_env={"ROCM_MODULE": rocm, "FAKE_MISSING_MODULES": f"rccl-net-plugin {fallback}"},
    )
    assert r.returncode == 2 and f"modules tried: rccl-net-plugin {fallback} (none available)" in r.stderr, r.stderr
    r = fake_slurm["submit"]("frontier_20b.sh", sbatch_args=("--nodes=2",), extra_env={"PLUGIN_MODULE": "my-plugin"})
    assert r.returncode == 2 and "module my-plugin loaded" in r.stderr, r.stderr


def test_cpu_site_profile(fake_slurm):
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"SITE": "local_cpu"}, sbatch_args=("--nodes=2",))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.exists(os.path.join(fake_slurm["log"], "module_calls"))
    srun = _lines(os.path.join(fake_slurm["log"], "srun_args"))
    assert not any(a.startswith(("--gpus", "--gpu-bind", "--network")) for a in srun)
    args, env = _launched(fake_slurm["log"], 9)
    files, overrides = _config_from_args(args)
    assert files == [_cfg("tiny.yml"), _cfg("topo.yml"), _cfg("local_cpu.yml")]
    cfg = load_config(files, overrides)
    assert cfg.distributed.backend == "gloo" and cfg.distributed.device == "cpu"
    topo = topology_from_config(cfg.topology, 16, 8)
    assert topo.describe() == "2 node(s) x 4 GPU(s) x 2 GCD(s) = 16 ranks"
    assert "NCCL_NET" not in env and "FI_CXI_RDZV_PROTO" not in env
    r = fake_slurm["submit"]("frontier_20b.sh", extra_env={"SITE": "laptop"})
    assert r.returncode == 2 and "SITE=laptop" in r.stderr


def test_stage_venv_to_node_local_storage(fake_slurm, tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    _write(
        os.path.join(os.path.dirname(fake_slurm["log"]), "bin", "sbcast"),
        '#!/bin/bash\nprintf "%s\\n" "$*" >> "$FAKE_LOG/sbcast_calls"; cp "${@: -2:1}" "${@: -1}"\n',
    )
    r = fake_slurm["submit"](
        "frontier_20b.sh", sbatch_args=("--nodes=2",), extra_env={"STAGE_VENV": "1", "NVME_DIR": str(nvme)}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    tarball = os.path.join(fake_slurm["work"], "venv-venv.tar")
    assert _lines(os.path.join(fake_slurm["log"], "sbcast_calls")) == [f"--force {tarball} {nvme}/venv.tar"]
    assert os.access(nvme / "venv" / "bin" / "python", os.X_OK)  # unpacked on the node
    srun = _lines(os.path.join(fake_slurm["log"], "srun_args"))
    assert str(nvme / "venv" / "bin" / "python") in srun  # the ranks run the staged copy


def test_collectives_job_under_fake_slurm(fake_slurm):
    """The measurement that settles the perf model's paper comparison runs like training: one
    task per GCD, the same RCCL/CXI environment, tools/measure_collectives.py on every rank."""
    r = fake_slurm["submit"]("frontier_collectives.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    log = fake_slurm["log"]
    srun = _lines(os.path.join(log, "srun_args"))
    for o in (
        "--nodes=48",
        "--ntasks=384",
        "--ntasks-per-node=8",
        "--gpus-per-task=1",
        "--gpu-bind=closest",
        "--distribution=block",
    ):
        assert o in srun, (o, srun)
    args, env = _launched(log, 383)
    out = f"{fake_slurm['work']}/runs/collectives-48n-{fake_slurm['job']}"
    assert args == [
        "-u",
        os.path.join(REPO, "tools", "measure_collectives.py"),
        "--sizes-mb",
        "16,64,128,256,512,1024",
        "--iters",
        "10",
        "--out",
        out,
    ]
    assert env["RANK"] == "383" and env["WORLD_SIZE"] == "384" and env["MASTER_ADDR"] == "frontier00001"
    for k in ("NCCL_SOCKET_IFNAME", "FI_CXI_RDZV_PROTO", "NCCL_NET"):
        assert env.get(k) == FRONTIER_ENV[k], k
    r = fake_slurm["submit"]("frontier_collectives.sh", "--sizes-mb", "1,2", sbatch_args=("--nodes=2",))
    args, env = _launched(log, 9)
    assert r.returncode == 0 and args[2:4] == ["--sizes-mb", "1,2"] and env["WORLD_SIZE"] == "16"
