"""A stray timestamp costs nothing: ``gpufleet analyze`` on a simulated fleet's file, clean and
with one line at timestamp 1 (before the data and appended after it), and with a second-precision
timestamp appended (``python -m bench.run --only stray``). Each timed end to end in its own
process, best of 3, in the child's CPU seconds (steadier than wall time on a shared machine)."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import sim

STRAY = b"gpu,host=stray,gpu=0 power_watts=100 "


def _time(path: Path) -> tuple[float, dict]:
    best, stats = float("inf"), {}
    for _ in range(3):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-m", "gpufleet", "analyze", "--input", str(path), "--stats"],
                             capture_output=True, text=True, check=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        stats = json.loads(out.stderr.strip().splitlines()[-1])
    return best, stats


def run(quick: bool) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nodes, dur = (8, "2h") if quick else (32, "6h")
        sim(tmp / "sim", "mixed", nodes, dur, 7)
        data = gzip.decompress((tmp / "sim" / "telemetry.lp.gz").read_bytes())
        last_s = int(data.rstrip(b"\n").rsplit(b" ", 1)[-1]) // 10**9
        variants = {
            "clean": data,
            "timestamp 1 first": STRAY + b"1\n" + data,
            "timestamp 1 appended": data + STRAY + b"1\n",
            "seconds timestamp appended": data + STRAY + str(last_s).encode() + b"\n",
        }
        base = None
        for name, body in variants.items():
            p = tmp / f"{name.replace(' ', '_')}.lp"
            p.write_bytes(body)
            secs, st = _time(p)
            base = base or secs
            rows.append({"benchmark": "stray", "metric": f"analyze, {name}", "value": secs, "unit": "CPU s",
                         "target": "clean +- 10 %",
                         "note": f"{secs / base - 1:+.1%} vs clean; {st['windows']} windows, "
                                 f"{st['late_points']} late; {nodes * 8} GPUs, {dur}"})
    return rows
