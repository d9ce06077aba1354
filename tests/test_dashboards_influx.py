"""Every dashboard query, expanded as Grafana expands it, against a real InfluxDB 1.6.7.

A small fleet with faults (gpufleet.dashboards.sample: thermal throttling, NVLink errors, an ECC error
with XID 48, a GPU lost with XID 79, BMC, host, canary and the analyzer's incidents) is written
over /write; then each template variable query and each panel target runs over /query. Every
query must parse and succeed, every panel whose fields the data holds must return series, and
filters must select the right hosts and GPUs.
"""

from __future__ import annotations

import re

import pytest
from gpufleet.dashboards import generate, sample
from gpufleet.dashboards.expand import ALL
from gpufleet.dashboards.runner import Runner, influx_query_fn, parse

from gpufleet import catalogue
from tests.servers import InfluxDB1, skip_unless

pytestmark = skip_unless("influxd")

DB = "gpufleet"
START_NS = 1_790_000_000_000_000_000
DURATION_S = 1800
FROM_MS, TO_MS = START_NS // 1_000_000, START_NS // 1_000_000 + DURATION_S * 1000
DASHES = generate.build_all()

SELECTIONS = {
    "fleet-overview": [{}, {"cluster": ["west"]}],
    "node": [{"host": "node-e02"}, {"host": "node-e03", "gpu": ["1", "3"]}],
    "gpu": [
        {"host": "node-e02", "gpu": "2"},
        {"host": "node-w01", "gpu": "3"},
        {"host": "node-e03", "gpu": "1"},
    ],
    "incidents": [{}, {"kind": ["gpu_lost", "memory_errors"], "severity": ALL}],
}


@pytest.fixture(scope="module")
def influx(tmp_path_factory):
    with InfluxDB1(tmp_path_factory.mktemp("influx")) as server:
        server.create_db(DB)
        lines = sample.lines(START_NS, DURATION_S)
        for i in range(0, len(lines), 5000):
            server.write(DB, "\n".join(lines[i : i + 5000]))
        yield server


@pytest.fixture(scope="module")
def qf(influx):
    return influx_query_fn(influx.url, DB)


def present_fields(qf) -> set[tuple[str, str]]:
    err, series = parse(qf("SHOW FIELD KEYS"))
    assert err is None
    return {(s.name, row[0]) for s in series for row in s.values}


def catalogue_fields(query: str) -> set[tuple[str, str]]:
    """(measurement, field) pairs of the catalogue that a query names."""
    measurements = set(re.findall(r'FROM "(\w+)"', query))
    names = set(re.findall(r'"(\w+)"', query))
    return {(m, n) for m in measurements for n in names if (m, n) in catalogue.by_key()}


def run(qf, name, selection):
    return Runner(DASHES[name], qf, FROM_MS, TO_MS, selection)


def rows(res) -> list[dict]:
    return [dict(zip(s.columns, v, strict=True)) | s.tags for s in res.series for v in s.values]


def by_title(runner, title, ref="A"):
    for p, t, res in runner.run_all():
        if p["title"] == title and t["refId"] == ref:
            assert res.error is None, res.query
            return res
    raise KeyError(title)


@pytest.mark.parametrize("name", sorted(DASHES))
def test_every_query_runs_and_fills_its_panel(qf, name):
    have = present_fields(qf)
    filled: dict[tuple[int, str], bool] = {}
    expect_empty: dict[tuple[int, str], bool] = {}
    for sel in SELECTIONS[name]:
        r = run(qf, name, sel)
        for var, res in r.variable_results.items():
            assert res.error is None, (var, res.query, res.error)
            assert res.series, f"variable {var} has no values: {res.query}"
        for p, t, res in r.run_all():
            assert "$" not in res.query.replace("$/", "/"), f"unexpanded: {res.query}"
            assert res.error is None, f"{p['title']}: {res.error}\n{res.query}"
            key = (p["id"], t["refId"])
            filled[key] = filled.get(key, False) or any(s.values for s in res.series)
            names = catalogue_fields(t["query"])
            expect_empty[key] = bool(names) and not (names & have)
        for _a, res in r.annotations():
            assert res.error is None, res.query
    titles = {p["id"]: p["title"] for p in DASHES[name]["panels"]}
    empty = [f"{titles[k[0]]} [{k[1]}]" for k, ok in filled.items() if not ok and not expect_empty[k]]
    assert not empty, f"panels without data: {empty}"
    assert filled, "no targets ran"


def test_fleet_overview_numbers(qf):
    r = run(qf, "fleet-overview", {})
    assert rows(by_title(r, "GPUs expected"))[0]["expected"] == 16
    assert rows(by_title(r, "GPUs reporting"))[0]["reporting"] == 15  # node-e01 GPU 0 fell off the bus
    assert rows(by_title(r, "Incidents firing"))[0]["count"] == 4
    assert rows(by_title(r, "GPUs throttled now (thermal or power brake)"))[0]["sum"] == 1
    hottest = rows(by_title(r, "Top 10 hottest GPUs"))
    assert len(hottest) == 10
    top = max(hottest, key=lambda x: x["max temperature"])
    assert (top["host"], top["gpu"]) == sample.FAULTS.thermal[:1] + (str(sample.FAULTS.thermal[1]),)
    throttled = rows(by_title(r, "Top 10 most throttled GPUs (thermal + power brake)"))
    worst = max(throttled, key=lambda x: x["throttled"])
    assert (worst["host"], worst["gpu"]) == ("node-e02", "2") and worst["throttled"] > 60e9
    assert {x["code"] for x in rows(by_title(r, "XID and ECC events"))} == {48, 79}
    per_rack = {
        (x["cluster"], x["rack"]): x["expected"]
        for x in rows(by_title(r, "GPUs expected vs reporting, per cluster and rack"))
    }
    assert per_rack == {("east", "r01"): 8, ("east", "r02"): 4, ("west", "r11"): 4}
    healthy = rows(by_title(r, "Clock events: healthy (idle, SW power cap, sync boost)"))
    assert max(x["sw_power_cap"] for x in healthy) > 0.9 and 0.4 < max(x["idle"] for x in healthy) <= 0.5
    faults = rows(by_title(r, "Clock events: faults (thermal, power brake, HW slowdown)"))
    assert (
        0 < max(x["hw_thermal"] for x in faults) <= 1 / 15 and max(x["hw_power_brake"] for x in faults) == 0
    )
    ann = [rows(res) for _, res in r.annotations()][0]
    assert len(ann) == 5 and sum(1 for x in ann if x["end_ms"] is not None) == 1


def test_cluster_filter(qf):
    r = run(qf, "fleet-overview", {"cluster": ["west"]})
    assert r.options("rack") == ["r11"]
    assert {x["host"] for x in rows(by_title(r, "Top 10 hottest GPUs"))} == {"node-w01"}
    assert rows(by_title(r, "GPUs expected"))[0]["expected"] == 4
    assert {x["host"] for x in rows(by_title(r, "Open incidents"))} == {"node-w01"}


def test_node_filter_selects_the_right_gpus(qf):
    r = run(qf, "node", {"host": "node-e03", "gpu": ["1", "3"]})
    assert r.options("host") == ["node-e01", "node-e02", "node-e03", "node-w01"]
    res = by_title(r, "GPU utilization")
    assert sorted(s.tags["gpu"] for s in res.series) == ["1", "3"]
    assert '"host" =~ /^node-e03$/' in res.query and '"gpu" =~ /^(1|3)$/' in res.query
    host, gpu, link = sample.FAULTS.nvlink
    assert not any(x["errors"] for x in rows(by_title(r, "NVLink errors in range (GPU x link)")))
    matrix = rows(by_title(run(qf, "node", {"host": host}), "NVLink errors in range (GPU x link)"))
    nonzero = {(x["gpu"], x["link"]) for x in matrix if x["errors"]}
    assert nonzero == {(str(gpu), str(link))} and len(matrix) == 16
    th_host, th_gpu = sample.FAULTS.thermal
    reasons = {
        x["gpu"]: x
        for x in rows(by_title(run(qf, "node", {"host": th_host}), "Clock-event reasons in range, per GPU"))
    }
    assert {g for g, x in reasons.items() if x["hw_thermal"] > 0} == {str(th_gpu)}
    assert all(
        x["sw_power_cap"] > 0.5 and x["hw_power_brake"] == 0 for g, x in reasons.items() if g != str(th_gpu)
    )
    bmc = {x["sensor"]: x for x in rows(by_title(r, "BMC sensors (last reading)"))}
    assert bmc["Inlet Temp"]["unit"] == "C" and bmc["Fan1"]["unit"] == "RPM"


def test_gpu_dashboard_for_faulty_gpus(qf):
    r = run(qf, "gpu", {"host": "node-e02", "gpu": "2"})
    share = rows(by_title(r, "Throttle time (share of time, from the counters)"))
    assert 0.5 < max(x["throttle_hw_thermal_ns_total"] for x in share) <= 1.0
    assert max(x["throttle_sw_power_cap_ns_total"] for x in share) > 0.5
    temps = rows(by_title(r, "Temperature vs its thresholds"))
    assert {x["temperature_slowdown_celsius"] for x in temps} == {89}
    assert max(x["temperature_gpu_celsius"] for x in temps) >= 89
    kinds = {x["kind"] for x in rows(by_title(r, "Incidents of this GPU"))}
    assert kinds == {"thermal_throttle", "cooling_degradation"}
    r = run(qf, "gpu", {"host": "node-w01", "gpu": "3"})
    assert [x["code"] for x in rows(by_title(r, "XID and ECC events of this GPU"))] == [48]
    ecc = rows(by_title(r, "ECC errors (lifetime)"))
    assert max(x["ecc_uncorrected_aggregate_total"] for x in ecc) == 1


def test_incidents_dashboard_filters(qf):
    r = run(qf, "incidents", {})
    assert r.options("kind") == sorted(
        {"thermal_throttle", "cooling_degradation", "nvlink_degradation", "memory_errors", "gpu_lost"}
    )
    table = rows(by_title(r, "Incidents"))
    assert len(table) == 5 and {x["state"] for x in table} == {"firing", "resolved"}
    r = run(qf, "incidents", {"kind": ["gpu_lost", "memory_errors"]})
    assert sorted(x["kind"] for x in rows(by_title(r, "Incidents"))) == ["gpu_lost", "memory_errors"]
    assert rows(by_title(r, "Firing"))[0]["count"] == 2
    r = run(qf, "incidents", {"severity": ["warning"]})
    assert {x["kind"] for x in rows(by_title(r, "Incidents"))} == {
        "cooling_degradation",
        "nvlink_degradation",
    }


def test_resolved_incident_duration(qf):
    r = run(qf, "incidents", {})
    assert rows(by_title(r, "Median duration of resolved"))[0]["median"] == 342.0


def test_preview_renders_from_the_same_queries(qf, tmp_path):
    from gpufleet.dashboards.preview import render_all

    paths = render_all(
        qf, FROM_MS, TO_MS, tmp_path, {"gpu": {"host": "node-e02", "gpu": "2"}}, names=["incidents"]
    )
    assert [p.name for p in paths] == ["dash-incidents.png"]
    data = paths[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_gpm_margin_and_bandwidth_panels(qf):
    """The dcgm-exporter-style panels: SM/tensor/DRAM activity, NVLink and PCIe bandwidth, thermal margin."""
    th_host, th_gpu = sample.FAULTS.thermal
    r = run(qf, "node", {"host": th_host})
    sm = {s.tags["gpu"]: [v[1] for v in s.values if v[1] is not None]
          for s in by_title(r, "SM activity (GPM)").series}
    assert set(sm) == {"0", "1", "2", "3"} and all(max(v) > 0.9 for v in sm.values())
    margin = {
        s.tags["gpu"]: min(v[1] for v in s.values if v[1] is not None)
        for s in by_title(r, "Thermal margin (degrees to slowdown)").series
    }
    assert min(margin, key=margin.get) == str(th_gpu) and margin[str(th_gpu)] <= 0  # at its slowdown limit
    nv = [v[1] for s in by_title(r, "NVLink bandwidth (GPM, TX + RX)").series for v in s.values if v[1]]
    assert max(nv) == 2 * 4 * 6.5e9
    g = run(qf, "gpu", {"host": th_host, "gpu": str(th_gpu)})
    act = rows(by_title(g, "Activity (GPM): SM, tensor, DRAM"))
    assert max(x["tensor_active_ratio"] for x in act) > 0.9 and max(x["dram_active_ratio"] for x in act) < 0.2
    link = rows(by_title(g, "NVLink throughput per link"))
    assert {x["link"] for x in link} == {"0", "1", "2", "3"}
    tx = [x["tx_data_bytes_total"] for x in link if x["tx_data_bytes_total"] is not None]
    assert max(tx) == pytest.approx(6.5e9)
    pcie = rows(by_title(g, "PCIe link errors (rate)"))
    assert max(x["pcie_l0_to_recovery_total"] for x in pcie if x["pcie_l0_to_recovery_total"] is not None) > 0
