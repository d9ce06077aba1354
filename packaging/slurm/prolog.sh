#!/bin/sh
# gpufleet: a quick SDC canary before a job starts (Slurm Prolog; docs/sources.md "Canary hooks").
#
# slurm.conf:  Prolog=/usr/share/gpufleet/slurm/prolog.sh   (PrologFlags=Alloc runs it at allocation)
# A smaller check than the epilog's (1024² GEMM, 16 MiB pattern: ~1 s of GPU, plus the child's
# start-up) on the job's GPUs, results into the agent's drop directory. Exits 0 unless
# GPUFLEET_CANARY_FAIL_EXIT=1 (then a failed check fails the prolog: Slurm drains the node and
# requeues the job). Same settings as epilog.sh.
export GPUFLEET_CANARY_SOURCE=${GPUFLEET_CANARY_SOURCE:-slurm-prolog}
export GPUFLEET_CANARY_ARGS="${GPUFLEET_CANARY_ARGS:---size 1024 --memory-bytes 16777216}"
exec "$(dirname "$0")/epilog.sh"
