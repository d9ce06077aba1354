"""Catalogue units (UCUM) -> Grafana's unit ids, for a value and for a counter drawn as a rate."""

from __future__ import annotations

from gpufleet import catalogue

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
    """How a value of ``metric`` is shown."""
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
