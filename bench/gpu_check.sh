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
# one pip call (the opentelemetry wheels share a namespace package: installed one by one into a
# --target, each would replace the last), with the wheels this Python can take (isal is cp312)
PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEELS=()
for whl in "$ROOT"/.gpucheck/wheels/*.whl; do
    [ -e "$whl" ] || continue
    case "$(basename "$whl")" in
        *-py3-none-any.whl|*-py2.py3-none-any.whl|*-"$PYTAG"-*) WHEELS+=("$whl") ;;
        *) echo "gpu_check: wheel not for this Python ($PYTAG): $(basename "$whl")" >&2 ;;
    esac
done
# wheels in fallback/ only where the machine's own copy is missing or too old (typing_extensions:
# torch brings its own, which must not be shadowed)
if ! "$PY" -c 'from typing_extensions import deprecated' 2>/dev/null; then
    for whl in "$ROOT"/.gpucheck/wheels/fallback/*.whl; do [ -e "$whl" ] && WHEELS+=("$whl"); done
fi
if [ ${#WHEELS[@]} -gt 0 ]; then
    rm -rf "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$SITE" \
        "${WHEELS[@]}" >&2 || echo "gpu_check: installing the carried wheels failed" >&2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
exec timeout 450 "$PY" "$ROOT/bench/gpu_check.py" "$@"
