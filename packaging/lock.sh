#!/usr/bin/env bash
# Refresh the hashed lock files packaging/build-deb.sh installs from: one per set of extras a
# .deb is built with, every package pinned with the sha256 of each of its files.
#
#   packaging/lock.sh [--upgrade | --upgrade-package NAME ...]
#
# Without options the pins already in the lock files are kept where pyproject.toml still allows
# them (only what changed is resolved again); --upgrade resolves everything to the newest
# releases. Needs uv (pip install uv). Resolved for CPython $PYVER (Debian 12's python3) on Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.11}
UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
[ -x "$UV" ] || command -v "$UV" >/dev/null || { echo "lock: uv not found (pip install uv)" >&2; exit 2; }
# the extras sets build-deb.sh accepts: one lock each, named after them (sorted, "+" between)
SETS="agent agent,otlp agent,otlp-grpc analyzer all"
mkdir -p packaging/locks
for extras in $SETS; do
    args=()
    for e in ${extras//,/ }; do args+=(--extra "$e"); done
    "$UV" pip compile --quiet pyproject.toml "${args[@]}" --generate-hashes \
        --python-version "$PYVER" --python-platform linux \
        --custom-compile-command "packaging/lock.sh (python $PYVER, linux)" \
        --output-file "packaging/locks/${extras//,/+}.txt" "$@"
done
