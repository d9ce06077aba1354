"""gpufleet replay into the real InfluxDB 1.6.7 (v1) and VictoriaMetrics (v2 write API)."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli import main
from gpufleet.sim import scenario as scen
from gpufleet.sim.engine import generate
from gpufleet.sim.fleet import Fleet
from tests.agent_support import wait_for
from tests.servers import skip_unless

ONE_FIELD = {
    "gpu": "up",
    "gpu_nvlink": "up",
    "gpu_canary": "passed",
    "gpu_event": "pci_bus_id",
    "host": "load1",
    "bmc_sensor": "value",
    "bmc": "power_watts",
}


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay") / "fleet"
    generate(
        Fleet(scen.load("chaos"), seed=5, duration=1800.0, step=10.0, nodes=8, gpus_per_node=4),
        out,
        progress=False,
    )
    return out


def counts(server, db: str) -> dict[str, int]:
    got = {}
    for meas, field in ONE_FIELD.items():
        res = server.query(f'SELECT count("{field}") FROM "{meas}"', db=db)["results"][0]
        series = res.get("series")
        got[meas] = series[0]["values"][0][1] if series else 0
    return got


@skip_unless("influxd")
def test_replay_v1_returns_every_point_and_resumes(influxdb, fleet_dir, capsys):
    manifest = json.loads((fleet_dir / "manifest.json").read_text())
    lines = manifest["telemetry"]["lines"]
    want = dict(lines)
    assert (
        main(
            [
                "replay",
                str(fleet_dir),
                "--influx-url",
                influxdb.url,
                "--influx-db",
                "fleet",
                "--batch",
                "700",
                "--no-progress",
            ]
        )
        == 0
    )
    assert counts(influxdb, "fleet") == {m: want.get(m, 0) for m in ONE_FIELD}
    state = list(fleet_dir.glob(".replay-*.json"))
    assert len(state) == 1
    total = sum(want.values())
    assert json.loads(state[0].read_text())["lines_done"] == total
    # a second run has nothing left to write; --restart writes everything again (idempotent points)
    assert (
        main(["replay", str(fleet_dir), "--influx-url", influxdb.url, "--influx-db", "fleet",
              "--no-progress"]) == 0
    )
    assert "0 lines written" in capsys.readouterr().out
    # an interrupted replay resumes from the stored position
    state[0].write_text(json.dumps({"lines_done": total - 1234}))
    assert (
        main(["replay", str(fleet_dir), "--influx-url", influxdb.url, "--influx-db", "fleet",
              "--no-progress"]) == 0
    )
    assert "1234 lines written" in capsys.readouterr().out
    assert counts(influxdb, "fleet") == {m: want.get(m, 0) for m in ONE_FIELD}
    # values survive the trip: a truth GPU's XID is in the database
    res = influxdb.query('SELECT "code" FROM "gpu_event"', db="fleet")["results"][0]["series"][0]["values"]
    assert {v[1] for v in res} & {48, 79, 64, 92}


@skip_unless("influxd")
def test_replay_bad_input(influxdb, fleet_dir, tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--influx-url", influxdb.url, "--influx-db", "x"]) == 2
    assert "not a simulator output" in capsys.readouterr().err
    assert main(["replay", str(fleet_dir), "--influx-url", "http://127.0.0.1:9", "--influx-db", "x"]) == 2
    assert "cannot reach" in capsys.readouterr().err
    assert main(["replay", str(fleet_dir), "--influx-url", influxdb.url]) == 2
    assert "--influx-db" in capsys.readouterr().err
    assert (
        main(["replay", str(fleet_dir), "--influx-url", influxdb.url, "--influx-db", "nodb",
              "--no-create-db"]) == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert (
        main(
            [
                "replay",
                str(fleet_dir),
                "--influx-url",
                influxdb.url,
                "--influx-api",
                "v2",
                "--influx-bucket",
                "b",
                "--influx-org",
                "o",
                "--influx-token-file",
                str(tmp_path / "missing"),
            ]
        )
        == 2
    )
    assert "token-file" in capsys.readouterr().err


@skip_unless("victoria-metrics")
def test_replay_v2_write_api(victoria, fleet_dir, tmp_path):
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    assert (
        main(
            [
                "replay",
                str(fleet_dir),
                "--influx-url",
                victoria.url,
                "--influx-api",
                "v2",
                "--influx-bucket",
                "b",
                "--influx-org",
                "o",
                "--influx-token-file",
                str(token),
                "--no-progress",
                "--restart",
            ]
        )
        == 0
    )
    manifest = json.loads((fleet_dir / "manifest.json").read_text())

    def stored():  # a new series can take seconds to be searchable, even after a flush
        got = victoria.export('{__name__="gpu_up"}')
        rows = sum(len(x["values"]) for x in got)
        full = len(got) >= manifest["fleet"]["gpus"] and rows >= manifest["telemetry"]["lines"]["gpu"]
        return got if full else None

    series = wait_for(stored, 30, 0.5) or victoria.export('{__name__="gpu_up"}')
    assert len(series) == manifest["fleet"]["gpus"]
    assert sum(len(s["values"]) for s in series) == manifest["telemetry"]["lines"]["gpu"]


@skip_unless("influxd")
def test_replay_speed_paces_by_data_time(influxdb, fleet_dir, tmp_path):
    import shutil
    import time

    copy = tmp_path / "copy"
    shutil.copytree(fleet_dir, copy)
    for f in copy.glob(".replay-*"):
        f.unlink()
    t0 = time.monotonic()
    # 30 minutes of data at 3600x real time: at least ~0.5 s of pacing
    assert (
        main(
            [
                "replay",
                str(copy),
                "--influx-url",
                influxdb.url,
                "--influx-db",
                "paced",
                "--speed",
                "3600",
                "--batch",
                "500",
                "--no-progress",
            ]
        )
        == 0
    )
    assert time.monotonic() - t0 >= 0.4
    assert main(["replay", str(copy), "--influx-url", influxdb.url, "--influx-db", "paced",
                 "--speed", "0"]) == 2
