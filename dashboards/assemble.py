"""A dashboard around its panels: the JSON frame (uid, tags, time range, the links between the
gpufleet dashboards), the panels placed on Grafana's 24-column grid, the template variables
(datasource, cluster, rack, host, gpu) and the analyzer's incidents as annotations.
"""

from __future__ import annotations

from gpufleet.dashboards.influxql import DATASOURCE, FLEET, incident_field, show_tag_values, tag_matches

SCHEMA_VERSION = 39
TAGS = ["gpufleet"]
UIDS = {
    "fleet-overview": "gpufleet-fleet",
    "node": "gpufleet-node",
    "gpu": "gpufleet-gpu",
    "incidents": "gpufleet-incidents",
}


def place_on_grid(panels: list[dict]) -> list[dict]:
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
    """The variable choosing the InfluxDB datasource every query reads."""
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
    """A variable whose values a query lists; "All" matches every value (``.*``)."""
    v = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
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


def fleet_vars(host: str | None = None, gpu: str | None = None) -> list[dict]:
    """datasource, cluster, rack and optionally host/gpu ("multi" or "single")."""
    out = [
        datasource_var(),
        query_var("cluster", show_tag_values("gpu", "cluster"), "Cluster"),
        query_var("rack", show_tag_values("gpu", "rack", tag_matches("cluster")), "Rack"),
    ]
    if host:
        single = host == "single"
        out.append(query_var("host", show_tag_values("gpu", "host", FLEET), "Host",
                             multi=not single, include_all=not single))
    if gpu:
        single = gpu == "single"
        out.append(query_var("gpu", show_tag_values("gpu", "gpu", tag_matches("host")), "GPU",
                             multi=not single, include_all=not single))
    return out


def incident_annotation(where: str) -> dict:
    """The analyzer's incidents matching ``where`` as annotations (start to end, summary as text)."""
    summary, kind, severity, host = (incident_field(x) for x in ("summary", "kind", "severity", "host"))
    q = (
        f"SELECT {summary}, {kind}, {severity}, {host}, "
        f'{incident_field("end_ns")} / 1000000 AS "end_ms" FROM "incident" WHERE $timeFilter AND {where}'
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
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": "rgba(255, 96, 96, 1)",
        "query": q,
        **columns,
        "target": target,
    }


def dashboard(
    key: str, title: str, description: str, panels: list[dict], variables: list[dict], annotations: list[dict]
) -> dict:
    """The dashboard ``key`` (its uid from ``UIDS``) around its panels, placed on the grid."""
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
        "panels": place_on_grid(panels),
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
    """A link to another gpufleet dashboard, keeping the time range."""
    return [{"title": title, "url": f"/d/{UIDS[dash]}/?{params}&${{__url_time_range}}"}]


def host_link_override(dash: str = "node") -> dict:
    """A table's ``host`` cells linking to that host's node dashboard."""
    return {
        "matcher": {"id": "byName", "options": "host"},
        "properties": [
            {"id": "links", "value": link_to(dash, "Open ${__value.text}", "var-host=${__value.raw}")}
        ],
    }
