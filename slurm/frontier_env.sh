#!/bin/bash
# Sourced by the batch scripts (frontier_20b.sh, frontier_10b.sh, frontier_generic.sh,
# frontier_collectives.sh) once they have found REPO: the site settings below, the work folder,
# modules, the RCCL network plugin (checked: the library must load), RCCL/libfabric settings with
# their sources, a per-job MIOpen cache, optional staging of the venv to node-local NVMe, the
# env:// rendezvous on the first node, srun_per_gcd (one task per GCD; srun
# in the background, so the batch shell can forward Slurm's warning signal to the ranks).
#
# Knobs read from the environment (export them before sbatch, or change the defaults here):
#   SITE         frontier (default) | local_cpu: no modules, no plugin, gloo on CPU, the tiny model,
#                ranks per node from the job (--ntasks-per-node); for trying the scripts on any
#                Slurm cluster and for the test suite (tests/test_slurm_real.py).
#   WORK_DIR     data, data_cache, runs and checkpoints (not the repository: home quotas are 50 GB);
#                a relative WORK_DIR is relative to the folder you submit from (made absolute at the
#                first job and carried to every resubmission)
#   VENV         the Python environment with ROCm PyTorch
#   RESUBMIT     how many more jobs to chain when the walltime warning stops training (default 0)
#   STAGE_VENV   1: copy VENV to node-local NVMe (NVME_DIR, default /mnt/bb/$USER) with sbcast first
#   PRGENV_MODULE, CPE_MODULE, ROCM_MODULE, PLUGIN_MODULE, PLUGIN_DIR, MASTER_PORT, NVME_DIR, REPO
# Nothing else comes from the environment: the model, preset, run name, log and checkpoint folders
# are set by the scripts and their arguments (an exported MODEL_CONFIG changes nothing).
# ============================ site settings: edit this block ====================================
: "${SITE:=frontier}"
: "${CHAIN_SUBMIT_DIR:=${SLURM_SUBMIT_DIR:-$PWD}}"  # the folder the first job of a chain was submitted from
if [ "$SITE" = local_cpu ]; then
    : "${WORK_DIR:=${TMPDIR:-/tmp}/megatron_topo-${USER:-$(id -un)}}"
else  # Orion (Lustre) scratch of the job's project: /lustre/orion/<project>/scratch/<user>/megatron_topo
    acct="${SLURM_JOB_ACCOUNT:-CHANGEME}"
    : "${WORK_DIR:=/lustre/orion/${acct,,}/scratch/${USER:-$(id -un)}/megatron_topo}"
fi
case "$WORK_DIR" in /*) ;; *) WORK_DIR="$CHAIN_SUBMIT_DIR/$WORK_DIR";; esac  # relative: to the submit folder
: "${VENV:=$REPO/.venv}"                     # venv with ROCm PyTorch (docs/frontier.md §1)
: "${RESUBMIT:=0}"                           # jobs to chain after a walltime stop (0: none)
: "${STAGE_VENV:=0}"                         # 1: sbcast the venv to NVME_DIR on every node
: "${NVME_DIR:=/mnt/bb/${USER:-$(id -un)}}"  # node-local NVMe (#SBATCH -C nvme)
# Modules, one pinned block: OLCF's current recommendation for PyTorch + RCCL on Frontier
# [OLCF-26] (read 2026-11-27). ROCM_MODULE must match the ROCm your torch wheel was built for.
: "${PRGENV_MODULE:=PrgEnv-gnu/8.7.0}"
: "${CPE_MODULE:=cpe/26.03}"
: "${ROCM_MODULE:=rocm/7.1.1}"
: "${PLUGIN_MODULE:=}"                       # the RCCL network plugin module; empty: tried in order
                                             # rccl-net-plugin [OLCF-26], then aws-ofi-nccl (ROCm >= 7) or
                                             # aws-ofi-rccl (ROCm 6) [LLNL]; "none": no module, PLUGIN_DIR only
: "${PLUGIN_DIR:=$HOME/aws-ofi-rccl/lib}"    # else: lib/ of your own plugin build (librccl-net.so)
PORT_GIVEN="${MASTER_PORT:+1}"               # a MASTER_PORT you export is kept (and carried to resubmissions)
slurm_count() {  # NAME VALUE: a count Slurm sets, ASCII digits (bash arithmetic would evaluate a name or expression)
    case "$2" in ''|*[!0-9]*|0?*|???????????????????*)
        echo "slurm: error: $1='$(printf '%.40s' "$2" | tr -c '[:print:]' '?')' is not a number in ASCII digits 0-9 (Slurm sets it; submit with sbatch)" >&2
        exit 2;; esac
}
[ -z "${SLURM_JOB_ID:-}" ] || slurm_count SLURM_JOB_ID "$SLURM_JOB_ID"
: "${MASTER_PORT:=$((10000 + ${SLURM_JOB_ID:-0} % 20000))}"  # else one per job: two jobs on a node never collide
# ================================================================================================
set -euo pipefail
case "$SITE" in frontier|local_cpu) ;; *) echo "slurm: error: SITE=$SITE: expected frontier or local_cpu" >&2; exit 2;; esac
case "$RESUBMIT" in ''|*[!0-9]*) echo "slurm: error: RESUBMIT=$RESUBMIT: expected a number of jobs (0: none)" >&2; exit 2;; esac
if [ ! -d "$(dirname "$WORK_DIR")" ] || ! mkdir -p "$WORK_DIR" 2>/dev/null || [ ! -w "$WORK_DIR" ]; then
    echo "slurm: error: WORK_DIR=$WORK_DIR cannot be created or written (its parent must exist); set WORK_DIR (default: Orion scratch of the job's --account)" >&2
    exit 2
fi
USER_NAME="${USER:-$(id -un)}"
NODES="${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-1}}"
slurm_count SLURM_NNODES "$NODES"

# ---- software environment
if [ "$SITE" = frontier ]; then
    if ! type module >/dev/null 2>&1 && [ -f /usr/share/lmod/lmod/init/bash ]; then
        source /usr/share/lmod/lmod/init/bash
    fi
    module load "$PRGENV_MODULE"
    module load "$CPE_MODULE"
    module load "$ROCM_MODULE"
    module load craype-accel-amd-gfx90a
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "slurm: error: no python in VENV=$VENV; create it (docs/frontier.md) or set VENV" >&2
    exit 2
fi

# ---- the RCCL network plugin. OLCF provides it as the module rccl-net-plugin (aws-ofi-nccl
# built for each ROCm module) [OLCF-26]; older names are tried after it: aws-ofi-nccl for ROCm >= 7,
# aws-ofi-rccl for ROCm 6 [LLNL]. A module is loaded after rocm; PLUGIN_DIR (your own build) is
# added to LD_LIBRARY_PATH. The library must load (a plugin built against a libfabric since removed
# from the system does not): a multi-node run without one stops here, naming what it tried and how
# to override, instead of letting RCCL fall back to TCP sockets.
rocm_major() {
    local v=""
    [ -n "${ROCM_PATH:-}" ] && [ -f "$ROCM_PATH/.info/version" ] && v="$(cat "$ROCM_PATH/.info/version")"
    [ -n "$v" ] || v="${ROCM_MODULE#*/}"
    v="${v%%.*}"
    case "$v" in ''|*[!0-9]*) echo 7;; *) echo "$v";; esac
}
find_net_plugin() {  # prints the first plugin library on LD_LIBRARY_PATH (or NCCL_NET_PLUGIN) that loads
    local d lib
    if [ -n "${NCCL_NET_PLUGIN:-}" ] && [ -f "$NCCL_NET_PLUGIN" ]; then
        set -- "$NCCL_NET_PLUGIN"
    else
        set --
        local IFS=:
        for d in ${LD_LIBRARY_PATH:-}; do
            for lib in "$d/librccl-net.so" "$d/libnccl-net.so"; do [ -f "$lib" ] && set -- "$@" "$lib"; done
        done
    fi
    for lib in "$@"; do
        if "$VENV/bin/python" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$lib" 2>/dev/null; then
            echo "$lib"; return 0
        fi
    done
    return 1
}
NET_PLUGIN=""
if [ "$SITE" = frontier ]; then
    if [ -n "$PLUGIN_MODULE" ]; then plugin_modules=("$PLUGIN_MODULE")
    elif [ "$(rocm_major)" -ge 7 ]; then plugin_modules=(rccl-net-plugin aws-ofi-nccl)
    else plugin_modules=(rccl-net-plugin aws-ofi-rccl); fi
    plugin_how="modules tried: ${plugin_modules[*]} (none available)"
    [ "$PLUGIN_MODULE" = none ] && plugin_modules=() && plugin_how="no module (PLUGIN_MODULE=none)"
    for m in "${plugin_modules[@]}"; do
        if module is-avail "$m" >/dev/null 2>&1; then
            module load "$m"                                   # after rocm
            plugin_how="module $m loaded"
            break
        fi
    done
    [ -d "$PLUGIN_DIR" ] && export LD_LIBRARY_PATH="$PLUGIN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    NET_PLUGIN="$(find_net_plugin || true)"
    if [ -z "$NET_PLUGIN" ] && [ "$NODES" -gt 1 ]; then
        echo "slurm: error: no loadable RCCL network plugin (librccl-net.so / libnccl-net.so) for $ROCM_MODULE:" \
             "$plugin_how; none that loads in PLUGIN_DIR=$PLUGIN_DIR or on LD_LIBRARY_PATH." \
             "Override: PLUGIN_MODULE=<module> (see 'module avail rccl'), PLUGIN_DIR=<lib folder of your build>" \
             "or NCCL_NET_PLUGIN=<library> (docs/frontier.md §1); multi-node RCCL would fall back to TCP sockets" >&2
        exit 2
    fi
fi

# ---- RCCL / libfabric (CXI) settings, each with its source (docs/frontier.md has the table, with
# the date each source was read); every one can be overridden by exporting it before sbatch, and
# values the plugin module sets itself are kept.
#   [OLCF]    OLCF user guide, "PyTorch on Frontier" (docs.olcf.ornl.gov/software/python/pytorch_frontier.html)
#   [OLCF-26] OLCF Frontier user guide, RCCL network plugin section, as of 2026-07 (issue 28)
#   [HPE]     HPE Slingshot CCL notes, shs-ccl-docs: ccl_env.sh and rccl/rccl_tuning_guide.md
#   [S004]    seed 004, Ch. 6 §6.1.1 (tuned RCCL on Frontier)   [LLNL] LLNL HPC-launcher v1.0.4 release notes
if [ "$SITE" = frontier ]; then
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-hsn0}"            # [OLCF] bootstrap over Slingshot
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-hsn0}"            #   (ours: gloo side channel on the same NIC)
    export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}"             # [HPE][OLCF =3][S004] GPU-direct RDMA GCD<->NIC
    export NCCL_CROSS_NIC="${NCCL_CROSS_NIC:-1}"                       # [HPE][OLCF]
    export HSA_FORCE_FINE_GRAIN_PCIE="${HSA_FORCE_FINE_GRAIN_PCIE:-1}" # [HPE] peer access to large BARs
    export FI_MR_CACHE_MONITOR="${FI_MR_CACHE_MONITOR:-userfaultfd}"   # [HPE] memory-registration cache monitor
    export FI_CXI_DISABLE_HOST_REGISTER="${FI_CXI_DISABLE_HOST_REGISTER:-1}"  # [HPE] avoids RCCL deadlocks
    export FI_CXI_DEFAULT_CQ_SIZE="${FI_CXI_DEFAULT_CQ_SIZE:-131072}"  # [HPE] large jobs
    export FI_CXI_DEFAULT_TX_SIZE="${FI_CXI_DEFAULT_TX_SIZE:-2048}"    # [HPE] large jobs, unexpected rendezvous messages
    export FI_CXI_RDZV_PROTO="${FI_CXI_RDZV_PROTO:-alt_read}"          # [HPE][OLCF-26] needs the allocation's
                                                                       #   --network=disable_rdzv_get (#SBATCH header)
    export FI_CXI_RX_MATCH_MODE="${FI_CXI_RX_MATCH_MODE:-hybrid}"      # [HPE] software matching when hardware runs out
    export FI_CXI_RDZV_EAGER_SIZE="${FI_CXI_RDZV_EAGER_SIZE:-0}"       # [HPE][S004] no eager data
    export FI_CXI_RDZV_GET_MIN="${FI_CXI_RDZV_GET_MIN:-0}"             # [HPE][S004]
    export FI_CXI_RDZV_THRESHOLD="${FI_CXI_RDZV_THRESHOLD:-0}"         # [S004] no eager messages: faster large collectives
    if [ -n "$NET_PLUGIN" ] && [ "$NODES" -gt 1 ]; then               # multi-node only [OLCF-26]: on one node
        export NCCL_NET="${NCCL_NET:-AWS Libfabric}"                   # RCCL needs no network [HPE] RCCL stops
    fi                                                                 # instead of falling back to sockets
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-7}"                     # ours: --cpus-per-task=7
    RANKS_PER_NODE=8                                                   # 4 MI250X x 2 GCDs
    SRUN_SITE_OPTS=(--cpus-per-task=7 --gpus-per-task=1 --gpu-bind=closest)   # [OLCF]
else
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    per="${SLURM_NTASKS_PER_NODE:-2}"; per="${per%%(*}"; per="${per%%,*}"
    slurm_count SLURM_NTASKS_PER_NODE "$per"
    RANKS_PER_NODE="$per"
    SRUN_SITE_OPTS=(--cpus-per-task=1)
fi
NTASKS=$((NODES * RANKS_PER_NODE))

# ---- per-job MIOpen kernel database on node-local storage (a shared $HOME DB locks and corrupts) [OLCF]
if [ -d "/mnt/bb/$USER_NAME" ]; then
    export MIOPEN_USER_DB_PATH="/mnt/bb/$USER_NAME/miopen-${SLURM_JOB_ID:-local}"
else
    export MIOPEN_USER_DB_PATH="/tmp/$USER_NAME-miopen-${SLURM_JOB_ID:-local}"
fi
export MIOPEN_CUSTOM_CACHE_DIR="$MIOPEN_USER_DB_PATH"       # created on every node by srun_task.sh

# ---- optional: the venv on node-local NVMe (NVMe > Orion >> NFS for Python start-up [OLCF])
RUN_VENV="$VENV"                                            # the ranks' venv (VENV itself is not changed)
if [ "$STAGE_VENV" = 1 ]; then
    stage="$NVME_DIR"
    tarball="$WORK_DIR/venv-$(basename "$VENV").tar"
    if [ ! -f "$tarball" ] || [ -n "$(find "$VENV" -newer "$tarball" -print -quit)" ]; then
        tar -C "$(dirname "$VENV")" -cf "$tarball.tmp" "$(basename "$VENV")" && mv "$tarball.tmp" "$tarball"
    fi
    sbcast --force "$tarball" "$stage/venv.tar"
    srun --nodes="$NODES" --ntasks="$NODES" --ntasks-per-node=1 tar -C "$stage" -xf "$stage/venv.tar"
    RUN_VENV="$stage/$(basename "$VENV")"
fi

# ---- rendezvous: torch.distributed env:// on the first node of the allocation
# (no `| head -n 1`: under pipefail a SIGPIPE in scontrol would abort the job)
HOSTS="$(scontrol show hostnames "${SLURM_NODELIST:?submit with sbatch (or run inside salloc)}")"
FIRST_NODE="${HOSTS%%$'\n'*}"
MASTER_ADDR="$(scontrol show node "$FIRST_NODE" -o 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')"
MASTER_ADDR="${MASTER_ADDR:-$FIRST_NODE}"
export MASTER_ADDR MASTER_PORT

# One task per GCD. --distribution=block puts ranks 8n..8n+7 on node n (node-major, as
# megatron_topo.topology expects); with 7 cores per task and --gpu-bind=closest, local ranks
# 2k and 2k+1 get the two GCDs of one MI250X (the GCD pair of the `topo` preset).
#   srun_per_gcd SCRIPT.py ARGS...   runs "$RUN_VENV/bin/python -u SCRIPT.py ARGS..." on every GCD
# srun runs in the background and the batch shell waits for it: Slurm's warning (#SBATCH
# --signal=B:USR1@...) and scancel's SIGTERM reach the batch shell, which forwards them to srun,
# which passes them to every task. STOP_SIGNAL names the signal that arrived; LAUNCH_RC is srun's
# exit status (also the function's).
# SIGUSR2 (`scancel --batch --signal=USR2`: stop now, save, do not chain) is forwarded the same way.
# A rank ignores SIGUSR1/SIGUSR2 until train.py starts (srun_task.sh), so the signal is sent again
# every 10 s until the ranks end: one that came while the ranks started up is not lost.
STOP_SIGNAL=""
LAUNCH_PID=""
REFORWARD_PID=""
forward_signal() {
    STOP_SIGNAL="$1"
    echo "slurm: got SIG$1 at $(date +%T); forwarding it to the ranks" >&2
    if [ -n "$LAUNCH_PID" ]; then
        kill -s "$1" "$LAUNCH_PID" 2>/dev/null || true
        if [ "$1" != TERM ] && [ "$1" != HUP ] && [ -z "$REFORWARD_PID" ]; then
            (while sleep 10; do kill -s "$1" "$LAUNCH_PID" 2>/dev/null || exit 0; done) &
            REFORWARD_PID=$!
        fi
    fi
}
trap 'forward_signal USR1' USR1
trap 'forward_signal USR2' USR2
trap 'forward_signal TERM' TERM
trap 'forward_signal HUP' HUP    # a hang-up stops the ranks as SIGTERM does (train.py: save, exit 0)
srun_per_gcd() {
    srun --nodes="$NODES" --ntasks="$NTASKS" --ntasks-per-node="$RANKS_PER_NODE" "${SRUN_SITE_OPTS[@]}" \
         --distribution=block --kill-on-bad-exit=1 \
         "$REPO/slurm/srun_task.sh" "$RUN_VENV/bin/python" -u "$@" &
    LAUNCH_PID=$!  # srun itself (a plain command in the background, not a subshell)
    LAUNCH_RC=0
    while :; do
        wait "$LAUNCH_PID" && LAUNCH_RC=0 || LAUNCH_RC=$?
        # a trapped signal interrupts `wait` (status > 128) while the step still runs
        if [ "$LAUNCH_RC" -gt 128 ] && kill -0 "$LAUNCH_PID" 2>/dev/null; then continue; fi
        break
    done
    if [ "$LAUNCH_RC" -gt 128 ]; then  # interrupted just as the step ended: its own status, if bash kept it
        wait "$LAUNCH_PID" 2>/dev/null && LAUNCH_RC=0 || { r=$?; [ "$r" -eq 127 ] || LAUNCH_RC=$r; }
    fi
    LAUNCH_PID=""
    if [ -n "$REFORWARD_PID" ]; then kill "$REFORWARD_PID" 2>/dev/null || true; REFORWARD_PID=""; fi
    return "$LAUNCH_RC"
}
