#!/bin/bash
# Sourced by frontier_20b.sh, frontier_10b.sh and frontier_generic.sh after frontier_env.sh:
#   run_training MODEL.yml PRESET.yml [PRESET.yml] [train.py arguments ...]
# An empty MODEL takes the first argument ending in .yml (frontier_generic.sh). A leading
# PRESET.yml argument replaces the default preset. The rest goes to train.py unchanged ("$@").
#
# The run's folders follow from model and preset, not from the node count, so a resubmission on
# any number of nodes continues the same run (the checkpoint reshards on load):
#   $WORK_DIR/checkpoints/<model>-<preset>   checkpoints (train.py --set auto_resume=true: resume
#                                             from the latest one, or start fresh when there is none)
#   $WORK_DIR/runs/<model>-<preset>          metrics.jsonl (resubmissions append) + TensorBoard
#   $WORK_DIR/data_cache                      dataset index caches (tools/prepare_data.py, before srun)
# Relative paths in the YAML files (data_path, vocab_file, ...) are relative to $WORK_DIR.

resolve_yml() {  # a YAML argument: absolute, or relative to the submit folder or the repository
    local f="$1"
    if [[ "$f" = /* ]]; then [ -f "$f" ] && { echo "$f"; return 0; }
    else
        for base in "${SLURM_SUBMIT_DIR:-$PWD}" "$REPO"; do
            [ -f "$base/$f" ] && { echo "$(cd "$(dirname "$base/$f")" && pwd)/$(basename "$f")"; return 0; }
        done
    fi
    echo "slurm: error: config file $f not found (looked in ${SLURM_SUBMIT_DIR:-$PWD} and $REPO)" >&2
    return 2
}

resubmit_job() {  # the next job of the chain: same script, arguments, nodes and time limit
    local info script limit jid
    info="$(scontrol show job "$SLURM_JOB_ID" -o)"
    script="$(sed -n 's/.* Command=\([^ ]*\).*/\1/p' <<< "$info")"
    limit="$(sed -n 's/.* TimeLimit=\([^ ]*\).*/\1/p' <<< "$info")"
    jid="$(RESUBMIT=$((RESUBMIT - 1)) sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" \
        --nodes="$NODES" --ntasks-per-node="$RANKS_PER_NODE" ${limit:+--time="$limit"} \
        ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} --chdir="${SLURM_SUBMIT_DIR:-$PWD}" \
        --job-name="${SLURM_JOB_NAME:-megatron_topo}" ${SLURM_JOB_ACCOUNT:+--account="$SLURM_JOB_ACCOUNT"} \
        ${SLURM_JOB_PARTITION:+--partition="$SLURM_JOB_PARTITION"} "$script" "$@")" || return 1
    echo "slurm: resubmitted as job ${jid%%;*} (starts after $SLURM_JOB_ID ends; $((RESUBMIT - 1)) more resubmissions left)"
}

run_training() {
    local model="$1" preset="$2" system f
    shift 2
    local -a job_args=("$@")
    if [ -z "$model" ]; then
        model=configs/20B.yml
        if [ $# -gt 0 ] && [[ "$1" == *.yml || "$1" == *.yaml ]]; then model="$1"; shift; fi
    fi
    if [ $# -gt 0 ] && [[ "$1" == *.yml || "$1" == *.yaml ]]; then preset="$1"; shift; fi
    system=configs/frontier.yml
    local -a sets=()
    if [ "$SITE" = local_cpu ]; then  # CPU site profile: the tiny model, gloo, ranks per node from the job
        model=configs/tiny.yml
        system=configs/local_cpu.yml
        if [ $((RANKS_PER_NODE % 2)) -eq 0 ]; then
            sets+=(--set topology.gcds_per_gpu=2 --set "topology.gpus_per_node=$((RANKS_PER_NODE / 2))")
        else
            sets+=(--set topology.gcds_per_gpu=1 --set "topology.gpus_per_node=$RANKS_PER_NODE")
        fi
    fi
    local -a configs=()
    for f in "$model" "$preset" "$system"; do configs+=("$(resolve_yml "$f")") || exit 2; done
    RUN_NAME="$(basename "$model" .yml)-$(basename "$preset" .yml)"
    CKPT_DIR="$WORK_DIR/checkpoints/$RUN_NAME"
    LOG_DIR="$WORK_DIR/runs/$RUN_NAME"
    sets+=(--set "log_dir=$LOG_DIR" --set "save=$CKPT_DIR" --set auto_resume=true)
    cd "$WORK_DIR"
    echo "megatron_topo: job ${SLURM_JOB_ID:-local}: $NODES nodes x $RANKS_PER_NODE ranks = $NTASKS ranks; site $SITE;" \
         "${configs[*]}; checkpoints $CKPT_DIR; logs $LOG_DIR; master $MASTER_ADDR:$MASTER_PORT"

    # 1. dataset caches, by one process, before any rank starts (a no-op once they exist)
    "$RUN_VENV/bin/python" -u "$REPO/tools/prepare_data.py" "${configs[@]}" --world-size "$NTASKS" "${sets[@]}" "$@" \
        || exit $?
    # 2. train (auto-resume); the walltime warning makes every rank save and exit 0
    if [ -z "$STOP_SIGNAL" ]; then
        srun_per_gcd "$REPO/train.py" "${configs[@]}" "${sets[@]}" "$@" || true
    else
        echo "slurm: SIG$STOP_SIGNAL arrived before training started; not starting it" >&2
        LAUNCH_RC=0
    fi
    # 3. chain the next job after a walltime stop
    if [ "$STOP_SIGNAL" = USR1 ] && [ "$LAUNCH_RC" -eq 0 ]; then
        if [ "$RESUBMIT" -gt 0 ]; then
            resubmit_job "${job_args[@]}" || { echo "slurm: error: resubmission failed" >&2; exit 1; }
        else
            echo "slurm: stopped before the time limit; resubmit the same command to continue (or set RESUBMIT=N)"
        fi
    fi
    exit "$LAUNCH_RC"
}
