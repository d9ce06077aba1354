"""Synthetic fleet generation speed and memory (issue target: >= 30k GPU-samples/s on 2 cores).

Full: 1,024 GPUs (128 nodes x 8) for 24 h at 10 s = 8.8M GPU-samples, chaos scenario, with
line-protocol output. Quick: 256 GPUs for 2 h. Each run is a child process (``gpufleet sim``)
so its peak resident memory is measured alone.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _one(nodes: int, duration: str, scenario: str = "chaos") -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        out = Path(tmp) / "fleet"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "sim",
                "--nodes",
                str(nodes),
                "--gpus-per-node",
                "8",
                "--duration",
                duration,
                "--step",
                "10s",
                "--seed",
                "1",
                "--scenario",
                scenario,
                "--out",
                str(out),
                "--no-progress",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        import json

        m = json.loads((out / "manifest.json").read_text())
        size = (out / "telemetry.lp.gz").stat().st_size
    samples = m["fleet"]["gpus"] * m["steps"]
    return {
        "samples": samples,
        "wall": wall,
        "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "rss_mib": after.ru_maxrss / 1024,
        "lines": sum(m["telemetry"]["lines"].values()),
        "gz_mib": size / 2**20,
        "raw_mib": m["telemetry"]["bytes_uncompressed"] / 2**20,
    }


def run(quick: bool = False) -> list[dict]:
    nodes, duration = (32, "2h") if quick else (128, "24h")
    r = _one(nodes, duration)
    note = f"{nodes * 8} GPUs x {duration} at 10 s, chaos, {r['lines']:,} lines; {os.cpu_count()} cores"
    return [
        {
            "benchmark": "sim",
            "metric": "GPU-samples/s (wall)",
            "value": r["samples"] / r["wall"],
            "unit": "1/s",
            "target": ">= 30000",
            "note": note,
        },
        {
            "benchmark": "sim",
            "metric": "wall time",
            "value": r["wall"],
            "unit": "s",
            "target": "",
            "note": note,
        },
        {
            "benchmark": "sim",
            "metric": "CPU time",
            "value": r["cpu"],
            "unit": "s",
            "target": "",
            "note": "main thread formats, a second thread gzips",
        },
        {
            "benchmark": "sim",
            "metric": "peak RSS",
            "value": r["rss_mib"],
            "unit": "MiB",
            "target": "",
            "note": "bounded by the chunk (32k GPU-samples), not the run length",
        },
        {
            "benchmark": "sim",
            "metric": "telemetry.lp.gz",
            "value": r["gz_mib"],
            "unit": "MiB",
            "target": "",
            "note": f"{r['raw_mib']:,.0f} MiB uncompressed, gzip level 3",
        },
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
