"""The analyzer on the simulator's scenarios: a small suite.

CI runs one fixed seed so that a commit's result is reproducible; ``GPUFLEET_TEST_SEED=random``
draws a fresh one (ten fresh seeds in a row passed when this was written), any number replays
that seed. Fresh seeds every run, on larger fleets, are bench/bench_analyzer.py's job.

Thresholds sit a notch below the targets (0.95 precision and recall per kind, 0.8 for
cooling_degradation; at most 0.5 false incidents per 1000 GPU-days on healthy and chaos). A failure
names its seed; set
GPUFLEET_TEST_SEED to replay it. The full suite and its table are in bench/bench_analyzer.py.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3

import pytest
from gpufleet.analyzer.evaluate import matches

from gpufleet import records
from gpufleet.cli import main

SUITE = [("mixed", 8, "3h"), ("chaos", 16, "3h"), ("thermal", 16, "3h"), ("healthy", 16, "3h"),
         ("thermal", 8, "3h")]  # 8 nodes: two racks (a rack inlet rise moves half the fleet)


def _seed() -> int:
    seed = os.environ.get("GPUFLEET_TEST_SEED", "20261126")
    return secrets.randbelow(2**31) if seed == "random" else int(seed)


@pytest.mark.slow
@pytest.mark.parametrize("scenario,nodes,duration", SUITE, ids=[f"{s[0]}-{s[1]}" for s in SUITE])
def test_scenario_scores(scenario, nodes, duration, tmp_path, capsys):
    seed = _seed()
    out = tmp_path / "sim"
    assert main(["sim", "--nodes", str(nodes), "--duration", duration, "--step", "10s", "--seed", str(seed),
                 "--scenario", scenario, "--out", str(out)]) == 0
    inc = tmp_path / "incidents.jsonl"
    assert main(["analyze", "--input", str(out / "telemetry.lp.gz"), "--out", str(inc)]) == 0
    capsys.readouterr()
    assert main(["eval", "--truth", str(out / "truth.jsonl"), "--incidents", str(inc), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    where = f"{scenario} seed {seed} (GPUFLEET_TEST_SEED={seed} to replay): {json.dumps(res['per_kind'])}"
    for kind, d in res["per_kind"].items():
        # cooling_degradation (node/rack scope in fleets of a few racks) is the weakest kind yet
        bar = 0.8 if kind == "cooling_degradation" else 0.95
        assert d["precision"] >= bar and d["recall"] >= bar, f"{kind}: {where}"
    if scenario == "thermal":
        # cooling faults flagged before they throttle (a sudden loss: dated to the last normal poll)
        assert res["cooling_before_impact"] >= 0.8, where
    if scenario in ("healthy", "chaos"):
        assert res["false_per_1000_gpu_days"] <= 0.5, where
    # hard faults: found within one poll of the data showing them (impact_at: the first mismatching
    # canary, the XID, the DBE)
    truth, incs = records.read(out / "truth.jsonl"), records.read(inc)
    for t in truth:
        if t.kind in ("sdc", "gpu_lost") or (t.kind == "memory_errors" and t.severity == "critical"):
            first = min((i.start for i in incs if matches(i, t)), default=None)
            if first is not None and t.impact_at is not None:
                # a DBE fault announces itself with single-bit errors that ramp up: allow a minute
                limit = 60.0 if t.kind == "memory_errors" else 10.0
                assert first - t.impact_at <= limit, f"{t.kind} {t.host}/{t.gpu}: {where}"


@pytest.mark.slow
def test_online_pages_each_fault_once(tmp_path):
    """Online, the analysis runs as the data arrives and the notifier sees every pass: a fault
    pages once, as in batch (an acute heat-sink loss throttles at once and is paged; the cooling
    incident that opens minutes later, and throttling after it, are that page's update)."""
    from gpufleet.analyzer.alerting import Notifier, load_sinks
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import read_chunks

    from tests.alerting_receiver import Receiver, fast

    seed = _seed()
    out = tmp_path / "sim"
    assert main(["sim", "--nodes", "16", "--duration", "3h", "--step", "10s", "--seed", str(seed),
                 "--scenario", "thermal", "--out", str(out), "--no-progress"]) == 0
    an = Analyzer()
    with Receiver() as rx:
        with Notifier(load_sinks([fast({"type": "webhook", "url": rx.url + "/hook"})], []),
                      tmp_path / "state.db") as n:
            for chunk in read_chunks(out / "telemetry.lp.gz", chunk=1 << 20):
                an.feed_bytes(chunk)
                n.update(an.incidents() + an.engine.absorbed)
            an.finish()
            n.update(an.incidents() + an.engine.absorbed)
            assert n.flush(10)
        pages = [r["json"] for r in rx.requests if r["json"]["status"] == "firing"]
    # informational records (a rack's inlet steady above the room, say) are written, never paged
    batch = [r for r in an.incidents() if r.severity != "info"]
    where = f"thermal seed {seed}: pages {[(p['kind'], p['host'], p['gpu']) for p in pages]}"
    assert not [p for p in pages if p["severity"] == "info"], where
    assert any(r.evidence.get("impact") for r in batch), "the scenario's throttling folds into cooling"
    assert len(pages) == len(batch), where
    # each batch incident is a member of its own page's group (the notifier's state file)
    with sqlite3.connect(tmp_path / "state.db") as db:
        group = dict(db.execute("SELECT key, grp FROM incident").fetchall())
    assert {group.get(r.id) for r in batch} == {p["key"] for p in pages}, where
