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
#   $WORK_DIR/runs/<model>-<preset>/slurm_jobs.log   one line per job that ended cleanly (exit 0):
#                                             job id, the chain's job ids, nodes, steps, exit, the job
#                                             log (every link's log stays in the first job's submit folder)
# Relative paths in the YAML files (data_path, vocab_file, ...) are relative to $WORK_DIR.
#
# Stopping (docs/frontier.md §2):
#   scancel --batch --signal=USR1 JOB   as the walltime warning: stop at the next micro-batch, save,
#                                       chain the next job when RESUBMIT > 0
#   scancel --batch --signal=USR2 JOB   stop now, save, do not chain
#   touch $WORK_DIR/runs/<run>/STOP_CHAIN   let this job run, but chain no next one
# A job that trained no step (its checkpoint did not move) never chains.

resolve_yml() {  # a YAML argument: absolute, or relative to the first job's submit folder or the repository
    local f="$1" base
    if [[ "$f" = /* ]]; then [ -f "$f" ] && { echo "$f"; return 0; }
    else
        for base in "$CHAIN_SUBMIT_DIR" "$REPO"; do
            [ -f "$base/$f" ] && { echo "$(cd "$(dirname "$base/$f")" && pwd)/$(basename "$f")"; return 0; }
        done
    fi
    echo "slurm: error: config file $f not found (looked in $CHAIN_SUBMIT_DIR and $REPO)" >&2
    return 2
}

latest_step() {  # the checkpoint step `latest` names in $CKPT_DIR (empty: none)
    local name=""
    [ -f "$CKPT_DIR/latest" ] && name="$(head -c 200 "$CKPT_DIR/latest" 2>/dev/null | tr -d '[:space:]')"
    echo "${name#global_step}"
}

resubmit_job() {  # the next job of the chain: same script, arguments, nodes and time limit
    local info script limit jid
    info="$(scontrol show job "$SLURM_JOB_ID" -o)"
    script="$(sed -n 's/.* Command=\([^ ]*\).*/\1/p' <<< "$info")"
    limit="$(sed -n 's/.* TimeLimit=\([^ ]*\).*/\1/p' <<< "$info")"
    # WORK_DIR, the submit folder and the chain are carried as absolute values; a MASTER_PORT the
    # scripts picked for this job is not (the next job picks its own)
    local -a unset_port=()
    [ -n "$PORT_GIVEN" ] || unset_port=(-u MASTER_PORT)
    jid="$(env "${unset_port[@]}" RESUBMIT=$((RESUBMIT - 1)) WORK_DIR="$WORK_DIR" CHAIN_SUBMIT_DIR="$CHAIN_SUBMIT_DIR" \
        CHAIN_JOBS="$CHAIN_JOBS" sbatch --parsable --export=ALL --dependency="afterany:$SLURM_JOB_ID" \
        --nodes="$NODES" --ntasks-per-node="$RANKS_PER_NODE" ${limit:+--time="$limit"} \
        ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} --chdir="$CHAIN_SUBMIT_DIR" \
        --job-name="${SLURM_JOB_NAME:-megatron_topo}" ${SLURM_JOB_ACCOUNT:+--account="$SLURM_JOB_ACCOUNT"} \
        ${SLURM_JOB_PARTITION:+--partition="$SLURM_JOB_PARTITION"} "$script" "$@")" || return 1
    echo "slurm: resubmitted as job ${jid%%;*} (starts after $SLURM_JOB_ID ends; $((RESUBMIT - 1)) more resubmissions left;" \
         "chain: $CHAIN_JOBS ${jid%%;*})"
}

run_training() {
    local model="$1" preset="$2" system f a
    shift 2
    local -a JOB_ARGS=("$@")
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
    # the next job's arguments: the YAML files this job resolved (absolute), then the rest unchanged
    local -a job_args=()
    local leading=1
    for a in "${JOB_ARGS[@]}"; do  # the leading YAML arguments (model, preset), not --set values
        if [ "$leading" = 1 ] && [[ "$a" == *.yml || "$a" == *.yaml ]]; then
            a="$(resolve_yml "$a")" || exit 2
        else
            leading=0
        fi
        job_args+=("$a")
    done
    RUN_NAME="$(basename "$model" .yml)-$(basename "$preset" .yml)"
    CKPT_DIR="$WORK_DIR/checkpoints/$RUN_NAME"
    LOG_DIR="$WORK_DIR/runs/$RUN_NAME"
    sets+=(--set "log_dir=$LOG_DIR" --set "save=$CKPT_DIR" --set auto_resume=true)
    CHAIN_JOBS="${CHAIN_JOBS:+$CHAIN_JOBS }${SLURM_JOB_ID:-local}"
    local job_log started
    job_log="$(scontrol show job "${SLURM_JOB_ID:-none}" -o 2>/dev/null | sed -n 's/.* StdOut=\([^ ]*\).*/\1/p')"
    started="$(date '+%F %T')"
    cd "$WORK_DIR"
    echo "megatron_topo: job ${SLURM_JOB_ID:-local}: $NODES nodes x $RANKS_PER_NODE ranks = $NTASKS ranks; site $SITE;" \
         "${configs[*]}; checkpoints $CKPT_DIR; logs $LOG_DIR; master $MASTER_ADDR:$MASTER_PORT; chain: $CHAIN_JOBS"
    echo "megatron_topo: stop now, save, no next job: scancel --batch --signal=USR2 ${SLURM_JOB_ID:-JOB};" \
         "chain no next job after this one: touch $LOG_DIR/STOP_CHAIN"

    # 1. dataset caches, by one process, before any rank starts (a no-op once they exist)
    "$RUN_VENV/bin/python" -u "$REPO/tools/prepare_data.py" "${configs[@]}" --world-size "$NTASKS" "${sets[@]}" "$@" \
        || exit $?
    # 2. train (auto-resume); a stop signal makes every rank save and exit 0
    local before after
    before="$(latest_step)"
    if [ -z "$STOP_SIGNAL" ]; then
        srun_per_gcd "$REPO/train.py" "${configs[@]}" "${sets[@]}" "$@" || true
    else
        echo "slurm: SIG$STOP_SIGNAL arrived before training started; not starting it" >&2
        LAUNCH_RC=0
    fi
    after="$(latest_step)"
    if [ "$LAUNCH_RC" -eq 0 ]; then  # a job that failed (e.g. refused: another job owns the run) leaves no line
        mkdir -p "$LOG_DIR" 2>/dev/null || true
        echo "job ${SLURM_JOB_ID:-local} started $started, ended $(date '+%F %T'); chain: $CHAIN_JOBS;" \
             "$NODES nodes x $RANKS_PER_NODE ranks; checkpoint step ${before:-none} -> ${after:-none};" \
             "exit $LAUNCH_RC${STOP_SIGNAL:+ (SIG$STOP_SIGNAL)}; log ${job_log:-?}" >> "$LOG_DIR/slurm_jobs.log" || true
    fi
    # 3. chain the next job after a walltime stop (SIGUSR1) that saved a new checkpoint
    if [ "$STOP_SIGNAL" = USR1 ] && [ "$LAUNCH_RC" -eq 0 ]; then
        if [ "$after" = "$before" ]; then
            echo "slurm: this job trained no step (checkpoint still ${after:+step }${after:-none}): not resubmitting;" \
                 "resubmit the same command when the cause is fixed"
        elif [ -f "$LOG_DIR/STOP_CHAIN" ]; then
            rm -f "$LOG_DIR/STOP_CHAIN"
            echo "slurm: $LOG_DIR/STOP_CHAIN found (removed): not resubmitting; checkpoint step $after;" \
                 "resubmit the same command to continue"
        elif [ "$RESUBMIT" -gt 0 ]; then
            resubmit_job "${job_args[@]}" || { echo "slurm: error: resubmission failed" >&2; exit 1; }
        else
            echo "slurm: stopped before the time limit at step $after; resubmit the same command to continue" \
                 "(or set RESUBMIT=N)"
        fi
    elif [ "$STOP_SIGNAL" = USR2 ] && [ "$LAUNCH_RC" -eq 0 ]; then
        echo "slurm: stopped by SIGUSR2 (scancel --batch --signal=USR2): checkpoint step ${after:-none}; not resubmitting"
    fi
    exit "$LAUNCH_RC"
}
