"""`sbatch slurm/frontier_20b.sh` under a real Slurm (Debian's slurm-wlm 22.05): one slurmctld and
two slurmd "nodes" on this machine (scripts/local_slurm.sh), the scripts' CPU site profile
(SITE=local_cpu: no modules, gloo, the tiny model), 2 ranks per node, jobs submitted from a
folder outside the repository.

  (a) the first submission starts fresh (no checkpoint yet), trains and checkpoints;
  (b) a job with a 3-minute limit gets Slurm's warning signal (--signal=B:USR1), the batch shell
      forwards it, every rank stops after its step and saves; RESUBMIT=1 chains the next job;
  (c) the chained job resumes from that step (and stops and saves on a USR1 from scancel);
  (d) a resubmission on one node (2 ranks instead of 4) resumes from there and finishes;
  (e) a job stopped before training does not resubmit itself;
  (f) a chain with a relative WORK_DIR and a preset file relative to the submit folder, RESUBMIT=3:
      two USR1 stops chain two jobs, the documented stop (USR2) saves and ends the chain; every
      step is logged once and every link's log is in the submit folder;
  (g) meanwhile a second job on the same run folder refuses in one line; the chain's job is untouched.

Skips (saying why) only where Slurm cannot run: not root, or slurm-wlm/munge missing and not
installable. Every daemon it starts is stopped by PID at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL_SLURM = os.path.join(REPO, "scripts", "local_slurm.sh")
SCRIPT = os.path.join(REPO, "slurm", "frontier_20b.sh")
TRAIN = [
    "--set",
    "progress_bar=false",
    "--set",
    "builtin_corpus_bytes=100000",
    "--set",
    "log_interval=1",
    "--set",
    "eval_interval=0",
    "--set",
    "num_layers=2",
    "--set",
    "hidden_size=64",
]
PER_NODE = ["--ntasks-per-node=2", "--cpus-per-task=1"]
# the environment running the tests (the project's .venv in CI)
VENV = sys.prefix if os.access(os.path.join(sys.prefix, "bin", "python"), os.X_OK) else os.path.join(REPO, ".venv")


def _free_port_block(n=3) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no block of free ports")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("real Slurm test: needs root to install and run slurmctld/slurmd/munged")
    state = tmp_path_factory.mktemp("slurm")
    install = subprocess.run(["bash", LOCAL_SLURM, "install"], capture_output=True, text=True, timeout=900)
    if install.returncode != 0:
        pytest.skip(f"real Slurm test: slurm-wlm/munge cannot be installed here: {install.stderr.strip()}")
    env = dict(os.environ, SLURM_LOCAL_PORT=str(_free_port_block()))
    r = subprocess.run(["bash", LOCAL_SLURM, "start", str(state)], capture_output=True, text=True, env=env, timeout=120)
    jobs: list[str] = []
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        yield {"conf": str(state / "slurm.conf"), "jobs": jobs, "state": state}
    finally:
        senv = dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
        if jobs:
            subprocess.run(["scancel", *jobs], env=senv, capture_output=True, timeout=30)
            for _ in range(60):
                q = subprocess.run(["squeue", "-h", "-o", "%i"], env=senv, capture_output=True, text=True, timeout=30)
                if not q.stdout.strip():
                    break
                time.sleep(0.5)
        subprocess.run(["bash", LOCAL_SLURM, "stop", str(state)], capture_output=True, timeout=60)
        for name in ("munged", "slurmctld", "slurmd-n1", "slurmd-n2"):
            assert not (state / f"{name}.pid").exists(), f"{name} still running"


# A job in one of these states has not ended. SIGNALING (a signal to the job's steps pending, e.g. the
# batch shell's forwarded USR1 while the job is finishing), STAGE_OUT, RESIZING and SUSPENDED are
# transient too: reading one of them as the job's end failed a full-suite run (job 2 "SIGNALING" one second
# before it COMPLETED).
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED")


class Cluster:
    def __init__(self, slurm, tmp_path):
        self.jobs = slurm["jobs"]
        self.submit_dir = tmp_path / "submit"  # not the repository
        self.submit_dir.mkdir()
        self.work = tmp_path / "work"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            "USER": "root",
            "SLURM_CONF": slurm["conf"],
            "SITE": "local_cpu",
            "WORK_DIR": str(self.work),
            "VENV": VENV,
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }

    def sbatch(self, *args, env=None) -> str:
        r = subprocess.run(
            ["sbatch", "--parsable", *args],
            cwd=self.submit_dir,
            env=dict(self.env, **(env or {})),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        jid = r.stdout.strip().split(";")[0]
        self.jobs.append(jid)
        return jid

    def state(self, jid) -> str:
        r = subprocess.run(
            ["scontrol", "show", "job", jid, "-o"], env=self.env, capture_output=True, text=True, timeout=30
        )
        m = re.search(r"JobState=(\S+)", r.stdout)
        return m.group(1) if m else "UNKNOWN"

    def wait(self, jid, timeout=150) -> str:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = self.state(jid)
            if st not in LIVE:
                return st
            time.sleep(0.5)
        raise AssertionError(f"job {jid} still {self.state(jid)} after {timeout} s:\n{self.out(jid)}")

    def out(self, jid) -> str:
        path = self.submit_dir / f"neox20b-topo-{jid}.out"
        return path.read_text() if path.exists() else ""

    def latest(self, run="tiny-topo") -> int:
        name = (self.work / "checkpoints" / run / "latest").read_text().strip()
        return int(name[len("global_step") :])

    def steps_logged(self, run="tiny-topo") -> list[int]:
        path = self.work / "runs" / run / "metrics.jsonl"
        return (
            [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
            if path.exists()
            else []
        )

    def wait_steps(self, jid, n, run="tiny-topo", timeout=150):
        """Until the run has logged more than n steps (the job trains)."""
        t0 = time.monotonic()
        while max(self.steps_logged(run), default=0) <= n and time.monotonic() - t0 < timeout:
            assert self.state(jid) in LIVE, self.out(jid)
            time.sleep(0.5)
        assert max(self.steps_logged(run), default=0) > n, self.out(jid)

    def signal(self, jid, sig):
        subprocess.run(["scancel", "--batch", f"--signal={sig}", jid], env=self.env, check=True, timeout=30)

    def queued(self) -> list[str]:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=30)
        return r.stdout.split()


def _one(pattern, text):
    found = re.findall(pattern, text, flags=re.M)
    assert len(found) == 1, (pattern, text)
    return found[0]


def test_submit_walltime_signal_resubmit_and_resume_on_another_node_count(slurm, tmp_path):
    c = Cluster(slurm, tmp_path)
    ckpt = c.work / "checkpoints" / "tiny-topo"

    # (a) first submission: nothing to resume, trains 3 steps on 2 nodes x 2 ranks, checkpoints
    a = c.sbatch("--nodes=2", *PER_NODE, SCRIPT, "--set", "train_iters=3", *TRAIN)
    assert c.wait(a) == "COMPLETED", c.out(a)
    out = c.out(a)
    assert f"no checkpoint in {ckpt}: starting fresh" in out, out
    assert "4 ranks" in out and "done: step 3" in out and c.latest() == 3

    # (b) a 3-minute job: Slurm's warning (B:USR1@60; slurmctld checks every 30 s and signals when
    # less than 60 + 30 s are left, i.e. 90-120 s into the job, after the ranks started training (5000
    # steps: a small sample index, quick to build; never reached): a
    # warning during start-up would stop the job before its first step, see (e)) reaches the batch
    # shell, which forwards it; the ranks stop at the next micro-batch and save
    b = c.sbatch(
        "--nodes=2",
        *PER_NODE,
        "--time=3",
        SCRIPT,
        "--set",
        "train_iters=5000",
        *TRAIN,
        env={"SBATCH_SIGNAL": "B:USR1@60", "RESUBMIT": "1"},
    )
    assert c.wait(b, timeout=240) == "COMPLETED", c.out(b)  # ended by itself, not TIMEOUT
    out = c.out(b)
    assert f"resumed from {ckpt}/global_step3 at step 3" in out, out
    assert "slurm: got SIGUSR1" in out
    n = int(_one(r"^stopped by SIGUSR1 at step (\d+); checkpoint ", out))
    assert f"stopped by SIGUSR1 at step {n}; checkpoint {ckpt}/global_step{n}" in out
    assert n > 3 and c.latest() == n
    chained = _one(r"^slurm: resubmitted as job (\d+) ", out)
    c.jobs.append(chained)

    # (c) the chained job (same script and arguments) resumes from step n; a USR1 sent to its batch
    # shell with scancel once it trains again stops it the same way
    t0 = time.monotonic()
    while max(c.steps_logged(), default=0) <= n + 1 and time.monotonic() - t0 < 120:
        assert c.state(chained) in LIVE, c.out(chained)
        time.sleep(0.5)
    subprocess.run(["scancel", "--batch", "--signal=USR1", chained], env=c.env, check=True, timeout=30)
    assert c.wait(chained) == "COMPLETED", c.out(chained)
    out = c.out(chained)
    assert f"resumed from {ckpt}/global_step{n} at step {n}" in out, out
    m = int(_one(r"^stopped by SIGUSR1 at step (\d+); checkpoint ", out))
    assert m > n and c.latest() == m
    assert "resubmitted" not in out  # RESUBMIT counted down to 0

    # (d) resubmitted on 1 node (2 ranks): the 4-rank checkpoint reshards; the run finishes
    d = c.sbatch("--nodes=1", *PER_NODE, SCRIPT, "--set", f"train_iters={m + 3}", *TRAIN)
    assert c.wait(d) == "COMPLETED", c.out(d)
    out = c.out(d)
    assert "2 ranks" in out and f"resumed from {ckpt}/global_step{m} at step {m}" in out, out
    assert f"done: step {m + 3}" in out and c.latest() == m + 3
    # one metrics.jsonl for the whole run: every step once, in order, across the four jobs
    assert c.steps_logged() == list(range(1, m + 4))
    print(
        f"\nreal Slurm: job {a} fresh -> step 3; job {b} (3 min) SIGUSR1 -> saved step {n}, chained job "
        f"{chained}; job {chained} resumed {n} -> saved {m}; job {d} on 1 node resumed {m} -> {m + 3}"
    )


def test_chains_keep_their_run_stop_commands_and_one_owner_per_run_folder(slurm, tmp_path):
    c = Cluster(slurm, tmp_path)
    del c.env["MASTER_PORT"]  # the scripts pick one per job
    c.work = c.submit_dir / "relwork"
    c.env["WORK_DIR"] = "relwork"  # relative to the submit folder
    shutil.copy(os.path.join(REPO, "configs", "topo.yml"), c.submit_dir / "mypreset.yml")
    run = "tiny-mypreset"
    ckpt, logs = c.work / "checkpoints" / run, c.work / "runs" / run
    args = ("--nodes=1", *PER_NODE, SCRIPT, "mypreset.yml", "--set", "train_iters=5000", *TRAIN)

    def started(jid):  # the batch shell runs (its banner is out: its signal traps are set)
        t0 = time.monotonic()
        while "megatron_topo: job" not in c.out(jid) and time.monotonic() - t0 < 120:
            assert c.state(jid) in LIVE, c.out(jid)
            time.sleep(0.2)

    # (e) stopped before training (the signal comes while the job starts up): no resubmission
    e = c.sbatch(*args, env={"RESUBMIT": "2"})
    started(e)
    c.signal(e, "USR1")
    assert c.wait(e) == "COMPLETED", c.out(e)
    out = c.out(e)
    assert "not resubmitting" in out and "resubmitted" not in out, out
    assert "trained no step" in out or "before training started" in out, out
    assert not (ckpt / "latest").exists() and c.queued() == []

    # (f) RESUBMIT=3: job 1 -USR1-> job 2 -USR1-> job 3, which (g) a second job on the same run
    # cannot disturb, and which the documented stop (USR2) saves and ends without chaining
    links = [c.sbatch(*args, env={"RESUBMIT": "3"})]
    for k in range(2):
        jid = links[-1]
        c.wait_steps(jid, max(c.steps_logged(run), default=0) + 1, run)
        c.signal(jid, "USR1")
        assert c.wait(jid) == "COMPLETED", c.out(jid)
        out = c.out(jid)  # every link's log in the submit folder
        n = c.latest(run)
        assert f"stopped by SIGUSR1 at step {n}; checkpoint {ckpt}/global_step{n}" in out, out
        assert ("starting fresh" in out) == (k == 0), out
        links.append(_one(r"^slurm: resubmitted as job (\d+) ", out))
        c.jobs.append(links[-1])
    third = links[-1]
    c.wait_steps(third, c.latest(run) + 1, run)
    assert f"resumed from {ckpt}/global_step{c.latest(run)}" in c.out(third)

    # (g) a second job on the run folder stops in one line naming the owner; the owner goes on
    before = sorted(d for d in os.listdir(ckpt) if d.startswith("global_step"))
    before.sort(key=lambda d: int(d[len("global_step") :]))
    g = c.sbatch(*args, env={"RESUBMIT": "1"})
    assert c.wait(g) == "FAILED", c.out(g)
    errors = [ln for ln in c.out(g).splitlines() if ln.startswith("error:")]  # (srun adds its own line)
    assert len(errors) == 1 and errors[0].startswith(
        f"error: checkpoint.save {ckpt} belongs to a running job (Slurm job {third}, "
    ), c.out(g)
    assert "Traceback" not in c.out(g) and "resubmitted" not in c.out(g)
    assert c.state(third) == "RUNNING" and json.loads((ckpt / ".megatron_topo.lock").read_text())["job"] == third
    assert c.latest(run) >= int(before[-1][len("global_step") :])  # only the owner's saves moved it on

    c.signal(third, "USR2")
    assert c.wait(third) == "COMPLETED", c.out(third)
    out = c.out(third)
    m = c.latest(run)
    assert f"stopped by SIGUSR2 at step {m}; checkpoint {ckpt}/global_step{m}" in out, out
    assert "resubmitted" not in out and "not resubmitting" in out, out
    assert c.queued() == []
    assert c.steps_logged(run) == list(range(1, m + 1))  # every step once, in order
    assert not (c.submit_dir / "relwork" / "relwork").exists()  # no nested WORK_DIR
    jobs_log = (logs / "slurm_jobs.log").read_text().splitlines()
    assert [ln.split()[1] for ln in jobs_log] == [e, *links], jobs_log  # the refused job left no line
    assert f"chain: {' '.join(links)};" in jobs_log[-1]
    print(
        f"\nreal Slurm: job {e} stopped in start-up, no chain; chain {links} -> step {m} (USR1, USR1, USR2); "
        f"job {g} refused while {third} owned the run"
    )
