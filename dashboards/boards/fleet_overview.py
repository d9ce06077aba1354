# ruff: noqa: E501  (InfluxQL text reads best unbroken; the rest keeps to 110 columns)
"""The fleet overview: reporting GPUs, temperatures, throttling, power, XID/ECC events and incidents
across the chosen clusters and racks, with links into each node."""

from __future__ import annotations

from gpufleet.dashboards.assemble import dashboard, fleet_vars, host_link_override, incident_annotation
from gpufleet.dashboards.grafana_units import grafana_unit
from gpufleet.dashboards.influxql import FLEET, LAST_2M, field, incident_field, metric
from gpufleet.dashboards.panels import hide_time, panel, stat, table, target, timeseries

# Clock-event bits that mean a fault (power capping and idle are healthy)
THROTTLE_BITS = ("clock_event_sw_thermal", "clock_event_hw_thermal", "clock_event_hw_power_brake")


def build() -> dict:
    g = "gpu"
    per_gpu_last = (
        f'SELECT last({field(g, "up")}) AS "up" FROM "gpu" WHERE {{time}} AND {FLEET} '
        f'GROUP BY "cluster", "rack", "host", "gpu"'
    )
    expected = f'SELECT count("up") AS "expected" FROM ({per_gpu_last.format(time="$timeFilter")})'
    reporting = f'SELECT sum("up") AS "reporting" FROM ({per_gpu_last.format(time=LAST_2M)})'
    clock_benign = ("idle", "sw_power_cap", "sync_boost")
    clock_fault = ("hw_thermal", "sw_thermal", "hw_power_brake", "hw_slowdown")

    def clock_share(reasons):
        # the mean of a 0/1 bit over every GPU sample in the bucket: the share of the fleet's GPU time
        sel = ", ".join(f'mean({field(g, "clock_event_" + r)}) AS "{r}"' for r in reasons)
        return f'SELECT {sel} FROM "gpu" WHERE $timeFilter AND {FLEET} GROUP BY time($__interval) fill(none)'

    throttled = " + ".join(
        f"non_negative_difference({field(g, c)})"
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
                    f"SELECT count({incident_field('id')}) FROM \"incident\" WHERE {incident_field('state')} = 'firing' AND {FLEET}",
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
                    f'SELECT sum("th") FROM (SELECT ceil(({" + ".join(f"max({field(g, x)})" for x in THROTTLE_BITS)}) '
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
                    f'SELECT sum("p") FROM (SELECT last({field(g, "power_watts")}) AS "p" FROM "gpu" '
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
                    f'SELECT sum("e") FROM (SELECT non_negative_difference({field(g, "energy_joules_total")}) AS "e" '
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
                    f'SELECT max({field(g, "temperature_gpu_celsius")}) FROM "gpu" WHERE $timeFilter AND {FLEET} '
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
                    f'max({field(g, "temperature_gpu_celsius")}) AS "t" FROM "gpu" WHERE $timeFilter AND {FLEET} '
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
                    f'SELECT sum("p") FROM (SELECT mean({field(g, "power_watts")}) AS "p" FROM "gpu" WHERE $timeFilter '
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
                    f'SELECT {field("gpu_event", "code")}, "type", "host", "gpu", {field("gpu_event", "message")}, '
                    f'{field("gpu_event", "process")}, {field("gpu_event", "pid")} FROM "gpu_event" WHERE $timeFilter AND '
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
                    f"SELECT {incident_field('id')}, {incident_field('kind')}, {incident_field('severity')}, {incident_field('host')}, {incident_field('gpu')}, {incident_field('link')}, "
                    f"{incident_field('summary')} FROM \"incident\" WHERE {incident_field('state')} = 'firing' AND {FLEET} "
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
