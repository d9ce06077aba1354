#!/usr/bin/env bash
# The GPU check in one command (bench/gpu_check.py): prints ONE JSON object (also $OUT/gpu_check.json).
#
#   bench/gpu_check.sh                 # on a machine with an NVIDIA GPU (~5 min, read-only toward the GPU)
#   bench/gpu_check.sh --backend sim   # the same plumbing on the simulated node, no GPU
#
# Runs the project from source (PYTHONPATH), no build. Python packages the agent needs that the
# machine lacks are installed, offline, from wheels carried in .gpucheck/wheels/ (fill it on a
# machine with network: see docs/benchmarks.md) into .gpucheck/site.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
SITE="$ROOT/.gpucheck/site"
for whl in "$ROOT"/.gpucheck/wheels/*.whl; do
    [ -e "$whl" ] || continue
    # one at a time: a wheel for another Python (isal is cp312) is skipped, not fatal
    "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --upgrade --target "$SITE" \
        "$whl" >/dev/null 2>&1 || echo "gpu_check: wheel not installed: $(basename "$whl")" >&2
done
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
exec timeout 450 "$PY" "$ROOT/bench/gpu_check.py" "$@"
