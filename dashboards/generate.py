# ruff: noqa: E501  (InfluxQL text reads best unbroken; the rest keeps to 110 columns)
"""Grafana dashboards generated from the metric catalogue (dashboards as code, plain data).

Four dashboards over InfluxQL (the query language InfluxDB 1.x, 2.x and 3.x all answer):
``fleet-overview``, ``node``, ``gpu`` and ``incidents``. Every field a query names is looked
up in ``gpufleet/catalogue.toml`` (a renamed field fails generation), units come from the
catalogue's UCUM units, and the GPU dashboard shows every numeric ``gpu`` field of the
catalogue. ``build_all()`` returns the dashboards; ``python -m gpufleet.dashboards.generate`` rewrites
``dashboards/grafana/*.json`` (the committed files are this module's output; a test checks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpufleet import catalogue

SCHEMA_VERSION = 39
GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
DS = {"type": "influxdb", "uid": "${datasource}"}
TAGS = ["gpufleet"]
UIDS = {
    "fleet-overview": "gpufleet-fleet",
    "node": "gpufleet-node",
    "gpu": "gpufleet-gpu",
    "incidents": "gpufleet-incidents",
}

# UCUM unit of the catalogue -> Grafana unit id (public/app/.../valueFormats/categories.ts)
UCUM_TO_GRAFANA = {
    "W": "watt",
    "J": "joule",
    "Cel": "celsius",
    "MHz": "rotmhz",
    "By": "bytes",
    "By/s": "Bps",
    "ns": "ns",
    "s": "s",
    "1": "none",
}
# A counter's rate: UCUM unit -> (per, divisor, Grafana unit of the rate)
RATE_UNITS = {
    "J": ("1s", 1, "watt"),  # J/s is W
    "By": ("1s", 1, "Bps"),  # bytes per second
    "ns": ("1s", 1_000_000_000, "percentunit"),  # ns of throttling per s = share of time
}


def grafana_unit(metric: catalogue.Metric) -> str:
    if metric.unit == "1" and metric.field.endswith("_ratio"):
        return "percentunit"
    if metric.unit.startswith("{"):
        return "short"  # annotations such as {error}, {page}: plain counts
    return UCUM_TO_GRAFANA[metric.unit]


def rate_unit(metric: catalogue.Metric) -> tuple[str, int, str]:
    """How a counter is shown as a rate: (derivative unit, divisor, Grafana unit)."""
    if metric.unit in RATE_UNITS:
        return RATE_UNITS[metric.unit]
    return ("1m", 1, "cpm")  # counts per minute


def f(measurement: str, name: str) -> str:
    """A catalogue field, double-quoted for InfluxQL; unknown fields fail generation."""
    if (measurement, name) not in catalogue.by_key():
        raise KeyError(f"{measurement}.{name} is not in the catalogue")
    return f'"{name}"'


def m(measurement: str) -> str:
    if measurement != "incident" and measurement not in catalogue.measurements():
        raise KeyError(f"measurement {measurement} is not in the catalogue")
    return f'"{measurement}"'


def metric(measurement: str, name: str) -> catalogue.Metric:
    return catalogue.by_key()[(measurement, name)]


# Filters: a tag matched against a (possibly multi-valued) variable, Grafana's regex idiom.
def rx(tag: str, var: str | None = None) -> str:
    return f'"{tag}" =~ /^${var or tag}$/'


FLEET = f"{rx('cluster')} AND {rx('rack')}"
NODE = f"{rx('cluster')} AND {rx('rack')} AND {rx('host')}"
LAST_2M = "time >= ${__to}ms - 2m AND time <= ${__to}ms"
# Clock-event bits that mean a fault (power capping and idle are healthy)
THROTTLE_BITS = ("clock_event_sw_thermal", "clock_event_hw_thermal", "clock_event_hw_power_brake")

# The analyzer's incident measurement (documented with the catalogue in docs/schema.md).
INCIDENT_TAGS = catalogue.incident().tags
INCIDENT_FIELDS = tuple(x[0] for x in catalogue.incident().fields)


def fi(name: str) -> str:
    if name not in INCIDENT_FIELDS + INCIDENT_TAGS:
        raise KeyError(f"incident.{name} is not in the incident schema")
    return f'"{name}"'


# ------------------------------------------------------------------------------ building blocks
def target(query: str, ref: str = "A", alias: str | None = None, fmt: str = "time_series") -> dict:
    t = {
        "datasource": DS,
        "refId": ref,
        "query": " ".join(query.split()),
        "rawQuery": True,
        "resultFormat": fmt,
    }
    if alias:
        t["alias"] = alias
    return t


def overrides_dashed(regex: str, color: str = "red") -> dict:
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.lineWidth", "value": 2},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": color}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }


def panel(
    ptype: str,
    title: str,
    targets: list[dict],
    w: int,
    h: int,
    unit: str | None = None,
    description: str = "",
    options: dict | None = None,
    overrides: list | None = None,
    custom: dict | None = None,
    transformations: list | None = None,
    thresholds: list | None = None,
    decimals: int | None = None,
    **extra,
) -> dict:
    defaults: dict = {}
    if unit:
        defaults["unit"] = unit
    if decimals is not None:
        defaults["decimals"] = decimals
    if custom:
        defaults["custom"] = custom
    defaults["thresholds"] = {"mode": "absolute", "steps": thresholds or [{"color": "green", "value": None}]}
    p = {
        "type": ptype,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    if transformations:
        p["transformations"] = transformations
    p.update(extra)
    return p


def timeseries(title, targets, w=12, h=8, unit=None, stack=False, bars=False, legend="list", **kw):
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 20 if stack else 0,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    options = {
        "legend": {"displayMode": legend, "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, targets, w, h, unit=unit, custom=custom, options=options, **kw)


def stat(title, targets, w=4, h=4, unit=None, thresholds=None, **kw):
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if thresholds else "value",
        "graphMode": "none",
        "textMode": "auto",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return panel("stat", title, targets, w, h, unit=unit, options=options, thresholds=thresholds, **kw)


def table(title, targets, w=12, h=8, sort: str | None = None, **kw):
    options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    if sort:
        options["sortBy"] = [{"displayName": sort, "desc": True}]
    return panel("table", title, targets, w, h, options=options, **kw)


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def hide_time() -> dict:
    return {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {}}}


def layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right, wrapping at 24 columns; give each a unique id."""
    x = y = row_h = 0
    for pid, p in enumerate(panels, 1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        p["id"] = pid
        x += w
        row_h = max(row_h, h)
    return panels


def datasource_var() -> dict:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "influxdb",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def query_var(name: str, query: str, label: str, multi: bool = True, include_all: bool = True) -> dict:
    v = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "query": query,
        "definition": query,
        "current": {},
        "hide": 0,
        "multi": multi,
        "includeAll": include_all,
        "options": [],
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 3,
    }
    if include_all:
        v["allValue"] = ".*"
    return v


def tag_values(measurement: str, key: str, where: str | None = None) -> str:
    if measurement != "incident" and key not in catalogue.tags(measurement):
        raise KeyError(f"{measurement} has no tag {key}")
    q = f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "{key}"'
    return q + (f" WHERE {where}" if where else "")


def fleet_vars(host: str | None = None, gpu: str | None = None) -> list[dict]:
    """datasource, cluster, rack and optionally host/gpu ("multi" or "single")."""
    out = [
        datasource_var(),
        query_var("cluster", tag_values("gpu", "cluster"), "Cluster"),
        query_var("rack", tag_values("gpu", "rack", rx("cluster")), "Rack"),
    ]
    if host:
        single = host == "single"
        out.append(
            query_var(
                "host", tag_values("gpu", "host", FLEET), "Host", multi=not single, include_all=not single
            )
        )
    if gpu:
        single = gpu == "single"
        out.append(
            query_var(
                "gpu", tag_values("gpu", "gpu", rx("host")), "GPU", multi=not single, include_all=not single
            )
        )
    return out


def incident_annotation(where: str) -> dict:
    q = (
        f"SELECT {fi('summary')}, {fi('kind')}, {fi('severity')}, {fi('host')}, "
        f'{fi("end_ns")} / 1000000 AS "end_ms" FROM "incident" WHERE $timeFilter AND {where}'
    )
    columns = {
        "textColumn": "summary",
        "titleColumn": "kind",
        "tagsColumn": "kind,severity,host",
        "timeEndColumn": "end_ms",
    }
    # The legacy top-level fields and the ``target`` Grafana's InfluxDB plugin migrates them to
    # (prepareAnnotation in its migrations.ts), so every Grafana version reads the same query.
    target = {
        "refId": "Anno",
        "query": q,
        "rawQuery": True,
        "queryType": "tags",
        "fromAnnotations": True,
        **columns,
        "name": "Incidents",
        "limit": 0,
        "matchAny": False,
        "tags": [],
        "type": "",
    }
    return {
        "name": "Incidents",
        "datasource": DS,
        "enable": True,
        "iconColor": "rgba(255, 96, 96, 1)",
        "query": q,
        **columns,
        "target": target,
    }


def dashboard(
    key: str, title: str, description: str, panels: list[dict], variables: list[dict], annotations: list[dict]
) -> dict:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "annotations": {"list": [builtin, *annotations]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "type": "dashboards",
                "tags": TAGS,
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
                "title": "gpufleet",
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "liveNow": False,
        "panels": layout(panels),
        "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION,
        "tags": TAGS,
        "templating": {"list": variables},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "utc",
        "title": title,
        "uid": UIDS[key],
        "version": 1,
        "weekStart": "",
    }


def link_to(dash: str, title: str, params: str) -> list[dict]:
    return [{"title": title, "url": f"/d/{UIDS[dash]}/?{params}&${{__url_time_range}}"}]


def host_link_override(dash: str = "node") -> dict:
    return {
        "matcher": {"id": "byName", "options": "host"},
        "properties": [
            {"id": "links", "value": link_to(dash, "Open ${__value.text}", "var-host=${__value.raw}")}
        ],
    }


# ------------------------------------------------------------------------------ fleet overview
def fleet_overview() -> dict:
    g = "gpu"
    per_gpu_last = (
        f'SELECT last({f(g, "up")}) AS "up" FROM "gpu" WHERE {{time}} AND {FLEET} '
        f'GROUP BY "cluster", "rack", "host", "gpu"'
    )
    expected = f'SELECT count("up") AS "expected" FROM ({per_gpu_last.format(time="$timeFilter")})'
    reporting = f'SELECT sum("up") AS "reporting" FROM ({per_gpu_last.format(time=LAST_2M)})'
    clock_benign = ("idle", "sw_power_cap", "sync_boost")
    clock_fault = ("hw_thermal", "sw_thermal", "hw_power_brake", "hw_slowdown")

    def clock_share(reasons):
        # the mean of a 0/1 bit over every GPU sample in the bucket: the share of the fleet's GPU time
        sel = ", ".join(f'mean({f(g, "clock_event_" + r)}) AS "{r}"' for r in reasons)
        return f'SELECT {sel} FROM "gpu" WHERE $timeFilter AND {FLEET} GROUP BY time($__interval) fill(none)'

    throttled = " + ".join(
        f"non_negative_difference({f(g, c)})"
        for c in (
            "throttle_hw_thermal_ns_total",
            "throttle_sw_thermal_ns_total",
            "throttle_hw_power_brake_ns_total",
        )
    )
    panels = [
        stat(
            "GPUs expected",
            [target(expected, alias="expected")],
            unit="short",
            description="GPUs that reported at any time in the range.",
        ),
        stat(
            "GPUs reporting",
            [target(reporting, alias="reporting")],
            unit="short",
            description="GPUs whose last row in the final 2 minutes of the range says up = 1. "
            "Fewer than expected: GPUs lost, stale or their node is down.",
        ),
        stat(
            "Incidents firing",
            [
                target(
                    f"SELECT count({fi('id')}) FROM \"incident\" WHERE {fi('state')} = 'firing' AND {FLEET}",
                    alias="open",
                )
            ],
            unit="short",
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
            description="Incidents the analyzer reports as firing (any start time).",
        ),
        stat(
            "GPUs throttled now (thermal or power brake)",
            [
                target(
                    f'SELECT sum("th") FROM (SELECT ceil(({" + ".join(f"max({f(g, x)})" for x in THROTTLE_BITS)}) '
                    f'/ {len(THROTTLE_BITS)}) AS "th" FROM "gpu" WHERE {LAST_2M} AND {FLEET} GROUP BY "host", "gpu")',
                    alias="throttling",
                )
            ],
            unit="short",
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
            description="GPUs with a SW/HW thermal slowdown or HW power-brake bit set in the last 2 minutes "
            "(power capping, healthy under load, is not counted).",
        ),
        stat(
            "GPU power now",
            [
                target(
                    f'SELECT sum("p") FROM (SELECT last({f(g, "power_watts")}) AS "p" FROM "gpu" '
                    f'WHERE {LAST_2M} AND {FLEET} GROUP BY "host", "gpu")',
                    alias="power",
                )
            ],
            unit=grafana_unit(metric(g, "power_watts")),
        ),
        stat(
            "GPU energy in range",
            [
                target(
                    f'SELECT sum("e") FROM (SELECT non_negative_difference({f(g, "energy_joules_total")}) AS "e" '
                    f'FROM "gpu" WHERE $timeFilter AND {FLEET} GROUP BY "host", "gpu")',
                    alias="energy",
                )
            ],
            unit=grafana_unit(metric(g, "energy_joules_total")),
            description="Sum of the energy counters' increases (driver reloads do not count as negative).",
        ),
        table(
            "GPUs expected vs reporting, per cluster and rack",
            [
                target(
                    f'SELECT count("up") AS "expected" FROM ({per_gpu_last.format(time="$timeFilter")}) '
                    f'GROUP BY "cluster", "rack"',
                    "A",
                    fmt="table",
                ),
                target(
                    f'SELECT sum("up") AS "reporting" FROM ({per_gpu_last.format(time=LAST_2M)}) '
                    f'GROUP BY "cluster", "rack"',
                    "B",
                    fmt="table",
                ),
            ],
            w=8,
            h=9,
            transformations=[{"id": "merge", "options": {}}, hide_time()],
        ),
        panel(
            "heatmap",
            "Fleet GPU temperature",
            [
                target(
                    f'SELECT max({f(g, "temperature_gpu_celsius")}) FROM "gpu" WHERE $timeFilter AND {FLEET} '
                    f'GROUP BY time($__interval), "host", "gpu" fill(none)',
                    alias="$tag_host/$tag_gpu",
                )
            ],
            16,
            9,
            unit=grafana_unit(metric(g, "temperature_gpu_celsius")),
            maxDataPoints=200,  # one point per GPU per bucket: keep big fleets light in the browser
            description="Distribution of GPU die temperatures over time (hotter rows: fewer GPUs there "
            "is healthy).",
            options={
                "calculate": True,
                "calculation": {"yBuckets": {"mode": "size", "value": "2"}},
                "color": {"mode": "scheme", "scheme": "Turbo", "steps": 64, "exponent": 0.5},
                "yAxis": {"unit": "celsius"},
                "cellGap": 0,
                "tooltip": {"show": True},
            },
        ),
        timeseries(
            "Clock events: healthy (idle, SW power cap, sync boost)",
            [target(clock_share(clock_benign), alias="$col")],
            stack=True,
            unit="percentunit",
            description="Share of the fleet's GPU time in each state. SW power cap is normal under full "
            "load: the GPU holds its power limit by lowering clocks.",
        ),
        timeseries(
            "Clock events: faults (thermal, power brake, HW slowdown)",
            [target(clock_share(clock_fault), alias="$col")],
            stack=True,
            unit="percentunit",
            description="Share of the fleet's GPU time throttled by temperature or an external power "
            "brake: never expected on a healthy fleet.",
        ),
        table(
            "Top 10 hottest GPUs",
            [
                target(
                    f'SELECT top("t", 10) AS "max temperature", "host", "gpu" FROM (SELECT '
                    f'max({f(g, "temperature_gpu_celsius")}) AS "t" FROM "gpu" WHERE $timeFilter AND {FLEET} '
                    f'GROUP BY "host", "gpu")',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            sort="max temperature",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "max temperature"},
                    "properties": [{"id": "unit", "value": "celsius"}],
                },
                host_link_override(),
            ],
            transformations=[hide_time()],
        ),
        table(
            "Top 10 most throttled GPUs (thermal + power brake)",
            [
                target(
                    f'SELECT top("s", 10) AS "throttled", "host", "gpu" FROM (SELECT sum("d") AS "s" FROM '
                    f'(SELECT {throttled} AS "d" FROM "gpu" WHERE $timeFilter AND {FLEET} GROUP BY "host", "gpu") '
                    f'GROUP BY "host", "gpu")',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            sort="throttled",
            description="Time spent in SW/HW thermal slowdown or HW power brake in the range (the reasons can "
            "overlap, so the sum can exceed the range), from the "
            "throttle-time counters (power capping is not counted).",
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "throttled"},
                    "properties": [{"id": "unit", "value": "ns"}],
                },
                host_link_override(),
            ],
            transformations=[hide_time()],
        ),
        timeseries(
            "GPU power per cluster",
            maxDataPoints=300,  # the per-GPU inner query is the costly part on big fleets
            targets=[
                target(
                    f'SELECT sum("p") FROM (SELECT mean({f(g, "power_watts")}) AS "p" FROM "gpu" WHERE $timeFilter '
                    f'AND {FLEET} GROUP BY time($__interval), "cluster", "host", "gpu") GROUP BY time($__interval), '
                    f'"cluster" fill(none)',
                    alias="$tag_cluster",
                )
            ],
            w=8,
            h=9,
            stack=True,
            unit=grafana_unit(metric(g, "power_watts")),
        ),
        table(
            "XID and ECC events",
            [
                target(
                    f'SELECT {f("gpu_event", "code")}, "type", "host", "gpu", {f("gpu_event", "message")}, '
                    f'{f("gpu_event", "process")}, {f("gpu_event", "pid")} FROM "gpu_event" WHERE $timeFilter AND '
                    f"{FLEET} ORDER BY time DESC LIMIT 500",
                    fmt="table",
                )
            ],
            w=12,
            h=9,
            overrides=[host_link_override()],
        ),
        table(
            "Open incidents",
            [
                target(
                    f"SELECT {fi('id')}, {fi('kind')}, {fi('severity')}, {fi('host')}, {fi('gpu')}, {fi('link')}, "
                    f"{fi('summary')} FROM \"incident\" WHERE {fi('state')} = 'firing' AND {FLEET} "
                    f"ORDER BY time DESC LIMIT 200",
                    fmt="table",
                )
            ],
            w=12,
            h=9,
            overrides=[host_link_override()],
        ),
    ]
    return dashboard(
        "fleet-overview",
        "gpufleet / Fleet overview",
        "Fleet health at a glance: reporting GPUs, temperatures, throttling, power, "
        "XID/ECC events and incidents.",
        panels,
        fleet_vars(),
        [incident_annotation(FLEET)],
    )


# ------------------------------------------------------------------------------ node
def node() -> dict:
    g = "gpu"
    sel = f"$timeFilter AND {NODE} AND {rx('gpu')}"
    per_gpu = 'GROUP BY time($__interval), "gpu" fill(none)'

    def per_gpu_mean(name, agg="mean"):
        return target(f'SELECT {agg}({f(g, name)}) FROM "gpu" WHERE {sel} {per_gpu}', alias="GPU $tag_gpu")

    def thermal_share(fields_, title, desc):
        expr = " + ".join(f"non_negative_derivative(last({f(g, c)}), 1s)" for c in fields_)
        return timeseries(
            title,
            [target(f'SELECT ({expr}) / 1000000000 FROM "gpu" WHERE {sel} {per_gpu}', alias="GPU $tag_gpu")],
            w=8,
            unit="percentunit",
            description=desc,
        )

    nv = "gpu_nvlink"
    nv_total = " + ".join(
        f"spread({f(nv, c)})"
        for c in (
            "crc_flit_errors_total",
            "crc_data_errors_total",
            "replay_errors_total",
            "recovery_errors_total",
        )
    )
    panels = [
        row("GPUs"),
        timeseries(
            "GPU utilization",
            [per_gpu_mean("utilization_gpu_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "utilization_gpu_ratio")),
        ),
        timeseries(
            "SM activity (GPM)",
            [per_gpu_mean("sm_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "sm_active_ratio")),
            description="Share of SMs busy (dcgm-exporter's SM_ACTIVE). At full utilization a GPU waiting "
            "in a collective shows low SM activity; its job's peers stay high.",
        ),
        timeseries(
            "Tensor pipe activity (GPM)",
            [per_gpu_mean("tensor_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "tensor_active_ratio")),
            description=metric(g, "tensor_active_ratio").description,
        ),
        timeseries(
            "DRAM activity (GPM)",
            [per_gpu_mean("dram_active_ratio")],
            w=8,
            unit=grafana_unit(metric(g, "dram_active_ratio")),
            description=metric(g, "dram_active_ratio").description,
        ),
        timeseries(
            "NVLink bandwidth (GPM, TX + RX)",
            [
                target(
                    f'SELECT mean({f(g, "nvlink_tx_bytes_per_second")}) + mean({f(g, "nvlink_rx_bytes_per_second")}) '
                    f'FROM "gpu" WHERE {sel} {per_gpu}',
                    alias="GPU $tag_gpu",
                )
            ],
            w=8,
            unit="Bps",
        ),
        timeseries(
            "PCIe bandwidth (GPM, TX + RX)",
            [
                target(
                    f'SELECT mean({f(g, "pcie_tx_bytes_per_second")}) + mean({f(g, "pcie_rx_bytes_per_second")}) '
                    f'FROM "gpu" WHERE {sel} {per_gpu}',
                    alias="GPU $tag_gpu",
                )
            ],
            w=8,
            unit="Bps",
        ),
        timeseries(
            "Thermal margin (degrees to slowdown)",
            [per_gpu_mean("temperature_margin_celsius", "min")],
            w=8,
            unit=grafana_unit(metric(g, "temperature_margin_celsius")),
            description=metric(g, "temperature_margin_celsius").description,
        ),
        timeseries(
            "Power vs limit",
            [
                per_gpu_mean("power_watts"),
                target(
                    f'SELECT min({f(g, "power_limit_watts")}) AS "limit" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="power limit",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "power_watts")),
            overrides=[overrides_dashed("/limit/")],
        ),
        timeseries(
            "GPU temperature vs its thresholds",
            [
                per_gpu_mean("temperature_gpu_celsius", "max"),
                target(
                    f'SELECT min({f(g, "temperature_max_operating_celsius")}) AS "max operating", '
                    f'min({f(g, "temperature_slowdown_celsius")}) AS "slowdown" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="$col",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "temperature_gpu_celsius")),
            description="Dashed lines: the thresholds the GPUs themselves report (lowest across the node).",
            overrides=[overrides_dashed("/max operating|slowdown/")],
        ),
        timeseries(
            "Memory temperature vs its threshold",
            [
                per_gpu_mean("temperature_memory_celsius", "max"),
                target(
                    f'SELECT min({f(g, "temperature_memory_max_celsius")}) AS "memory max" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="$col",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "temperature_memory_celsius")),
            overrides=[overrides_dashed("/memory max/")],
        ),
        timeseries(
            "SM clock",
            [
                per_gpu_mean("clock_sm_mhz"),
                target(
                    f'SELECT max({f(g, "clock_sm_max_mhz")}) AS "max" FROM "gpu" WHERE {sel} '
                    f"GROUP BY time($__interval) fill(none)",
                    "B",
                    alias="max SM clock",
                ),
            ],
            w=8,
            unit=grafana_unit(metric(g, "clock_sm_mhz")),
            overrides=[overrides_dashed("/max SM clock/", "blue")],
        ),
        timeseries(
            "Memory used",
            [per_gpu_mean("memory_used_bytes", "max")],
            w=8,
            unit=grafana_unit(metric(g, "memory_used_bytes")),
        ),
        thermal_share(
            ("throttle_hw_thermal_ns_total", "throttle_hw_power_brake_ns_total"),
            "Share of time in HW slowdown (thermal or power brake)",
            "Rate of the HW thermal and HW power-brake throttle-time counters: 100% = slowed down the "
            "whole interval. The GPU dashboard shows each reason, SW thermal included.",
        ),
        thermal_share(
            ("throttle_sw_power_cap_ns_total",),
            "Share of time at the power cap (healthy under load)",
            "Rate of the power-cap throttle-time counter; high under full load is normal.",
        ),
        table(
            "Clock-event reasons in range, per GPU",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'mean({f(g, "clock_event_" + r)}) AS "{r}"'
                        for r in (
                            "idle",
                            "sw_power_cap",
                            "sw_thermal",
                            "hw_thermal",
                            "hw_power_brake",
                            "hw_slowdown",
                        )
                    )
                    + f' FROM "gpu" WHERE {sel} GROUP BY "gpu"',
                    fmt="table",
                )
            ],
            w=8,
            unit="percentunit",
            description="Share of the range each reason was active. idle and sw_power_cap are healthy; "
            "thermal, power brake and HW slowdown are not.",
            transformations=[hide_time()],
        ),
        row("NVLink"),
        table(
            "NVLink errors in range (GPU x link)",
            [
                target(
                    f'SELECT {nv_total} AS "errors" FROM "{nv}" WHERE $timeFilter AND {NODE} GROUP BY "gpu", "link"',
                    fmt="table",
                )
            ],
            w=12,
            h=9,
            description="CRC flit + CRC data + replay + recovery errors counted in the range, per link.",
            transformations=[
                {
                    "id": "groupingToMatrix",
                    "options": {"columnField": "link", "rowField": "gpu", "valueField": "errors"},
                }
            ],
            thresholds=[
                {"color": "green", "value": None},
                {"color": "orange", "value": 1},
                {"color": "red", "value": 100},
            ],
            custom={"cellOptions": {"type": "color-background"}, "align": "center"},
        ),
        timeseries(
            "NVLink CRC error rate",
            [
                target(
                    f'SELECT non_negative_derivative(last({f(nv, "crc_flit_errors_total")}), 1m) FROM "{nv}" '
                    f'WHERE $timeFilter AND {NODE} GROUP BY time($__interval), "gpu", "link" fill(none)',
                    alias="GPU $tag_gpu link $tag_link",
                )
            ],
            w=12,
            h=9,
            unit="cpm",
        ),
        row("PCIe"),
        table(
            "PCIe link (current vs max)",
            [
                target(
                    f'SELECT last({f(g, "pcie_link_gen")}) AS "gen", last({f(g, "pcie_link_gen_max")}) AS "gen max", '
                    f'last({f(g, "pcie_link_width")}) AS "width", last({f(g, "pcie_link_width_max")}) AS "width max" '
                    f'FROM "gpu" WHERE {sel} GROUP BY "gpu"',
                    fmt="table",
                )
            ],
            w=12,
            transformations=[hide_time()],
        ),
        timeseries(
            "PCIe replay rate",
            [
                target(
                    f'SELECT non_negative_derivative(last({f(g, "pcie_replay_total")}), 1m) FROM "gpu" WHERE {sel} '
                    f"{per_gpu}",
                    alias="GPU $tag_gpu",
                )
            ],
            w=12,
            unit="cpm",
        ),
        row("BMC"),
        table(
            "BMC sensors (last reading)",
            [
                target(
                    f'SELECT last({f("bmc_sensor", "value")}) AS "value", last({f("bmc_sensor", "state_code")}) AS "state" '
                    f'FROM "bmc_sensor" WHERE $timeFilter AND {NODE} GROUP BY "sensor", "sensor_type", "unit"',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            transformations=[hide_time()],
            description="state: 0 nominal, 1 warning, 2 critical.",
        ),
        timeseries(
            "BMC temperatures",
            [
                target(
                    f'SELECT mean({f("bmc_sensor", "value")}) FROM "bmc_sensor" WHERE $timeFilter AND {NODE} AND '
                    f'"unit" = \'C\' GROUP BY time($__interval), "sensor" fill(none)',
                    alias="$tag_sensor",
                )
            ],
            w=8,
            h=9,
            unit="celsius",
        ),
        timeseries(
            "Node power: BMC vs GPUs",
            [
                target(
                    f'SELECT mean({f("bmc", "power_watts")}) FROM "bmc" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="node (BMC)",
                ),
                target(
                    f'SELECT sum("p") FROM (SELECT mean({f(g, "power_watts")}) AS "p" FROM "gpu" WHERE '
                    f'$timeFilter AND {NODE} GROUP BY time($__interval), "gpu") GROUP BY time($__interval) '
                    f"fill(none)",
                    "B",
                    alias="GPUs",
                ),
            ],
            w=8,
            h=9,
            unit="watt",
        ),
        row("Host"),
        timeseries(
            "CPU utilization",
            [
                target(
                    f'SELECT mean({f("host", "cpu_utilization_ratio")}) FROM "host" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="CPU",
                )
            ],
            w=8,
            unit=grafana_unit(metric("host", "cpu_utilization_ratio")),
        ),
        timeseries(
            "Host memory",
            [
                target(
                    f'SELECT mean({f("host", "memory_used_bytes")}) AS "used", mean({f("host", "memory_total_bytes")}) '
                    f'AS "total" FROM "host" WHERE $timeFilter AND {NODE} GROUP BY time($__interval) fill(none)',
                    alias="$col",
                )
            ],
            w=8,
            unit="bytes",
            overrides=[overrides_dashed("/total/", "blue")],
        ),
        timeseries(
            "Load average",
            [
                target(
                    f'SELECT mean({f("host", "load1")}) AS "1m", mean({f("host", "load5")}) AS "5m", '
                    f'mean({f("host", "load15")}) AS "15m" FROM "host" WHERE $timeFilter AND {NODE} '
                    f"GROUP BY time($__interval) fill(none)",
                    alias="$col",
                )
            ],
            w=8,
            unit="short",
        ),
    ]
    return dashboard(
        "node",
        "gpufleet / Node",
        "One node: its GPUs side by side, NVLink, PCIe, BMC and host.",
        panels,
        fleet_vars(host="single", gpu="multi"),
        [incident_annotation(NODE)],
    )


# ------------------------------------------------------------------------------ gpu
# Panels of the GPU dashboard: (title, fields). Counters are drawn as rates. Any numeric catalogue
# field of the gpu measurement not named here lands in "Other signals", so nothing is left out.
GPU_GROUPS = (
    ("Utilization", ("utilization_gpu_ratio", "utilization_memory_ratio")),
    (
        "Activity (GPM): SM, tensor, DRAM",
        ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio"),
    ),
    (
        "PCIe and NVLink bandwidth (GPM)",
        ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
    ),
    ("Thermal margin (degrees to the nearest slowdown limit)", ("temperature_margin_celsius",)),
    ("Power", ("power_watts", "power_instant_watts", "power_limit_watts")),
    ("Energy (rate = average power)", ("energy_joules_total",)),
    (
        "Temperature vs its thresholds",
        (
            "temperature_gpu_celsius",
            "temperature_memory_celsius",
            "temperature_max_operating_celsius",
            "temperature_slowdown_celsius",
            "temperature_shutdown_celsius",
            "temperature_memory_max_celsius",
        ),
    ),
    ("Clocks", ("clock_sm_mhz", "clock_memory_mhz", "clock_sm_max_mhz")),
    ("Memory", ("memory_used_bytes", "memory_total_bytes")),
    ("Clock events: healthy", ("clock_event_idle", "clock_event_sw_power_cap", "clock_event_sync_boost")),
    (
        "Clock events: faults",
        (
            "clock_event_sw_thermal",
            "clock_event_hw_thermal",
            "clock_event_hw_power_brake",
            "clock_event_hw_slowdown",
        ),
    ),
    (
        "Throttle time (share of time, from the counters)",
        (
            "throttle_sw_power_cap_ns_total",
            "throttle_sw_thermal_ns_total",
            "throttle_hw_thermal_ns_total",
            "throttle_hw_power_brake_ns_total",
        ),
    ),
    ("Clock event reasons (bitmask) and performance state", ("clock_event_reasons", "performance_state")),
    ("PCIe link", ("pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max")),
    ("PCIe replays", ("pcie_replay_total",)),
    (
        "PCIe link errors (rate)",
        (
            "pcie_l0_to_recovery_total",
            "pcie_correctable_errors_total",
            "pcie_naks_received_total",
            "pcie_receiver_errors_total",
            "pcie_bad_tlp_total",
            "pcie_naks_sent_total",
            "pcie_bad_dllp_total",
            "pcie_nonfatal_errors_total",
            "pcie_fatal_errors_total",
            "pcie_unsupported_requests_total",
            "pcie_lcrc_errors_total",
            "pcie_lane_errors_total",
        ),
    ),
    (
        "Perf-policy time (share of time, from the counters)",
        (
            "perf_policy_thermal_ns_total",
            "perf_policy_sync_boost_ns_total",
            "perf_policy_board_limit_ns_total",
            "perf_policy_low_utilization_ns_total",
            "perf_policy_reliability_ns_total",
            "perf_policy_app_clocks_ns_total",
            "perf_policy_base_clocks_ns_total",
        ),
    ),
    ("ECC errors (volatile, rate)", ("ecc_corrected_volatile_total", "ecc_uncorrected_volatile_total")),
    ("ECC errors (lifetime)", ("ecc_corrected_aggregate_total", "ecc_uncorrected_aggregate_total")),
    (
        "Retired pages and row remaps",
        (
            "retired_pages_sbe",
            "retired_pages_dbe",
            "retired_pages_pending",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        ),
    ),
    ("Health and processes", ("up", "health_code", "process_count", "fan_speed_ratio")),
)
LIFETIME_COUNTERS = {"ecc_corrected_aggregate_total", "ecc_uncorrected_aggregate_total"}
THRESHOLD_FIELDS = {
    "temperature_max_operating_celsius",
    "temperature_slowdown_celsius",
    "temperature_shutdown_celsius",
    "temperature_memory_max_celsius",
    "power_limit_watts",
    "clock_sm_max_mhz",
    "memory_total_bytes",
    "pcie_link_gen_max",
    "pcie_link_width_max",
}


def gpu_groups() -> list[tuple[str, tuple[str, ...]]]:
    numeric = [mt.field for mt in catalogue.fields("gpu") if mt.type != "string"]
    named = {x for _, fs in GPU_GROUPS for x in fs}
    groups = [(t, tuple(x for x in fs if ("gpu", x) in catalogue.by_key())) for t, fs in GPU_GROUPS]
    rest = tuple(x for x in numeric if x not in named)
    if rest:
        groups.append(("Other signals", rest))
    return [(t, fs) for t, fs in groups if fs]


def gpu_panel(title: str, fields_: tuple[str, ...], where: str) -> dict:
    metrics = [metric("gpu", x) for x in fields_]
    rates = [mt for mt in metrics if mt.kind == "counter" and mt.field not in LIFETIME_COUNTERS]
    if rates:
        per, divisor, unit = rate_unit(rates[0])
        sel = ", ".join(
            (
                f"non_negative_derivative(last({f('gpu', mt.field)}), {per})"
                + (f" / {divisor}" if divisor != 1 else "")
                + f' AS "{mt.field}"'
            )
            for mt in metrics
        )
        desc = "Counters shown as rates (non_negative_derivative; resets at driver reload are skipped)."
    else:
        units = {grafana_unit(mt) for mt in metrics}
        unit = units.pop() if len(units) == 1 else "short"
        agg = "last" if all(mt.kind == "counter" or mt.tier == "slow" for mt in metrics) else "mean"
        sel = ", ".join(f'{agg}({f("gpu", mt.field)}) AS "{mt.field}"' for mt in metrics)
        desc = "; ".join(f"{mt.field}: {mt.description}" for mt in metrics)
    if title.startswith("Clock event reasons"):
        unit = "none"
    q = f'SELECT {sel} FROM "gpu" WHERE {where} GROUP BY time($__interval) fill(none)'
    dashed = [x for x in fields_ if x in THRESHOLD_FIELDS]
    overrides = [overrides_dashed("/" + "|".join(dashed) + "/")] if dashed else []
    return timeseries(title, [target(q, alias="$col")], w=8, unit=unit, description=desc, overrides=overrides)


def gpu() -> dict:
    where = f"$timeFilter AND {NODE} AND {rx('gpu')}"
    panels: list[dict] = [row("Signals (every numeric field of the gpu measurement)")]
    panels += [gpu_panel(t, fs, where) for t, fs in gpu_groups()]
    panels.append(
        stat(
            "Job",
            [target(f'SELECT last({f("gpu", "job_id")}) AS "job" FROM "gpu" WHERE {where}', alias="job")],
            w=8,
            h=8,
            unit="string",
            description=metric("gpu", "job_id").description,
        )
    )
    nv = "gpu_nvlink"
    panels += [
        row("NVLink"),
        timeseries(
            "NVLink errors per link (rate)",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'non_negative_derivative(last({f(nv, c)}), 1m) AS "{c}"'
                        for c in (
                            "crc_flit_errors_total",
                            "crc_data_errors_total",
                            "replay_errors_total",
                            "recovery_errors_total",
                        )
                    )
                    + f' FROM "{nv}" WHERE {where} GROUP BY time($__interval), "link" fill(none)',
                    alias="link $tag_link $col",
                )
            ],
            w=16,
            h=9,
            unit="cpm",
        ),
        timeseries(
            "NVLink throughput per link",
            [
                target(
                    "SELECT "
                    + ", ".join(
                        f'non_negative_derivative(last({f(nv, c)}), 1s) AS "{c}"'
                        for c in ("tx_data_bytes_total", "rx_data_bytes_total")
                    )
                    + f' FROM "{nv}" WHERE {where} GROUP BY time($__interval), "link" fill(none)',
                    alias="link $tag_link $col",
                )
            ],
            w=24,
            h=8,
            unit="Bps",
            description="From the per-link data counters (fields 138/139), read with the link rows; a link "
            "far below its siblings carries less of the job's traffic.",
        ),
        table(
            "NVLink links down",
            [
                target(
                    f'SELECT min({f(nv, "up")}) AS "min up", last({f(nv, "up")}) AS "up now" FROM "{nv}" WHERE {where} '
                    f'GROUP BY "link"',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
            transformations=[hide_time()],
        ),
        row("Canary, events and incidents"),
        timeseries(
            "Known-answer canary",
            [
                target(
                    f'SELECT last({f("gpu_canary", "passed")}) AS "passed", last({f("gpu_canary", "mismatches")}) '
                    f'AS "mismatches" FROM "gpu_canary" WHERE {where} GROUP BY time($__interval) fill(none)',
                    alias="$col",
                )
            ],
            w=8,
            h=9,
            unit="short",
        ),
        table(
            "XID and ECC events of this GPU",
            [
                target(
                    f'SELECT {f("gpu_event", "code")}, "type", {f("gpu_event", "message")}, {f("gpu_event", "process")}, '
                    f'{f("gpu_event", "pid")} FROM "gpu_event" WHERE {where} ORDER BY time DESC LIMIT 200',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
        ),
        table(
            "Incidents of this GPU",
            [
                target(
                    f"SELECT {fi('id')}, {fi('kind')}, {fi('severity')}, {fi('state')}, {fi('link')}, {fi('summary')} "
                    f'FROM "incident" WHERE $timeFilter AND {rx("host")} AND {fi("gpu")} = $gpu ORDER BY time DESC',
                    fmt="table",
                )
            ],
            w=8,
            h=9,
        ),
    ]
    return dashboard(
        "gpu",
        "gpufleet / GPU",
        "Every signal of one GPU, counters as rates, its links, events and incidents.",
        panels,
        fleet_vars(host="single", gpu="single"),
        [incident_annotation(f"{rx('host')} AND {fi('gpu')} = $gpu")],
    )


# ------------------------------------------------------------------------------ incidents
def incidents() -> dict:
    flt = f"{rx('kind')} AND {rx('severity')} AND {rx('cluster')}"
    variables = [
        datasource_var(),
        query_var("kind", tag_values("incident", "kind"), "Kind"),
        query_var("severity", tag_values("incident", "severity"), "Severity"),
        query_var("cluster", tag_values("incident", "cluster"), "Cluster"),
    ]
    panels = [
        stat(
            "Firing",
            [
                target(
                    f"SELECT count({fi('id')}) FROM \"incident\" WHERE {fi('state')} = 'firing' AND {flt}",
                    alias="firing",
                )
            ],
            w=6,
            unit="short",
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
        ),
        stat(
            "Started in range",
            [
                target(
                    f'SELECT count({fi("id")}) FROM "incident" WHERE $timeFilter AND {flt}', alias="started"
                )
            ],
            w=6,
            unit="short",
        ),
        stat(
            "Critical started in range",
            [
                target(
                    f'SELECT count({fi("id")}) FROM "incident" WHERE $timeFilter AND {flt} AND "severity" = \'critical\'',
                    alias="critical",
                )
            ],
            w=6,
            unit="short",
        ),
        stat(
            "Median duration of resolved",
            [
                target(
                    f"SELECT median({fi('duration_seconds')}) FROM \"incident\" WHERE $timeFilter AND {flt} AND {fi('state')} = 'resolved'",
                    alias="median",
                )
            ],
            w=6,
            unit="s",
        ),
        table(
            "Incidents",
            [
                target(
                    f"SELECT {fi('id')}, {fi('state')}, {fi('kind')}, {fi('severity')}, {fi('cluster')}, {fi('rack')}, "
                    f'{fi("host")}, {fi("gpu")}, {fi("link")}, {fi("summary")}, {fi("duration_seconds")} FROM "incident" '
                    f"WHERE $timeFilter AND {flt} ORDER BY time DESC LIMIT 1000",
                    fmt="table",
                )
            ],
            w=24,
            h=10,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "duration_seconds"},
                    "properties": [{"id": "unit", "value": "s"}],
                },
                host_link_override(),
            ],
        ),
        timeseries(
            "Incidents started, by kind",
            [
                target(
                    f'SELECT count({fi("id")}) FROM "incident" WHERE $timeFilter AND {flt} '
                    f'GROUP BY time($__interval), "kind" fill(none)',
                    alias="$tag_kind",
                )
            ],
            w=12,
            bars=True,
            stack=True,
            unit="short",
        ),
        panel(
            "bargauge",
            "Incidents in range by kind",
            [
                target(
                    f'SELECT count({fi("id")}) FROM "incident" WHERE $timeFilter AND {flt} GROUP BY "kind"',
                    alias="$tag_kind",
                )
            ],
            12,
            8,
            unit="short",
            options={
                "orientation": "horizontal",
                "displayMode": "gradient",
                "showUnfilled": True,
                "reduceOptions": {"calcs": ["sum"], "fields": "", "values": False},
            },
        ),
    ]
    return dashboard(
        "incidents",
        "gpufleet / Incidents",
        "The analyzer's incidents, filterable by kind, severity and cluster.",
        panels,
        variables,
        [incident_annotation(flt)],
    )


BUILDERS = {"fleet-overview": fleet_overview, "node": node, "gpu": gpu, "incidents": incidents}


def build_all() -> dict[str, dict]:
    return {name: build() for name, build in BUILDERS.items()}


def dumps(dash: dict) -> str:
    return json.dumps(dash, indent=2, ensure_ascii=False) + "\n"


def write(out: Path, dashboards: dict[str, dict] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, dash in (dashboards or build_all()).items():
        p = out / f"{name}.json"
        p.write_text(dumps(dash))
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else GRAFANA_DIR):
        print(p)
