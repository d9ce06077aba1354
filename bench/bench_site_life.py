"""A site's life at scale (issue 29): ``python -m bench.run --only site_life``.

Healthy fleets with every nuisance on (the ``healthy`` scenario: a quarter of the nodes A100s among
H200s, operator power caps, maintenance drains, job restarts, a warm rack, inlet drift, power
capping, missing samples) on fresh seeds until ``GPUFLEET_BENCH_HEALTHY_GPU_DAYS`` (1000) GPU-days
are analysed: false incidents per 1000 GPU-days (every page, since no fault is injected) and the
informational records written (never paged). Then ``chaos`` fleets (faults of every kind beside
the same site life plus driver reloads, agent restarts, late batches, node churn) on fresh seeds:
strict one-page-per-fault precision and recall per kind, pooled. Each fleet is simulated at the
agent's cadences (10 s poll, 60 s slow fields, 30 s NVLink), analysed from its file and scored by
``gpufleet eval``'s rules (GPU-days counted from the GPU rows present), in worker processes
(``GPUFLEET_BENCH_JOBS``, default every core), its files deleted once scored.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from bench import sim

HEALTHY = (32, "6h")  # nodes of 8 GPUs, duration: 64 GPU-days a fleet
CHAOS = (16, "6h")


def _one(scenario: str, nodes: int, duration: str, seed: int, tmp: str) -> dict:
    """Simulate, analyse and score one fleet; its files are deleted. Returns the scores and the
    records (as JSON lines) to pool."""
    from gpufleet.analyzer.evaluate import evaluate, gpu_days_from_data
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import read_chunks

    from gpufleet import records

    d = Path(tmp) / f"{scenario}-{seed}"
    t0 = time.process_time()
    try:
        sim(d, scenario, nodes, duration, seed, level=1)
        an = Analyzer()
        for c in read_chunks(d / "telemetry.lp.gz"):
            an.feed_bytes(c)
        an.finish()
        incs = an.incidents()
        truth = records.read(d / "truth.jsonl")
        res = evaluate(truth, incs, gpu_days_from_data(d / "telemetry.lp.gz"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "scenario": scenario, "seed": seed, "gpus": nodes * 8, "duration": duration,
        "gpu_days": res["gpu_days"] or 0.0,
        "false": res["false_incidents"], "notes": res["notes"], "cpu_s": time.process_time() - t0,
        "truth": [r.to_json() for r in truth], "incidents": [r.to_json() for r in incs],
        "false_pages": [r.summary for r in incs if r.severity != "info"] if not truth else [],
    }


def run(quick: bool) -> list[dict]:
    need = 40.0 if quick else float(os.environ.get("GPUFLEET_BENCH_HEALTHY_GPU_DAYS", "1000"))
    chaos_runs = 1 if quick else int(os.environ.get("GPUFLEET_BENCH_CHAOS_RUNS", "4"))
    hn, hd = (8, "6h") if quick else HEALTHY
    cn, cd = (8, "3h") if quick else CHAOS
    per_fleet = hn * 8 * _hours(hd) / 24
    jobs = int(os.environ.get("GPUFLEET_BENCH_JOBS", str(os.cpu_count() or 1)))
    # each fleet's result is appended here as it lands (a run cut short still says what it measured:
    # ``python -m bench.bench_site_life --summarize FILE``)
    log = Path(os.environ["GPUFLEET_BENCH_RESULTS"]) if os.environ.get("GPUFLEET_BENCH_RESULTS") else None
    t0 = time.time()
    done: list[dict] = []

    def seed():
        return secrets.randbelow(2**31)

    def keep(r):
        done.append(r)
        if log is not None:
            with log.open("a") as f:
                f.write(json.dumps({**r, "wall_s": round(time.time() - t0, 1), "jobs": jobs}) + "\n")

    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(max_workers=jobs) as pool:
        n_healthy = max(1, int(-(-need // per_fleet)))  # nominal GPU-days; topped up below if short
        # chaos fleets spread among the healthy ones
        plan = [("healthy", hn, hd)] * n_healthy
        for i in range(chaos_runs):
            plan.insert(min(len(plan), i * (n_healthy // max(chaos_runs, 1) + 1)), ("chaos", cn, cd))
        futs = [pool.submit(_one, sc, n, dur, seed(), tmp) for sc, n, dur in plan]
        for f in as_completed(futs):
            keep(f.result())
        while sum(r["gpu_days"] for r in done if r["scenario"] == "healthy") < need:
            keep(_one("healthy", hn, hd, seed(), tmp))
    return summarize(done, time.time() - t0, jobs)


def summarize(done: list[dict], wall: float, jobs: int) -> list[dict]:
    """The table's rows from the fleets' results (``_one``)."""
    from gpufleet.analyzer.evaluate import evaluate

    from gpufleet.records import Record

    healthy = [r for r in done if r["scenario"] == "healthy"]
    chaos = [r for r in done if r["scenario"] == "chaos"]
    days = sum(r["gpu_days"] for r in healthy)
    false = sum(r["false"] for r in healthy)
    notes: dict[str, int] = {}
    for r in healthy:
        for k, n in r["notes"].items():
            notes[k] = notes.get(k, 0) + n
        for s in r["false_pages"]:
            print(f"healthy seed {r['seed']}: false page: {s}")
    cpu = sum(r["cpu_s"] for r in done)
    shape = sorted({f"{r['gpus']} GPUs x {r['duration']}" for r in healthy})
    rows = [
        {
            "benchmark": "site_life/healthy",
            "metric": "false incidents per 1000 GPU-days",
            "value": round(false / days * 1000, 3) if days else None,
            "unit": "1/1000 GPU-days",
            "target": "<= 0.2",
            "note": f"{false} false incidents in {days:.0f} GPU-days (GPU rows present): {len(healthy)} "
            f"fleets of {', '.join(shape)}, every nuisance on, seeds "
            f"{', '.join(str(r['seed']) for r in healthy)}",
        },
        {
            "benchmark": "site_life/healthy",
            "metric": "informational records (never paged)",
            "value": sum(notes.values()),
            "unit": "records",
            "target": "<= 1 per node or rack",
            "note": (", ".join(f"{k} {n}" for k, n in sorted(notes.items())) or "none")
            + f"; each fleet has 2 power caps and 1 warm rack ({len(healthy)} fleets)",
        },
    ]
    pooled_truth: list[Record] = []
    pooled_inc: list[Record] = []
    for r in chaos:
        for kind, lines in (("truth", pooled_truth), ("incidents", pooled_inc)):
            for line in r[kind]:
                rec = Record.from_dict(json.loads(line))
                # places made distinct per run (the same host names recur)
                rec.host = None if rec.host is None else f"{r['seed']}/{rec.host}"
                rec.rack = None if rec.rack is None else f"{r['seed']}/{rec.rack}"
                lines.append(rec)
    if chaos:
        cshape = sorted({f"{r['gpus']} GPUs x {r['duration']}" for r in chaos})
        pooled = evaluate(pooled_truth, pooled_inc)
        for kind, dk in pooled["per_kind"].items():
            rows.append(
                {
                    "benchmark": "site_life/chaos",
                    "metric": f"{kind}: precision / recall (one-to-one)",
                    "value": f"{dk['precision']} / {dk['recall']}",
                    "unit": "",
                    "target": ">= 0.97",
                    "note": f"{dk['truths']} faults, {dk['incidents']} incidents, "
                    f"{dk['duplicates']} duplicate pages",
                }
            )
        rows.append(
            {
                "benchmark": "site_life/chaos",
                "metric": "overall precision / recall / F1",
                "value": f"{pooled['precision']} / {pooled['recall']} / {pooled['f1']}",
                "unit": "",
                "target": ">= 0.97",
                "note": f"{len(chaos)} fleets of {', '.join(cshape)}, "
                f"{sum(r['gpu_days'] for r in chaos):.0f} GPU-days, seeds "
                f"{', '.join(str(r['seed']) for r in chaos)}; informational records "
                f"{sum(sum(r['notes'].values()) for r in chaos)} (not scored)",
            }
        )
    rows.append(
        {
            "benchmark": "site_life",
            "metric": "time",
            "value": round(wall),
            "unit": "s wall",
            "target": "",
            "note": f"{jobs} worker processes, {cpu:.0f} CPU-s in all ({cpu / max(days, 1):.2f} CPU-s per "
            "healthy GPU-day, simulation and analysis)",
        }
    )
    return rows


def _hours(duration: str) -> float:
    from gpufleet.units import parse_duration

    return parse_duration(duration) / 3600.0


if __name__ == "__main__":  # pragma: no cover
    import sys

    if sys.argv[1:2] == ["--summarize"]:  # the rows of a results file, complete or cut short
        got = [json.loads(x) for x in Path(sys.argv[2]).read_text().splitlines() if x.strip()]
        from bench.run import table

        print(table(summarize(got, max((r["wall_s"] for r in got), default=0), got[0]["jobs"] if got else 0)))
    else:
        for row in run(quick="--quick" in sys.argv):
            print(row)
