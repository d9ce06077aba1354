#!/bin/sh
# gpufleet: the SDC canary at a job boundary (Slurm Epilog; docs/sources.md "Canary hooks").
#
# slurm.conf:  Epilog=/usr/share/gpufleet/slurm/epilog.sh
# Runs as root on the node after each job, when the job's processes are gone: checks the GPUs
# the job had (SLURM_JOB_GPUS; all of them when unset) with `gpufleet canary` and leaves each
# result in the agent's drop directory, which the agent turns into a gpu_canary row. Each
# check is a short-lived child with a deadline; the hook exits 0 whatever the canary found (the
# analyzer pages; set GPUFLEET_CANARY_FAIL_EXIT=1 to let a failed check drain the node; a check
# that could not run, `gpufleet canary` exit 3, is logged and never drains it). The engine
# comes from canary.python in /etc/gpufleet/agent.toml, as for the agent.
#
# Settings (environment, or edit here): GPUFLEET (the gpufleet command), GPUFLEET_CANARY_DROP,
# GPUFLEET_CANARY_STATE, GPUFLEET_CANARY_ENGINE (auto|torch|cupy|numpy), GPUFLEET_CANARY_TIMEOUT,
# GPUFLEET_CANARY_ARGS (more `gpufleet canary` options, e.g. "--size 1024").
GPUFLEET=${GPUFLEET:-/usr/bin/gpufleet}
DROP=${GPUFLEET_CANARY_DROP:-/var/lib/gpufleet-agent/canary-drop}
STATE=${GPUFLEET_CANARY_STATE:-/var/lib/gpufleet-agent/canary}
ENGINE=${GPUFLEET_CANARY_ENGINE:-auto}
TIMEOUT=${GPUFLEET_CANARY_TIMEOUT:-120}
SOURCE=${GPUFLEET_CANARY_SOURCE:-slurm-epilog}

[ -x "$GPUFLEET" ] || { logger -t gpufleet-canary "no $GPUFLEET: canary skipped" 2>/dev/null; exit 0; }
rc=0
for gpu in $(echo "${SLURM_JOB_GPUS:-all}" | tr ',' ' '); do
    # shellcheck disable=SC2086  # GPUFLEET_CANARY_ARGS is a list of options
    out=$("$GPUFLEET" canary --gpu "$gpu" --engine "$ENGINE" --force --drop-dir "$DROP" \
        --state-dir "$STATE" --timeout "$TIMEOUT" --source "$SOURCE:${SLURM_JOB_ID:-}" \
        $GPUFLEET_CANARY_ARGS 2>&1) || {
        status=$?
        # 1: a check failed; 3: not checked (no CUDA engine, busy): logged, never a drain
        [ "$status" = 3 ] || rc=1
        logger -t gpufleet-canary "job ${SLURM_JOB_ID:-?} gpu $gpu: $out" 2>/dev/null
    }
done
[ "${GPUFLEET_CANARY_FAIL_EXIT:-0}" = 1 ] && exit $rc
exit 0
