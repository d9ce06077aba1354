"""Expand a dashboard query the way Grafana's InfluxDB (InfluxQL) data source does.

Used to prove the dashboards against a real InfluxDB and to draw their previews without a
Grafana server. What it reproduces (Grafana 10/11, InfluxQL in raw mode):

- the frontend's template interpolation: ``$var``, ``${var}``, ``${var:regex}``, ``[[var]]``,
  the InfluxDB formatter (numbers stay as they are; multi-value variables become a regex-escaped
  ``(a|b)``; ``$__all`` with a custom all value is that value, unescaped), the scoped
  ``$__interval``/``$__interval_ms`` and the global ``${__from}``/``${__to}`` (epoch ms);
- the backend's macros: ``$timeFilter`` -> ``time >= <from>ms and time <= <to>ms``,
  ``$interval``/``$__interval`` -> the interval formatted like ``gtime.FormatInterval``;
- the interval itself: ``roundInterval((to - from) / maxDataPoints)``, raised to the data
  source's (or panel's) minimum interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ALL = "$__all"

# Grafana's regexEscape: backslash before each of \ ^ $ * + ? . ( ) | [ ] { } /
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
# templateSrv's variable syntax: $name | [[name(:fmt)]] | ${name(.path)(:fmt)}
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")

_ROUND_STEPS = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (750000, 600000),
    (1050000, 900000),
    (1500000, 1200000),
    (2700000, 1800000),
    (5400000, 3600000),
    (9000000, 7200000),
    (16200000, 10800000),
    (32400000, 21600000),
    (86400000, 43200000),
    (604800000, 86400000),
    (1814400000, 604800000),
    (3628800000, 2592000000),
)
_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    "y": 31_536_000_000,
}


def regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value)


def round_interval(ms: float) -> int:
    """rangeutil.roundInterval: snap a raw interval (ms) to a readable one."""
    for below, snapped in _ROUND_STEPS:
        if ms < below:
            return snapped
    return 31_536_000_000


def parse_interval(text: str) -> int:
    """'10s' -> 10000 (ms)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", text.strip())
    if not m:
        raise ValueError(f"bad interval {text!r}")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def format_interval(ms: int) -> str:
    """gtime.FormatInterval: the largest whole unit (y, d, h, m, s, ms)."""
    for unit in ("y", "d", "h", "m", "s", "ms"):
        size = _UNITS_MS[unit]
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def interval_ms(
    from_ms: int, to_ms: int, max_data_points: int = 1000, min_interval: str | None = None
) -> int:
    raw = (to_ms - from_ms) / max(1, max_data_points)
    ms = round_interval(raw)
    if min_interval:
        ms = max(ms, parse_interval(min_interval))
    return ms


@dataclass
class Var:
    """A template variable's definition (multi, includeAll, allValue) and current value(s)."""

    name: str
    value: str | list[str]
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None
    options: list[str] = field(default_factory=list)  # every value, for $__all without a custom all value


def format_value(value: str | list[str], var: Var, fmt: str | None) -> str:
    """The InfluxDB data source's interpolateQueryExpr, or an explicit ``:format``."""
    if fmt == "regex":
        if isinstance(value, str):
            return regex_escape(value)
        esc = [regex_escape(v) for v in value]
        return esc[0] if len(esc) == 1 else "(" + "|".join(esc) + ")"
    if fmt == "raw":
        return value if isinstance(value, str) else ",".join(value)
    if fmt == "pipe":
        return value if isinstance(value, str) else "|".join(value)
    if fmt is not None:
        raise ValueError(f"format {fmt!r} not emulated")
    if isinstance(value, str):
        try:
            float(value)
            return value
        except ValueError:
            pass
    if var.multi or var.include_all:
        if isinstance(value, str):
            return regex_escape(value)
        return "(" + "|".join(regex_escape(v) for v in value) + ")"
    # A single-value variable used inside /.../ is escaped; elsewhere it is left as it is.
    return regex_escape(value) if isinstance(value, str) else ",".join(value)


@dataclass
class Context:
    """The time range, interval and variables one panel query is expanded with."""

    from_ms: int
    to_ms: int
    variables: dict[str, Var] = field(default_factory=dict)
    max_data_points: int = 1000
    min_interval: str | None = "10s"

    @property
    def interval(self) -> int:
        return interval_ms(self.from_ms, self.to_ms, self.max_data_points, self.min_interval)


def _frontend(text: str, ctx: Context, interval: int) -> str:
    scoped = {
        "__interval": format_interval(interval),
        "__interval_ms": str(interval),
        "__from": str(ctx.from_ms),
        "__to": str(ctx.to_ms),
    }

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in scoped:
            return scoped[name]
        var = ctx.variables.get(name)
        if var is None:
            return m.group(0)  # unknown names (and $timeFilter) are left for the backend
        value = var.value
        if value == ALL or value == [ALL]:
            if var.all_value is not None:
                return var.all_value  # a custom all value skips formatting
            value = list(var.options)
        return format_value(value, var, fmt)

    return _VARIABLE.sub(sub, text)


def _backend(text: str, ctx: Context, interval: int) -> str:
    text = text.replace("$timeFilter", f"time >= {ctx.from_ms}ms and time <= {ctx.to_ms}ms")
    text = text.replace("$interval", format_interval(interval))
    text = text.replace("$__interval_ms", str(interval))
    return text.replace("$__interval", format_interval(interval))


def expand(query: str, ctx: Context, panel_interval: str | None = None) -> str:
    """The InfluxQL text Grafana sends to ``/query`` for one raw-mode target."""
    interval = ctx.interval
    if panel_interval:
        interval = max(interval, parse_interval(panel_interval))
    return _backend(_frontend(query, ctx, interval), ctx, interval)


def expand_variable_query(query: str, ctx: Context) -> str:
    """A template variable's query (metricFindQuery): interpolated, then the macros."""
    return expand(query, ctx)
