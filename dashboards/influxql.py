"""The dashboards' query dialect: InfluxQL (the query language InfluxDB 1.x, 2.x and 3.x all answer).

Every name a query writes goes through here and is checked against the metric catalogue
(``gpufleet/catalogue.toml``) and the analyzer's ``incident`` measurement: a renamed field fails
generation instead of leaving a panel empty. The filters are Grafana's regex idiom for a tag
matched against a (possibly multi-valued) dashboard variable.
"""

from __future__ import annotations

from gpufleet import catalogue

# Every query and variable reads the datasource the ``datasource`` variable picks.
DATASOURCE = {"type": "influxdb", "uid": "${datasource}"}

# The analyzer's incident measurement (documented with the catalogue in docs/schema.md).
INCIDENT_TAGS = catalogue.incident().tags
INCIDENT_FIELDS = tuple(x[0] for x in catalogue.incident().fields)


def field(measurement: str, name: str) -> str:
    """A catalogue field, double-quoted for InfluxQL; unknown fields fail generation."""
    if (measurement, name) not in catalogue.by_key():
        raise KeyError(f"{measurement}.{name} is not in the catalogue")
    return f'"{name}"'


def incident_field(name: str) -> str:
    """A field or tag of the ``incident`` measurement, double-quoted; unknown names fail generation."""
    if name not in INCIDENT_FIELDS + INCIDENT_TAGS:
        raise KeyError(f"incident.{name} is not in the incident schema")
    return f'"{name}"'


def metric(measurement: str, name: str) -> catalogue.Metric:
    """The catalogue entry of a field (its unit, kind, tier and description)."""
    return catalogue.by_key()[(measurement, name)]


def tag_matches(tag: str, var: str | None = None) -> str:
    """``tag`` matched against the variable ``var`` (default: the tag's own name)."""
    return f'"{tag}" =~ /^${var or tag}$/'


def show_tag_values(measurement: str, key: str, where: str | None = None) -> str:
    """The query listing a tag's values, for a variable; a tag the catalogue lacks fails generation."""
    if measurement != "incident" and key not in catalogue.tags(measurement):
        raise KeyError(f"{measurement} has no tag {key}")
    q = f'SHOW TAG VALUES FROM "{measurement}" WITH KEY = "{key}"'
    return q + (f" WHERE {where}" if where else "")


# The rows of the chosen clusters and racks; of the chosen hosts among them; of the range's last 2 minutes.
FLEET = f"{tag_matches('cluster')} AND {tag_matches('rack')}"
NODE = f"{tag_matches('cluster')} AND {tag_matches('rack')} AND {tag_matches('host')}"
LAST_2M = "time >= ${__to}ms - 2m AND time <= ${__to}ms"
