"""Grafana panels as plain data: a query target, the panel types the dashboards use (time series,
stat, table, row; any other through :func:`panel`) and the overrides and transformations they share.

Sizes are given here (``w`` of 24 columns, ``h``); positions and ids are set when a dashboard is
assembled (:func:`gpufleet.dashboards.assemble.place_on_grid`).
"""

from __future__ import annotations

from gpufleet.dashboards.influxql import DATASOURCE


def target(query: str, ref: str = "A", alias: str | None = None, fmt: str = "time_series") -> dict:
    """One raw InfluxQL query of a panel (its whitespace collapsed to single spaces)."""
    t = {
        "datasource": DATASOURCE,
        "refId": ref,
        "query": " ".join(query.split()),
        "rawQuery": True,
        "resultFormat": fmt,
    }
    if alias:
        t["alias"] = alias
    return t


def dashed_override(regex: str, color: str = "red") -> dict:
    """Series whose name matches ``regex`` drawn as dashed lines (thresholds, limits)."""
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
    """Any panel type; ``extra`` keys land on the panel as they are."""
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
        "datasource": DATASOURCE,
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
    """A table transformation that drops the Time column."""
    return {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {}}}

