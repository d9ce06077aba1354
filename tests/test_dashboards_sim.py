"""The dashboards over the simulator's ``mixed`` fleet, replayed into a real InfluxDB 1.6.7.

``gpufleet sim --scenario mixed`` (4 nodes x 4 GPUs, 30 min) -> ``gpufleet replay`` over /write,
plus its truth written as the analyzer's ``incident`` measurement (the analyzer's own
``incident_lines``). Then every template variable and panel query, expanded as Grafana expands
it, must run without error, and every panel whose fields the fleet reports must get data
for at least one of the faulty hosts/GPUs.
"""

from __future__ import annotations

import json

import pytest
from gpufleet.dashboards import generate
from gpufleet.dashboards.runner import Runner, influx_query_fn, parse

from gpufleet import records
from gpufleet.cli import main
from tests.servers import InfluxDB1, skip_unless
from tests.test_dashboards_influx import catalogue_fields, present_fields

pytestmark = skip_unless("influxd")
DB = "gpufleet"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    out = d / "fleet"
    assert (
        main(
            [
                "sim",
                "--scenario",
                "mixed",
                "--nodes",
                "4",
                "--gpus-per-node",
                "4",
                "--duration",
                "30m",
                "--step",
                "10s",
                "--seed",
                "3",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    with InfluxDB1(d / "influx") as server:
        assert main(["replay", str(out), "--influx-url", server.url, "--influx-db", DB, "--no-progress"]) == 0
        truth = records.read(out / "truth.jsonl")
        for i, r in enumerate(truth):
            r.id = f"sim-{i:04d}"
            r.summary = f"{r.kind} on {r.host} GPU {r.gpu}: {r.detail}"
        if not any(r.end is not None for r in truth):  # a resolved incident, for the duration panels
            truth[0].end = truth[0].start + 600.0
        from gpufleet.analyzer.store import incident_lines

        server.write(DB, "\n".join(incident_lines(truth)))
        manifest = json.loads((out / "manifest.json").read_text())
        yield server, truth, manifest


def _ms(rfc3339: str) -> int:
    return int(records.from_rfc3339(rfc3339) * 1000)


def test_every_query_runs_on_the_simulated_fleet(fleet):
    server, truth, manifest = fleet
    qf = influx_query_fn(server.url, DB)
    have = present_fields(qf)
    from_ms, to_ms = _ms(manifest["start"]), _ms(manifest["end"])
    gpus = sorted({(r.host, str(r.gpu)) for r in truth if r.gpu is not None})
    hosts = sorted({h for h, _ in gpus})
    selections = {
        "fleet-overview": [{}],
        "incidents": [{}],
        "node": [{"host": h} for h in hosts],
        "gpu": [{"host": h, "gpu": g} for h, g in gpus],
    }
    for name, dash in generate.build_all().items():
        filled, expect_empty = {}, {}
        for sel in selections[name]:
            r = Runner(dash, qf, from_ms, to_ms, sel)
            for var, res in r.variable_results.items():
                assert res.error is None and res.series, (name, var, res.query)
            for p, t, res in r.run_all():
                assert res.error is None, f"{name} / {p['title']}: {res.error}\n{res.query}"
                key = (p["title"], t["refId"])
                filled[key] = filled.get(key, False) or any(s.values for s in res.series)
                names = catalogue_fields(t["query"])
                expect_empty[key] = bool(names) and not (names & have)
            for _a, res in r.annotations():
                assert res.error is None and res.series, res.query
        empty = [k for k, ok in filled.items() if not ok and not expect_empty[k]]
        assert not empty, f"{name}: panels without data: {empty}"


def test_simulated_faults_show_where_they_are(fleet):
    server, truth, manifest = fleet
    qf = influx_query_fn(server.url, DB)
    from_ms, to_ms = _ms(manifest["start"]), _ms(manifest["end"])
    r = Runner(generate.build_all()["fleet-overview"], qf, from_ms, to_ms)
    got = {p["title"]: res for p, t, res in r.run_all() if t["refId"] == "A"}
    assert got["GPUs expected"].series[0].values[0][1] == manifest["fleet"]["gpus"]
    lost = {(x.host, x.gpu) for x in truth if x.kind == "gpu_lost"}
    assert got["GPUs reporting"].series[0].values[0][1] <= manifest["fleet"]["gpus"] - len(lost)
    codes = {row[1] for s in got["XID and ECC events"].series for row in s.values}
    assert 79 in codes or not lost
    links = [x for x in truth if x.kind == "nvlink_degradation"]
    if links:
        node = Runner(generate.build_all()["node"], qf, from_ms, to_ms, {"host": links[0].host})
        res = next(
            res for p, _t, res in node.run_all() if p["title"] == "NVLink errors in range (GPU x link)"
        )
        bad = {(s.tags["gpu"], s.tags["link"]) for s in res.series if any(row[1] for row in s.values)}
        assert (str(links[0].gpu), str(links[0].link)) in bad
    err, series = parse(qf('SELECT count("id") FROM "incident"'))
    assert err is None and series[0].values[0][1] == len(truth)
