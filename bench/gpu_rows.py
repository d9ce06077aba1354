"""Dump the GPU collector's rows, as line protocol, for every recorded backend and the sim backend.

A before/after check for changes to the collector: run it on two trees and ``diff`` the outputs.
Each backend is polled at a fixed series of tick times (first poll, a fast poll, an NVLink poll,
a slow poll, ...), so the slow tier, the NVLink cadence and GPM intervals all show up.

    python bench/gpu_rows.py [--sorted-fields] [RECORDING ...] > rows.lp

``--sorted-fields``: each line's fields in name order (a change that only reorders the reads
of a row then diffs clean; InfluxDB does not keep field order).

Without arguments: every ``*.json`` / ``*.xml`` under ``tests/fixtures/recordings`` and
``/work/shared/reference`` that loads as a backend, then ``sim`` (8 GPUs, one lost, one stale).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from gpufleet.agent.backends import get_backend
from gpufleet.agent.collectors.gpu import GpuCollector

from gpufleet.errors import GpufleetError
from gpufleet.lineprotocol import encode

ROOT = Path(__file__).resolve().parent.parent
DIRS = (ROOT / "tests/fixtures/recordings", Path("/work/shared/reference"))
T0 = 1_700_000_000.0
TICKS = (0.0, 1.0, 2.0, 31.0, 61.0, 62.0, 95.0)


def recordings() -> list[str]:
    out = []
    for d in DIRS:
        if d.is_dir():
            out += sorted(str(p) for p in d.rglob("*") if p.suffix in (".json", ".xml"))
    return out


def backends(args: list[str]):
    for path in args or recordings():
        full = Path(path).resolve()
        name = str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else path
        try:
            yield name, get_backend(f"recorded:{path}")
        except GpufleetError as exc:
            print(f"# skipped {path}: {exc}", file=sys.stderr)
    if not args:
        from gpufleet.agent.backends.sim import SimBackend, TinyNode

        yield "sim", SimBackend(TinyNode(t0=T0 - 3600, lost={5}, stale={6}))


def dump(name: str, backend, out, sort: bool = False) -> None:
    clock = [T0]
    col = GpuCollector(backend, deadline_s=5.0, clock=lambda: clock[0])
    try:
        for dt in TICKS:
            clock[0] = T0 + dt
            now_ns = int((T0 + dt) * 1e9)
            for s in col.collect(now_ns):
                fields = dict(sorted(s.fields.items())) if sort else s.fields
                line = encode(s.measurement, {"backend": name, **s.tags}, fields, s.time_ns)
                if line:
                    out.write(line + "\n")
    finally:
        col.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.ERROR)
    sort = "--sorted-fields" in argv
    for name, backend in backends([a for a in argv if a != "--sorted-fields"]):
        dump(name, backend, sys.stdout, sort)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
