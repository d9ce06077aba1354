"""Analyzer benchmarks: batch rate end to end (parse + detect), detection alone and memory
(``python -m bench.run --only analyzer``); detection quality is bench_detection's."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import sim


def _rates(path: Path) -> dict:
    from gpufleet.analyzer.parse import Parser
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import read_chunks

    # end to end as `gpufleet analyze` runs it (read, parse, detect, chunk by chunk), in its own
    # process so that its peak memory is its own; first, while this process is still small (a
    # child forked from a large parent starts out counting the parent's pages)
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", "analyze", "--input", str(path), "--stats"],
        capture_output=True,
        text=True,
        check=True,
    )
    e2e = time.perf_counter() - t
    stats = json.loads(out.stderr.strip().splitlines()[-1])
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    chunks = list(read_chunks(path))
    read = time.perf_counter() - t
    mb = sum(map(len, chunks)) / 1e6
    an = Analyzer()
    numpy_parser = Parser(an.parser.only, an.parser.fields, engine="numpy")
    t = time.perf_counter()
    for c in chunks:
        numpy_parser.feed(c)
    parse_numpy = time.perf_counter() - t
    del numpy_parser
    t = time.perf_counter()
    rows = [an.parser.feed(c) for c in chunks]
    parse = time.perf_counter() - t
    t = time.perf_counter()
    for r in rows:
        an.feed_rows(r)
    an.finish()
    detect = time.perf_counter() - t
    del rows, chunks
    n = an.gpu_samples
    return {
        "n": n,
        "mb": mb,
        "read": read,
        "engine": an.parser.engine,
        "parse_numpy": parse_numpy,
        "parse": parse,
        "detect": detect,
        "e2e": e2e,
        "e2e_inner": stats["seconds"],
        "rss_mb": rss / 1024,
    }


def run(quick: bool) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nodes, dur = (16, "2h") if quick else (128, "4h")
        sim(tmp / "rate", "mixed", nodes, dur, 7)
        r = _rates(tmp / "rate" / "telemetry.lp.gz")
        note = (
            f"{r['n']:,} GPU-samples ({nodes * 8} GPUs, {dur}), {r['mb']:.0f} MB of line protocol, one core"
        )
        rows += [
            {
                "benchmark": "analyzer",
                "metric": "batch end to end (read+parse+detect)",
                "value": r["n"] / r["e2e_inner"],
                "unit": "GPU-samples/s",
                "target": ">= 100,000",
                "note": note + f"; {r['n'] / r['e2e']:,.0f}/s counting interpreter start-up",
            },
            {
                "benchmark": "analyzer",
                "metric": "read (gunzip into line chunks)",
                "value": r["n"] / r["read"],
                "unit": "GPU-samples/s",
                "target": "",
                "note": f"{r['mb'] / r['read']:.0f} MB/s of line protocol out",
            },
            {
                "benchmark": "analyzer",
                "metric": f"parse ({r['engine']} tokenizer)",
                "value": r["n"] / r["parse"],
                "unit": "GPU-samples/s",
                "target": "",
                "note": f"{r['mb'] / r['parse']:.0f} MB/s",
            },
            {
                "benchmark": "analyzer",
                "metric": "parse (numpy tokenizer, the fallback without a compiler)",
                "value": r["n"] / r["parse_numpy"],
                "unit": "GPU-samples/s",
                "target": "",
                "note": f"{r['parse_numpy'] / r['parse']:.1f}x the time of the {r['engine']} tokenizer",
            },
            {
                "benchmark": "analyzer",
                "metric": "detection on parsed rows",
                "value": r["n"] / r["detect"],
                "unit": "GPU-samples/s",
                "target": ">= 500,000",
                "note": "windows, every detector, incident engine",
            },
            {
                "benchmark": "analyzer",
                "metric": "peak RSS of gpufleet analyze",
                "value": r["rss_mb"],
                "unit": "MiB",
                "target": "",
                "note": "bounded by window + lateness, not history",
            },
        ]
    return rows


if __name__ == "__main__":  # pragma: no cover
    import sys

    for row in run(quick="--quick" in sys.argv):
        print(row)
