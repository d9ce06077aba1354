# ruff: noqa: E501  (InfluxQL text reads best unbroken; the rest keeps to 110 columns)
"""The analyzer's incidents: counts, the list, starts by kind; filterable by kind, severity and cluster."""

from __future__ import annotations

from gpufleet.dashboards.assemble import (
    dashboard,
    datasource_var,
    host_link_override,
    incident_annotation,
    query_var,
)
from gpufleet.dashboards.influxql import incident_field, show_tag_values, tag_matches
from gpufleet.dashboards.panels import panel, stat, table, target, timeseries


def build() -> dict:
    flt = f"{tag_matches('kind')} AND {tag_matches('severity')} AND {tag_matches('cluster')}"
    variables = [
        datasource_var(),
        query_var("kind", show_tag_values("incident", "kind"), "Kind"),
        query_var("severity", show_tag_values("incident", "severity"), "Severity"),
        query_var("cluster", show_tag_values("incident", "cluster"), "Cluster"),
    ]
    panels = [
        stat(
            "Firing",
            [
                target(
                    f"SELECT count({incident_field('id')}) FROM \"incident\" WHERE {incident_field('state')} = 'firing' AND {flt}",
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
                    f'SELECT count({incident_field("id")}) FROM "incident" WHERE $timeFilter AND {flt}', alias="started"
                )
            ],
            w=6,
            unit="short",
        ),
        stat(
            "Critical started in range",
            [
                target(
                    f'SELECT count({incident_field("id")}) FROM "incident" WHERE $timeFilter AND {flt} AND "severity" = \'critical\'',
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
                    f"SELECT median({incident_field('duration_seconds')}) FROM \"incident\" WHERE $timeFilter AND {flt} AND {incident_field('state')} = 'resolved'",
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
                    f"SELECT {incident_field('id')}, {incident_field('state')}, {incident_field('kind')}, {incident_field('severity')}, {incident_field('cluster')}, {incident_field('rack')}, "
                    f'{incident_field("host")}, {incident_field("gpu")}, {incident_field("link")}, {incident_field("summary")}, {incident_field("duration_seconds")} FROM "incident" '
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
                    f'SELECT count({incident_field("id")}) FROM "incident" WHERE $timeFilter AND {flt} '
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
                    f'SELECT count({incident_field("id")}) FROM "incident" WHERE $timeFilter AND {flt} GROUP BY "kind"',
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
