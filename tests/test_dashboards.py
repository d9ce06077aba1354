"""Dashboards: generated JSON is current and well formed; Grafana's macro expansion; export CLI."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from gpufleet.dashboards import expand as ex
from gpufleet.dashboards import generate
from gpufleet.dashboards.assemble import UIDS
from gpufleet.dashboards.export import Settings, export
from gpufleet.dashboards.grafana_units import grafana_unit
from gpufleet.dashboards.influxql import field, incident_field, show_tag_values
from gpufleet.dashboards.runner import targets

from gpufleet import catalogue
from gpufleet.cli import main

DASHES = generate.build_all()
GRAFANA_UNITS = {
    "watt",
    "joule",
    "celsius",
    "rotmhz",
    "bytes",
    "Bps",  # data rate: bytes/sec (SI)
    "ns",
    "s",
    "none",
    "short",
    "percentunit",
    "cpm",
    "string",
}


def test_generate_check_cli(capsys):
    assert main(["dashboards", "generate", "--check"]) == 0


@pytest.mark.parametrize("name", sorted(DASHES))
def test_dashboard_structure(name):
    d = json.loads(generate.dumps(DASHES[name]))
    assert (
        d["schemaVersion"] >= 39 and d["uid"] == UIDS[name] and d["title"].startswith("gpufleet / ")
    )
    ids = [p["id"] for p in d["panels"]]
    titles = [p["title"] for p in d["panels"] if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], int] = {}
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1 and g["y"] >= 0, p[
            "title"
        ]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = p["id"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "influxdb", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit is None or unit in GRAFANA_UNITS, (p["title"], unit)
    for _, t in targets(d):
        assert t["datasource"] == {"type": "influxdb", "uid": "${datasource}"}
        assert t["rawQuery"] is True and t["resultFormat"] in ("time_series", "table")
        assert "SELECT" in t["query"] and " FROM " in t["query"]
        # InfluxQL only: nothing of Flux or SQL
        assert "|>" not in t["query"] and "from(bucket" not in t["query"]
    refs = [(p["id"], t["refId"]) for p, t in targets(d)]
    assert len(refs) == len(set(refs))
    variables = d["templating"]["list"]
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "influxdb"
    for v in variables[1:]:
        assert v["datasource"]["uid"] == "${datasource}"
        assert v["query"].startswith("SHOW TAG VALUES FROM ")
    ann = [a for a in d["annotations"]["list"] if not a.get("builtIn")]
    assert ann and all('FROM "incident"' in a["query"] and a["textColumn"] == "summary" for a in ann)
    for a in ann:
        assert a["target"]["query"] == a["query"] and a["target"]["timeEndColumn"] == "end_ms"
        assert a["datasource"]["uid"] == "${datasource}"


def test_variables_and_units():
    fleet = {v["name"] for v in DASHES["fleet-overview"]["templating"]["list"]}
    assert {"datasource", "cluster", "rack"} <= fleet
    for name in ("node", "gpu"):
        assert [v["name"] for v in DASHES[name]["templating"]["list"]] == [
            "datasource",
            "cluster",
            "rack",
            "host",
            "gpu",
        ]
    assert {v["name"] for v in DASHES["incidents"]["templating"]["list"]} == {
        "datasource",
        "kind",
        "severity",
        "cluster",
    }
    # every catalogue unit maps to a Grafana unit id
    for mt in catalogue.load():
        assert grafana_unit(mt) in GRAFANA_UNITS, mt.key
    expected = {
        ("gpu", "power_watts"): "watt",
        ("gpu", "temperature_gpu_celsius"): "celsius",
        ("gpu", "clock_sm_mhz"): "rotmhz",
        ("gpu", "memory_used_bytes"): "bytes",
        ("gpu", "utilization_gpu_ratio"): "percentunit",
        ("gpu", "energy_joules_total"): "joule",
        ("gpu_canary", "duration_seconds"): "s",
        ("gpu", "throttle_hw_thermal_ns_total"): "ns",
        ("gpu", "pcie_replay_total"): "short",
    }
    for key, unit in expected.items():
        assert grafana_unit(catalogue.by_key()[key]) == unit


def _panel(name, title):
    return next(p for p in DASHES[name]["panels"] if p["title"] == title)


def test_gpu_dashboard_shows_every_numeric_gpu_field():
    queries = " ".join(t["query"] for _, t in targets(DASHES["gpu"]))
    for mt in catalogue.fields("gpu"):
        assert f'"{mt.field}"' in queries, mt.field
    # counters as rates, throttle time as a share of time
    thr = _panel("gpu", "Throttle time (share of time, from the counters)")
    assert (
        'non_negative_derivative(last("throttle_hw_thermal_ns_total"), 1s) / 1000000000'
        in thr["targets"][0]["query"]
    )
    assert thr["fieldConfig"]["defaults"]["unit"] == "percentunit"


def test_temperature_thresholds_come_from_the_gpu():
    p = _panel("node", "GPU temperature vs its thresholds")
    b = p["targets"][1]["query"]
    assert '"temperature_slowdown_celsius"' in b and '"temperature_max_operating_celsius"' in b
    assert p["fieldConfig"]["overrides"][0]["matcher"]["options"] == "/max operating|slowdown/"


def test_throttle_breakdown_keeps_healthy_reasons_apart():
    healthy = _panel("fleet-overview", "Clock events: healthy (idle, SW power cap, sync boost)")["targets"][0]
    faults = _panel("fleet-overview", "Clock events: faults (thermal, power brake, HW slowdown)")["targets"][
        0
    ]
    assert "clock_event_idle" in healthy["query"] and "clock_event_sw_power_cap" in healthy["query"]
    assert "thermal" not in healthy["query"] and "brake" not in healthy["query"]
    assert "clock_event_hw_thermal" in faults["query"] and "clock_event_hw_power_brake" in faults["query"]
    assert "idle" not in faults["query"] and "power_cap" not in faults["query"]


def test_unknown_field_fails_generation():
    with pytest.raises(KeyError):
        field("gpu", "no_such_field")
    with pytest.raises(KeyError):
        incident_field("no_such_field")
    with pytest.raises(KeyError):
        show_tag_values("gpu", "no_such_tag")
    assert field("gpu", "power_watts") == '"power_watts"' and incident_field("kind") == '"kind"'


# ------------------------------------------------------------------ Grafana's expansion
def test_interval_rounding_and_format():
    assert ex.round_interval(1800) == 2000 and ex.round_interval(13000) == 15000
    assert ex.round_interval(86_400_000 * 2) == 86_400_000
    assert ex.format_interval(15000) == "15s" and ex.format_interval(120000) == "2m"
    assert ex.format_interval(500) == "500ms" and ex.format_interval(3_600_000 * 36) == "1d"
    # 6 h over 1000 points = 21.6 s -> 20s; 30 min -> 1.8 s -> 2s, raised to the 10s minimum
    assert ex.interval_ms(0, 6 * 3_600_000, 1000) == 20000
    assert ex.interval_ms(0, 1_800_000, 1000, "10s") == 10000


def test_expand_variables_like_grafana():
    ctx = ex.Context(
        1_000,
        61_000,
        {
            "host": ex.Var("host", ["node-a.1", "node/b"], multi=True, include_all=True, all_value=".*"),
            "rack": ex.Var("rack", ex.ALL, multi=True, include_all=True, all_value=".*"),
            "cluster": ex.Var("cluster", ex.ALL, multi=True, include_all=True, options=["east", "we$t"]),
            "gpu": ex.Var("gpu", "3"),
            "one": ex.Var("one", "a.b"),
        },
        min_interval=None,
    )
    q = (
        'SELECT mean("x") FROM "gpu" WHERE $timeFilter AND "host" =~ /^$host$/ AND "rack" =~ /^${rack}$/ '
        'AND "cluster" =~ /^[[cluster]]$/ AND "gpu" = \'$gpu\' AND "h" =~ /^${one:regex}$/ '
        "GROUP BY time($__interval) LIMIT $__interval_ms"
    )
    out = ex.expand(q, ctx)
    assert "time >= 1000ms and time <= 61000ms" in out
    assert r'"host" =~ /^(node-a\.1|node\/b)$/' in out  # multi-value: escaped, (a|b)
    assert '"rack" =~ /^.*$/' in out  # custom all value, unescaped
    assert r'"cluster" =~ /^(east|we\$t)$/' in out  # all values, escaped
    assert "\"gpu\" = '3'" in out and r'"h" =~ /^a\.b$/' in out
    assert "GROUP BY time(50ms)" in out and "LIMIT 50" in out  # 60 s / 1000 = 60 ms -> 50 ms
    assert not re.search(r"\$\{?\w", out.replace(r"\$", ""))  # nothing left unexpanded


def test_expand_uses_panel_min_interval_and_to():
    ctx = ex.Context(0, 3_600_000, {})
    assert (
        ex.expand("time >= ${__to}ms - 2m GROUP BY time($interval)", ctx, "1m")
        == "time >= 3600000ms - 2m GROUP BY time(1m)"
    )


# ------------------------------------------------------------------ export
def test_export_writes_provisioning_with_names(tmp_path):
    out = tmp_path / "grafana"
    rc = main(
        [
            "dashboards",
            "export",
            "--out",
            str(out),
            "--influx-api",
            "v1",
            "--datasource",
            "Fleet Influx",
            "--datasource-uid",
            "fleet-influx",
            "--influx-url",
            "http://influx.internal:8086",
            "--influx-db",
            "telemetry",
            "--influx-user",
            "grafana_ro",
            "--org-id",
            "3",
            "--folder",
            "GPU fleet",
            "--dashboards-path",
            "/srv/grafana/gpufleet",
        ]
    )
    assert rc == 0
    ds = yaml.safe_load((out / "provisioning/datasources/gpufleet.yaml").read_text())
    d = ds["datasources"][0]
    assert ds["apiVersion"] == 1 and d["type"] == "influxdb" and d["name"] == "Fleet Influx"
    assert d["uid"] == "fleet-influx" and d["url"] == "http://influx.internal:8086" and d["orgId"] == 3
    assert d["user"] == "grafana_ro" and d["jsonData"]["dbName"] == "telemetry"
    assert d["jsonData"]["timeInterval"] == "10s"
    assert d["secureJsonData"]["password"] == "$GPUFLEET_INFLUX_PASSWORD"  # from Grafana's environment
    prov = yaml.safe_load((out / "provisioning/dashboards/gpufleet.yaml").read_text())["providers"][0]
    assert prov["type"] == "file" and prov["folder"] == "GPU fleet" and prov["orgId"] == 3
    assert prov["options"]["path"] == "/srv/grafana/gpufleet"
    for name in DASHES:
        dash = json.loads((out / "dashboards" / f"{name}.json").read_text())
        assert dash["templating"]["list"][0]["current"]["value"] == "fleet-influx"


def test_export_influx2_uses_token_header(tmp_path):
    assert main(["dashboards", "export", "--out", str(tmp_path), "--influx-api", "v2",
                 "--influx-db", "fleet"]) == 0
    text = (tmp_path / "provisioning/datasources/gpufleet.yaml").read_text()
    d = yaml.safe_load(text)["datasources"][0]
    assert d["jsonData"]["version"] == "InfluxQL" and d["jsonData"]["dbName"] == "fleet"
    assert d["jsonData"]["httpHeaderName1"] == "Authorization"
    assert d["secureJsonData"]["httpHeaderValue1"] == "Token ${GPUFLEET_INFLUX_TOKEN}"
    assert "user" not in d and "password" not in text.lower().replace("# ", "")


@pytest.mark.parametrize(
    "args",
    [
        ["--influx-db", "bad name!"],
        ["--datasource", "x\ny"],
        ["--influx-url", "ftp://x"],
        ["--datasource-uid", "a" * 41],
        ["--folder", "../etc"],
        ["--min-interval", "0s"],
        ["--org-id", "0"],
        ["--dashboards-path", "relative/dir"],
    ],
)
def test_export_rejects_invalid_names(tmp_path, capsys, args):
    rc = main(["dashboards", "export", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpufleet: error: invalid ") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_export_unwritable_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["dashboards", "export", "--out", str(blocker / "sub")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpufleet: error: cannot write to ") and err.count("\n") == 1


def test_export_api_validates(tmp_path):
    from gpufleet.errors import GpufleetError

    with pytest.raises(GpufleetError):
        export(tmp_path, Settings(influx="4"))
    assert re.fullmatch(r"[\w.-]+", Settings().uid)


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu", "node-01"],
        ["--gpu", "node-01/x"],
        ["--start", "5", "--end", "5"],
        ["--start", "yesterday"],
    ],
)
def test_preview_rejects_bad_arguments(tmp_path, capsys, args):
    base = {"--start": "0", "--end": "1"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    argv = ["dashboards", "preview", "--influx-url", "http://127.0.0.1:9", "--out", str(tmp_path)]
    rc = main(argv + [x for kv in base.items() for x in kv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpufleet: error: ") and err.count("\n") == 1


def test_preview_unreachable_influx_is_one_line(tmp_path, capsys):
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    rc = main(
        [
            "dashboards",
            "preview",
            "--influx-url",
            url,
            "--start",
            "0",
            "--end",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "did not answer" in err and err.count("\n") == 1
