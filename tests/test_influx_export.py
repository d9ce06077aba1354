"""The influx exporter against real servers: InfluxDB 1.6.7 (v1 /write) and VictoriaMetrics (v2 API).

The agent runs as a real process with the sim backend and both the file and the influx
exporters; the file exporter's rows are what the agent produced, and every one of them must be
in the server with exactly its values (ints stay ints, floats stay floats, strings exact).
"""

from __future__ import annotations

import time

from tests.agent_support import compare, read_lp_dir, start_agent, stop_agent, wait_for
from tests.servers import skip_unless

pytestmark = skip_unless("influxd")

HOSTILE = {
    "cluster": 'a b,c=d"e',
    "rack": "rack\\7 ünïcødé ☃",
    "room": "x=y,z 'q' \"w\"",
}


def _run(tmp_path, server_args, ticks, host="node-1", labels=None):
    """Run an agent (1 s polls) until its file exporter holds ``ticks`` GPU polls (at most 60 s:
    a loaded machine starts it slowly), then stop it; every point it wrote."""
    labels = labels or {"cluster": "c1", "rack": "r1"}
    args = ["--backend", "sim", "--interval", "1", "--exporter", "file", "--exporter", "influx",
            "--file-dir", str(tmp_path / "lp"), "--spool-dir", str(tmp_path / "spool"), "--host", host,
            *server_args]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    proc = start_agent(tmp_path, *args)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (tmp_path / "lp").is_dir():
            polls = {p.time for p in read_lp_dir(tmp_path / "lp") if p.measurement == "gpu"}
            if len(polls) >= ticks:
                break
        time.sleep(0.2)
    rc = stop_agent(proc)
    assert rc == 0, (tmp_path / "agent.log").read_text()
    return read_lp_dir(tmp_path / "lp")


def test_v1_every_point_read_back_value_by_value(tmp_path, influxdb):
    influxdb.create_db("fleet")
    points = _run(tmp_path, ["--influx-url", influxdb.url, "--influx-api", "v1", "--influx-db", "fleet"], 3)
    gpu = [p for p in points if p.measurement == "gpu"]
    assert len({p.time for p in gpu}) >= 3
    assert {p.tags["gpu"] for p in gpu} == {str(i) for i in range(8)}
    assert all(p.tags["host"] == "node-1" and p.tags["cluster"] == "c1" for p in gpu)
    assert {p.measurement for p in points} >= {"gpu", "gpu_nvlink", "host", "gpufleet_collector"}
    assert isinstance(gpu[0].fields["temperature_gpu_celsius"], int)
    assert isinstance(gpu[0].fields["power_watts"], float)
    assert compare(points, influxdb, "fleet") == len(points)
    # self-telemetry arrives like everything else
    agent_rows = influxdb.query('SELECT spool_points, retries_total FROM gpufleet_agent', db="fleet")
    assert agent_rows["results"][0]["series"][0]["values"]


def test_hostile_labels_round_trip_exactly(tmp_path, influxdb):
    influxdb.create_db("fleet")
    # (the host tag itself must be a plain node name: the agent refuses another, tests/test_hosts.py)
    host = "node-1.rack_2"
    points = _run(tmp_path, ["--influx-url", influxdb.url, "--influx-db", "fleet"], 2, host=host,
                  labels=HOSTILE)
    assert points
    assert all(p.tags["host"] == host for p in points)
    assert all(p.tags[k] == v for p in points for k, v in HOSTILE.items())
    assert compare(points, influxdb, "fleet") == len(points)
    q = 'SHOW TAG VALUES FROM "gpu" WITH KEY IN ("host", "rack", "cluster", "room")'
    res = influxdb.query(q, db="fleet")
    got = {(k, v) for k, v in res["results"][0]["series"][0]["values"]}
    assert got == {("host", host), *HOSTILE.items()}


def test_v2_into_victoriametrics(tmp_path, victoria):
    token = tmp_path / "token"
    token.write_text("secret-token-value\n")
    points = _run(tmp_path, ["--influx-url", victoria.url, "--influx-api", "v2", "--influx-bucket", "b",
                             "--influx-org", "o", "--influx-token-file", str(token)], 3)
    assert "secret-token-value" not in (tmp_path / "agent.log").read_text()
    want = {}
    for p in points:
        if p.measurement != "gpu":
            continue
        for f in ("power_watts", "temperature_gpu_celsius", "memory_used_bytes"):
            want[(f, p.tags["gpu"], p.time // 1_000_000)] = float(p.fields[f])
    assert want

    def fetch():
        got = {}
        for s in victoria.export('{__name__=~"gpu_(power_watts|temperature_gpu_celsius|memory_used_bytes)"}'):
            f = s["metric"]["__name__"][len("gpu_"):]
            assert s["metric"]["host"] == "node-1" and s["metric"]["cluster"] == "c1"
            for v, t in zip(s["values"], s["timestamps"], strict=True):
                got[(f, s["metric"]["gpu"], t)] = float(v)
        return got if len(got) >= len(want) else None

    got = wait_for(fetch, 15, 0.5)
    assert got, "VictoriaMetrics did not get the points"
    for k, v in want.items():
        assert got.get(k) == v, (k, v, got.get(k))
